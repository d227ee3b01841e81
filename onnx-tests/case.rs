//! One ONNX backend node test case: its model, its inputs and expected outputs, and the
//! two ways it is run here.
//!
//! - **plain**: the model through the ragged transform, every width full (so the batch is
//!   the case's own input), compared to the case's expected outputs with tract's own
//!   tolerance. A case whose input has no spatial axis, that the transform refuses, or
//!   that reduces over its batch (transformed, each sample gets its own reduction),
//!   runs untransformed.
//! - **ragged**: the case's input cut into samples of different widths (crops of its last
//!   axis, down to a width of 1 where the model allows it), run as one ragged batch and one
//!   by one on the same runtime, compared. A case mixing positions along the last axis must
//!   be refused instead.

use std::path::{Path, PathBuf};

use prost::Message;
use tract_core::internal::*;
use tract_onnx::data_resolver::FopenDataResolver;
use tract_onnx::pb;
use tract_ragged::load::{from_proto, ragged_model};
use tract_ragged::prelude::*;

pub struct Case {
    proto: pb::ModelProto,
    /// The graph inputs (not initializers), in order, with the case's values.
    inputs: Vec<(String, Tensor)>,
    expected: Vec<Tensor>,
}

/// What running one mode of a case gave. The texts are printed (Debug) on failures.
#[derive(Debug)]
#[allow(dead_code)]
pub enum Outcome {
    Passed,
    /// The transform refused the model, with its error.
    Refused(String),
    /// A wrong value: the worst difference.
    Wrong(String),
    /// An error.
    Error(String),
}

fn read_tensor(path: &Path) -> TractResult<(String, Tensor)> {
    let bytes = std::fs::read(path).with_context(|| format!("Reading {}", path.display()))?;
    let proto = pb::TensorProto::decode(&*bytes)?;
    let tensor = tract_onnx::tensor::load_tensor(&FopenDataResolver, &proto, None)?;
    Ok((proto.name, tensor))
}

fn data_files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut files: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let ix = name
                .strip_prefix(prefix)?
                .strip_suffix(".pb")?
                .parse()
                .ok()?;
            Some((ix, e.path()))
        })
        .collect();
    files.sort();
    files.into_iter().map(|(_, p)| p).collect()
}

/// The fact of a ragged input with a symbolic batch and width: `N,3,5,W,f32`.
fn symbolic_fact(t: &Tensor) -> String {
    let rank = t.rank();
    let mut dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    dims[0] = "N".into();
    dims[rank - 1] = "W".into();
    format!(
        "{},{}",
        dims.join(","),
        format!("{:?}", t.datum_type()).to_lowercase()
    )
}

fn concrete_fact(t: &Tensor) -> String {
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!(
        "{},{}",
        dims.join(","),
        format!("{:?}", t.datum_type()).to_lowercase()
    )
}

fn compare(found: &Tensor, expected: &Tensor) -> Option<String> {
    let found = found.cast_to_dt(expected.datum_type()).ok()?.into_owned();
    match found.close_enough(expected, Approximation::Approximate) {
        Ok(()) => None,
        Err(e) => Some(format!("{e}").chars().take(300).collect()),
    }
}

impl Case {
    pub fn load(dir: &Path) -> TractResult<Case> {
        let mut proto = tract_onnx::onnx().proto_model_for_path(dir.join("model.onnx"))?;
        let data = dir.join("test_data_set_0");
        let graph = proto.graph.as_mut().context("no graph")?;
        let initializers: Vec<String> = graph.initializer.iter().map(|t| t.name.clone()).collect();
        let names: Vec<String> = graph
            .input
            .iter()
            .map(|i| i.name.clone())
            .filter(|n| !initializers.contains(n))
            .collect();
        let values = data_files(&data, "input_")
            .iter()
            .map(|p| read_tensor(p))
            .collect::<TractResult<Vec<_>>>()?;
        ensure!(
            values.len() == names.len(),
            "{} inputs for {} graph inputs",
            values.len(),
            names.len()
        );
        let inputs = names
            .into_iter()
            .zip(values.into_iter().map(|(_, t)| t))
            .collect();
        let expected = data_files(&data, "output_")
            .iter()
            .map(|p| read_tensor(p).map(|t| t.1))
            .collect::<TractResult<_>>()?;
        Ok(Case {
            proto,
            inputs,
            expected,
        })
    }

    /// The model with every input but the first made a constant of the case's value:
    /// only the first input is batched.
    fn single_input_proto(&self) -> TractResult<pb::ModelProto> {
        let mut proto = self.proto.clone();
        let graph = proto.graph.as_mut().context("no graph")?;
        for (name, value) in &self.inputs[1..] {
            graph.input.retain(|i| i.name != *name);
            let mut t = tensor_proto(value)?;
            t.name = name.clone();
            graph.initializer.push(t);
        }
        Ok(proto)
    }

    /// Whether the ragged mode applies: a float first input with a batch, channels and
    /// at least one spatial axis.
    pub fn raggable(&self) -> bool {
        self.inputs
            .first()
            .is_some_and(|(_, t)| t.rank() >= 3 && t.datum_type().is_float())
    }

    fn ragged_model(&self) -> TractResult<RaggedModel> {
        let x = &self.inputs[0].1;
        let onnx = from_proto(self.single_input_proto()?, None, Some(&symbolic_fact(x)))?;
        ragged_model(onnx, RaggedSpec::new(0, x.rank() - 1))
    }

    pub fn plain(&self, runtime: &'static dyn Runtime) -> Outcome {
        guarded(|| self.try_plain(runtime))
    }

    /// The plain mode without the ragged transform: what tract itself does on the case.
    pub fn untransformed(&self, runtime: &'static dyn Runtime) -> Outcome {
        guarded(|| self.run_plain(runtime, false))
    }

    fn try_plain(&self, runtime: &'static dyn Runtime) -> TractResult<Outcome> {
        self.run_plain(runtime, true)
    }

    fn run_plain(&self, runtime: &'static dyn Runtime, transform: bool) -> TractResult<Outcome> {
        let x = self.inputs.first().context("no input")?.1.clone();
        // A model reducing over its batch (and other axes) computes, transformed, each
        // sample's own reduction: the case's expected value folds its batch, so such a
        // case runs untransformed here (its ragged mode checks the per-sample value).
        let folds_its_batch = |m: &TractResult<RaggedModel>| {
            m.as_ref()
                .is_ok_and(|m| !m.ragged.batch_reductions.is_empty())
        };
        let model = (transform && self.raggable())
            .then(|| self.ragged_model())
            .filter(|m| !folds_its_batch(m));
        let outputs: TVec<Tensor> = match model {
            Some(Ok(model)) => {
                let runnable = model.into_runnable_with(runtime)?;
                let widths = vec![x.shape()[x.rank() - 1] as i64; x.shape()[0]];
                let outputs = runnable.run_packed(x, &[&widths])?;
                outputs
                    .into_iter()
                    .take(self.expected.len())
                    .map(|t| t.into_tensor())
                    .collect()
            }
            _ => {
                let onnx = from_proto(self.single_input_proto()?, None, Some(&concrete_fact(&x)))?;
                let plan = runtime.prepare(onnx.into_typed()?)?;
                plan.run(tvec!(x.into_tvalue()))?
                    .into_iter()
                    .map(|t| t.into_tensor())
                    .collect()
            }
        };
        ensure!(
            outputs.len() >= self.expected.len(),
            "{} outputs, {} expected",
            outputs.len(),
            self.expected.len()
        );
        for (ix, (found, expected)) in outputs.iter().zip(&self.expected).enumerate() {
            if let Some(diff) = compare(found, expected) {
                return Ok(Outcome::Wrong(format!("output {ix}: {diff}")));
            }
        }
        Ok(Outcome::Passed)
    }

    pub fn ragged(&self, runtime: &'static dyn Runtime) -> Outcome {
        guarded(|| self.try_ragged(runtime))
    }

    fn try_ragged(&self, runtime: &'static dyn Runtime) -> TractResult<Outcome> {
        let model = match self.ragged_model() {
            Ok(model) => model,
            Err(e) => return Ok(Outcome::Refused(format!("{e:#}"))),
        };
        let runnable = model.into_runnable_with(runtime)?;
        let x = &self.inputs[0].1;
        let axis = x.rank() - 1;
        let full = x.shape()[axis];
        // The first sample of the case's batch, cut to a few widths: the full one, about
        // half, and the narrowest the model takes (1 where legal).
        let first = x.slice(0, 0, 1)?.into_shape(&x.shape()[1..])?;
        let narrowest = (1..=full)
            .find(|w| runnable.width_table(&[*w as i64]).is_ok())
            .context("no width runs")?;
        let widths = [full, full.div_ceil(2).max(narrowest), narrowest];
        let samples: Vec<Tensor> = widths
            .iter()
            .map(|w| first.slice(axis - 1, 0, *w))
            .collect::<TractResult<_>>()?;
        let batched = runnable.run_batch(&samples)?;
        let alone = runnable.run_one_by_one(&samples)?;
        for (k, (b, a)) in batched.iter().zip(&alone).enumerate() {
            for (j, (found, expected)) in b.iter().zip(a).enumerate() {
                if found.shape() != expected.shape() {
                    return Ok(Outcome::Wrong(format!(
                        "sample {k} output {j}: shape {:?} vs {:?}",
                        found.shape(),
                        expected.shape()
                    )));
                }
                if let Some(diff) = compare(found, expected) {
                    return Ok(Outcome::Wrong(format!(
                        "sample {k} (width {}) output {j}: {diff}",
                        widths[k]
                    )));
                }
            }
        }
        Ok(Outcome::Passed)
    }
}

/// The outcome of `f`, an error or a panic (tract's, on a case it does not expect)
/// being an `Outcome::Error`.
fn guarded(f: impl FnOnce() -> TractResult<Outcome>) -> Outcome {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => Outcome::Error(format!("{e:#}").chars().take(300).collect()),
        Err(_) => Outcome::Error("panicked".to_string()),
    }
}

/// A tensor as an ONNX TensorProto (raw data), to turn an input into an initializer.
fn tensor_proto(t: &Tensor) -> TractResult<pb::TensorProto> {
    use pb::tensor_proto::DataType;
    let dt = match t.datum_type() {
        DatumType::F32 => DataType::Float,
        DatumType::F64 => DataType::Double,
        DatumType::F16 => DataType::Float16,
        DatumType::I64 => DataType::Int64,
        DatumType::I32 => DataType::Int32,
        DatumType::I8 => DataType::Int8,
        DatumType::U8 => DataType::Uint8,
        DatumType::Bool => DataType::Bool,
        dt => bail!("no ONNX tensor for {dt:?}"),
    };
    Ok(pb::TensorProto {
        dims: t.shape().iter().map(|d| *d as i64).collect(),
        data_type: dt as i32,
        raw_data: t.as_bytes().to_vec(),
        ..Default::default()
    })
}
