//! Opening a model: everything that decides how a model is prepared and run, in one
//! value, and the one path from an ONNX file to a runnable.
//!
//! The command line, the Python package and the server open models alike: the file, its
//! ragged input ([`RaggedSpec`]), the facts of its inputs, the inputs given once and
//! folded into the model before it is typed, where it runs ([`Device`]), what it
//! computes in ([`Precision`]), whether its outputs are reduced to their top k, and what
//! the scheduler may use (memory, lanes, batch size) and tract's knobs. [`Options`] holds
//! them; [`open`] reads, types, transforms and prepares the model as they say, and
//! [`RaggedModel::prepare`] does the last part for a model built in code.
//!
//! The scheduler's limits are knobs of the runnable ([`crate::knobs`]): a runnable keeps
//! its own, whatever the process's environment says, and two runnables of one process may
//! differ.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use tract_core::internal::*;
use tract_core::knobs::KnobScope;
use tract_onnx::prelude::InferenceModel;
use tract_onnx::tract_hir::infer::Factoid;

use crate::precision::Precision;
use crate::{RaggedModel, RaggedRunnable, RaggedSpec};

/// Where a model's plans run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host's cores, through tract's default runtime.
    #[default]
    Cpu,
    /// An NVIDIA GPU, through the `ragged-cuda` runtime (the `cuda` feature).
    Cuda,
}

impl Device {
    /// The tract runtime of that name, or why this build has none.
    pub fn runtime(self) -> TractResult<&'static dyn Runtime> {
        let name = match self {
            Device::Cpu => "cpu",
            Device::Cuda => "ragged-cuda",
        };
        runtime_for_name(name)?.with_context(|| {
            format!(
                "runtime {name} is not available in this build (built without the cuda feature?)"
            )
        })
    }
}

impl FromStr for Device {
    type Err = TractError;

    fn from_str(s: &str) -> TractResult<Device> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => bail!("unknown runtime {other:?} (cpu or cuda)"),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        })
    }
}

/// How a model is opened and run (module doc). Built with its methods from
/// `Options::default()`: fp32 on the CPU, the outputs whole, the scheduler's limits from
/// the backend.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Options {
    /// Facts of the model's inputs in tract's syntax: `N,3,48,W,f32` for the first input,
    /// `NAME=FACT` for another by name.
    pub input_facts: Vec<String>,
    /// Inputs given once for every sample, folded into the model before it is typed, so
    /// that what the model decides from them (the branch of an `If` on a sample rate) is
    /// decided once.
    pub folded: Vec<(String, Tensor)>,
    /// Where the plans run.
    pub device: Device,
    /// What the plans compute in.
    pub precision: Precision,
    /// Every output reduced to its k largest values and their positions along its last
    /// axis ([`RaggedModel::with_top_k`]).
    pub top_k: Option<usize>,
    /// The bytes the scheduler fits a run's batches into (default: 4/5 of the free memory
    /// of the device or the host).
    pub memory: Option<u64>,
    /// The batches a run runs at once, each in its lane.
    pub lanes: Option<usize>,
    /// The most samples in one batch.
    pub max_batch: Option<usize>,
    /// tract's knobs and ours, by name, for this runnable's plans and runs.
    pub knobs: Vec<(String, String)>,
}

impl Options {
    /// Sets an input's fact: `N,3,48,W,f32` for the first input, `NAME=FACT` for another.
    pub fn input_fact(mut self, fact: impl Into<String>) -> Options {
        self.input_facts.push(fact.into());
        self
    }

    /// Folds input `name` to `value` before the model is typed.
    pub fn fold(mut self, name: impl Into<String>, value: Tensor) -> Options {
        self.folded.push((name.into(), value));
        self
    }

    /// Runs the plans on `device`.
    pub fn device(mut self, device: Device) -> Options {
        self.device = device;
        self
    }

    /// Computes in `precision`.
    pub fn precision(mut self, precision: Precision) -> Options {
        self.precision = precision;
        self
    }

    /// Reduces every output to its top `k` along its last axis.
    pub fn top_k(mut self, k: usize) -> Options {
        self.top_k = Some(k);
        self
    }

    /// Fits a run's batches into `bytes`.
    pub fn memory(mut self, bytes: u64) -> Options {
        self.memory = Some(bytes);
        self
    }

    /// Runs `lanes` batches at once.
    pub fn lanes(mut self, lanes: usize) -> Options {
        self.lanes = Some(lanes);
        self
    }

    /// Puts at most `n` samples in a batch.
    pub fn max_batch(mut self, n: usize) -> Options {
        self.max_batch = Some(n);
        self
    }

    /// Sets knob `name` to `value` for this runnable ([`crate::knobs::table`] lists ours).
    pub fn knob(mut self, name: impl Into<String>, value: impl Into<String>) -> Options {
        self.knobs.push((name.into(), value.into()));
        self
    }

    /// Every knob the options set: the caller's, then those the precision and the
    /// scheduler's limits stand for, each checked by tract (a name no knob has, a value
    /// that does not parse).
    fn knob_scope(&self) -> TractResult<Option<KnobScope>> {
        let mut values: Vec<(&str, String)> = self
            .knobs
            .iter()
            .map(|(n, v)| (n.as_str(), v.clone()))
            .collect();
        if self.precision == Precision::Tf32 {
            values.push(("TRACT_RAGGED_TF32", "on".into()));
        }
        for (name, value) in [
            ("TRACT_RAGGED_LANES", self.lanes.map(|n| n as u64)),
            ("TRACT_RAGGED_MAX_BATCH", self.max_batch.map(|n| n as u64)),
            ("TRACT_RAGGED_MEMORY", self.memory),
        ] {
            if let Some(value) = value {
                ensure!(value >= 1, "{name}: 0 is not a limit");
                values.push((name, value.to_string()));
            }
        }
        if values.is_empty() {
            return Ok(None);
        }
        Ok(Some(KnobScope::new(
            values.iter().map(|(n, v)| (*n, v.as_str())),
        )?))
    }

    /// Checks what cannot be combined, before anything is read.
    fn check(&self) -> TractResult<()> {
        ensure!(
            self.precision != Precision::Tf32 || self.device == Device::Cuda,
            "precision tf32 runs on tensor cores: on cuda only (the CPU computes in f32)"
        );
        ensure!(
            self.top_k != Some(0),
            "top-k 0 keeps nothing: k is at least 1"
        );
        Ok(())
    }
}

/// Reads the ONNX model at `path` with the facts and folded inputs of `options`, and
/// runs the ragged transform on it: typed once with a symbolic batch and width where
/// tract can, per shape otherwise ([`crate::load::ragged_model`]).
pub(crate) fn load(
    path: impl AsRef<Path>,
    spec: RaggedSpec,
    options: &Options,
) -> TractResult<RaggedModel> {
    let path = path.as_ref();
    options.check()?;
    let onnx = read(path, options)?;
    check_given_facts(&onnx.model, &spec, &options.input_facts)?;
    crate::load::ragged_model(onnx, spec).with_context(|| format!("Preparing {}", path.display()))
}

/// Refuses an input fact given for the ragged input (`facts` as [`Options::input_facts`],
/// `model` as [`read`] returns it) that cannot describe ragged batches, naming the mistake,
/// where tract would stop deep inside the graph (a batch axis fixed at 1 types every op
/// for one sample; a ragged axis the fact fixes while another is the symbol leaves that
/// symbol undetermined at run time). `load` calls it.
pub fn check_given_facts(
    model: &InferenceModel,
    spec: &RaggedSpec,
    facts: &[String],
) -> TractResult<()> {
    let ix = spec.input.resolve(model)?;
    let name = &model.node(model.input_outlets()?[ix].node).name;
    let given = facts.iter().find(|f| match f.split_once('=') {
        Some((input, _)) => input == name,
        None => ix == 0,
    });
    let (Some(given), Some(shape)) = (given, model.input_fact(ix)?.shape.concretize()) else {
        return Ok(());
    };
    let given = given
        .split_once('=')
        .map_or(given.as_str(), |(_, fact)| fact);
    if let Some(TDim::Val(n)) = shape.first() {
        let mut fixed: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        fixed[0] = "N".into();
        bail!(
            "the input fact {given:?} fixes the batch axis (axis 0) of input {name:?} at {n}: \
             a ragged batch stacks samples along it, so it must be a symbol ({},...)",
            fixed.join(",")
        );
    }
    let symbolic = |d: &TDim| !d.symbols().is_empty();
    for &axis in &spec.axes {
        if let Some(TDim::Val(v)) = shape.get(axis)
            && let Some(other) =
                (1..shape.len()).find(|a| !spec.axes.contains(a) && symbolic(&shape[*a]))
        {
            bail!(
                "ragged axis {axis} of input {name:?} is fixed at {v} by the input fact \
                 {given:?}, while axis {other} is a symbol ({}): the ragged axis is the one \
                 whose size varies from sample to sample (--ragged {name}:{other}?)",
                shape[other]
            );
        }
    }
    Ok(())
}

/// The ONNX model at `path`, with the facts and folded inputs of `options`.
pub fn read(path: impl AsRef<Path>, options: &Options) -> TractResult<crate::load::OnnxModel> {
    let (named, first): (Vec<&String>, Vec<&String>) =
        options.input_facts.iter().partition(|f| f.contains('='));
    ensure!(
        first.len() <= 1,
        "{} input facts without a NAME=: one is the first input's, the others name their \
         input (NAME=FACT)",
        first.len()
    );
    let mut onnx = crate::load::read_onnx(path, first.first().map(|f| f.as_str()))?;
    let named: Vec<(&str, &str)> = named.iter().filter_map(|f| f.split_once('=')).collect();
    crate::load::set_input_facts(&mut onnx.model, &named)?;
    for (name, value) in &options.folded {
        crate::load::fold_input(&mut onnx.model, name, value.clone())
            .with_context(|| format!("Folding the shared input {name:?}"))?;
    }
    Ok(onnx)
}

/// Opens the ONNX model at `path` as `options` say: read, typed, transformed along
/// `spec`'s ragged axis and prepared on the device.
///
/// ```no_run
/// use tract_ragged::prelude::*;
///
/// # fn main() -> TractResult<()> {
/// let options = Options::default().input_fact("N,3,48,W,f32").memory(2 << 30);
/// let runnable = tract_ragged::open("rec.onnx", "x:3".parse()?, &options)?;
/// # Ok(())
/// # }
/// ```
pub fn open(
    path: impl AsRef<Path>,
    spec: RaggedSpec,
    options: &Options,
) -> TractResult<RaggedRunnable> {
    load(path, spec, options)?.prepare(options)
}

impl RaggedModel {
    /// Prepares the model as `options` say: at their precision, its outputs reduced to
    /// their top k, on their device, with their knobs and the scheduler's limits (the
    /// facts and folded inputs are `load`'s).
    pub fn prepare(self, options: &Options) -> TractResult<RaggedRunnable> {
        options.check()?;
        let runtime = options.device.runtime()?;
        let model = self
            .at_precision(options.precision)
            .with_context(|| format!("precision {}", options.precision))?;
        let model = match options.top_k {
            Some(k) => model.with_top_k(k).with_context(|| format!("top-k {k}"))?,
            None => model,
        };
        let runnable = model.into_runnable_with(runtime)?;
        Ok(match options.knob_scope()? {
            Some(scope) => runnable.with_knobs(scope),
            None => runnable,
        })
    }
}
