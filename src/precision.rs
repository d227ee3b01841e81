//! Precision: what the plans compute in. fp32 is the default and the contract (each sample
//! exactly what it gets alone); reduced precision is an opt-in that trades exactness for
//! speed, on the runtimes that have tensor cores.
//!
//! - `F32`: fp32 throughout, tensor cores off (also for tract-cuda's cuDNN convolutions,
//!   whose default math type would be TF32): exact.
//! - `Tf32`: ragged-cuda runs f32 convolutions and 1x1 GEMMs on TF32 tensor cores
//!   (`TRACT_RAGGED_TF32`): inputs rounded to 10 bits of mantissa, a relative error near
//!   1e-3. Batched still equals alone *at that precision* (the same kernels for both), but
//!   no longer fp32 alone: `tract-ragged bench --precision tf32` reports the text changes
//!   and the largest probability difference against fp32 one by one.
//! - `F16`: the model itself in half precision (`half`): every f32 tensor and weight
//!   stored in f16, which halves the bytes each memory-bound op moves and puts the 1x1
//!   convolutions on f16 tensor cores; our kernels read and write f16 and compute in f32
//!   (sums accumulated in f32, each value rounded to f16 once, each link of a fused chain
//!   rounded as tract-cuda's f16 op rounds it). The samples and the outputs stay f32 (a
//!   cast at each end of the model), and recurrences stay f32 (cuDNN's f32 RNN, casts
//!   around them). A batch gives each sample what it gets alone within f16's rounding
//!   where every kernel is the same for any batch (ours are); tract-cuda's f16 GEMMs
//!   (attention, heads) pick their kernels by shape, and on a deep model one rounding that
//!   falls the other way carries through the layers: PP-OCRv4 rec's batch is as far from
//!   each line alone as f16 alone is from f32 (2.7e-2 norm-wise on the H200), its text the
//!   same. tract's CPU runtime runs it too (tract's f16 kernels; on x86 without native f16
//!   arithmetic, slower than f32).
//! - bf16: tract 0.23.9 has no bf16 tensor type (`DatumType`), so a model cannot hold
//!   bf16 values between ops; refused, naming f16 and tf32 as what there is.

use std::str::FromStr;

use tract_core::floats::FloatPrecisionTranslator;
use tract_core::internal::translator::Translate;
use tract_core::internal::*;
use tract_core::knobs::KnobScope;
use tract_core::ops::cast::cast;
use tract_core::ops::source::TypedSource;

/// What the plans compute in (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// fp32 throughout, tensor cores off: exact.
    #[default]
    F32,
    /// f32 convolutions and 1x1 GEMMs on TF32 tensor cores (ragged-cuda only): not exact.
    Tf32,
    /// The model in half precision, samples and outputs in f32: not exact.
    F16,
}

impl Precision {
    /// The knobs its plans are prepared under; none for fp32 and f16 (f16 is in the model).
    pub fn knobs(self) -> TractResult<Option<KnobScope>> {
        match self {
            Precision::F32 | Precision::F16 => Ok(None),
            Precision::Tf32 => Ok(Some(KnobScope::new([("TRACT_RAGGED_TF32", "on")])?)),
        }
    }

    /// Whether it gives each sample exactly what fp32 gives it alone.
    pub fn is_exact(self) -> bool {
        self == Precision::F32
    }
}

impl FromStr for Precision {
    type Err = TractError;

    fn from_str(s: &str) -> TractResult<Precision> {
        match s {
            "f32" | "fp32" => Ok(Precision::F32),
            "tf32" => Ok(Precision::Tf32),
            "f16" | "fp16" | "half" => Ok(Precision::F16),
            "bf16" => bail!(
                "precision bf16 is not supported: tract 0.23.9 has no bf16 tensor type; f16 \
                 (half precision throughout) and tf32 (f32 tensors, tensor-core products) are"
            ),
            other => bail!("unknown precision {other}: f32, tf32 or f16"),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::F16 => "f16",
        })
    }
}

/// `model` in half precision: its f32 values (weights, activations, the operating type of
/// its products) in f16, by tract's `FloatPrecisionTranslator`, but for its interface: an
/// f32 input is still f32, cast to f16 as the model's first step, and an output that was
/// f32 is cast back as its last, under its name. Recurrences ([`crate::ops::Recurrence`])
/// stay f32, with casts around them.
pub(crate) fn half(model: &TypedModel) -> TractResult<TypedModel> {
    let mut halved = Half(FloatPrecisionTranslator::with_filter(
        f32::datum_type(),
        f16::datum_type(),
        |node| !node.op_is::<crate::ops::Recurrence>(),
    ))
    .translate_model(model)
    .context("Translating the model to f16")?;
    // The translator takes the outlet `Half` gives for a source as the input: the cast's.
    for (ix, outlet) in model.input_outlets()?.iter().enumerate() {
        if model.outlet_fact(*outlet)?.datum_type == f32::datum_type() {
            halved.inputs[ix] = halved.node(halved.inputs[ix].node).inputs[0];
        }
    }
    for (ix, outlet) in model.output_outlets()?.to_vec().into_iter().enumerate() {
        let was = model.outlet_fact(outlet)?.datum_type;
        let now = halved.outputs[ix];
        if was != f32::datum_type() || halved.outlet_fact(now)?.datum_type == was {
            continue;
        }
        let name = halved.node(now.node).name.clone();
        halved.rename_node(now.node, &format!("{name}.f16"))?;
        let back = halved.wire_node(&name, cast(was), &[now])?[0];
        if let Some(label) = halved.outlet_label(now).map(|l| l.to_string()) {
            halved.set_outlet_label(back, label)?;
        }
        halved.outputs[ix] = back;
    }
    halved.into_decluttered()
}

/// tract's translator, but for the f32 inputs, which stay f32 and are cast right after.
struct Half(FloatPrecisionTranslator);

impl std::fmt::Debug for Half {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} (f32 inputs kept)", self.0)
    }
}

impl Translate<TypedFact, Box<dyn TypedOp>, TypedFact, Box<dyn TypedOp>> for Half {
    fn translate_node(
        &self,
        source: &TypedModel,
        node: &TypedNode,
        target: &mut TypedModel,
        mapping: &HashMap<OutletId, OutletId>,
    ) -> TractResult<TVec<OutletId>> {
        match node.op_as::<TypedSource>() {
            Some(s) if s.fact.datum_type == f32::datum_type() => {
                let input = target.add_source(&node.name, s.fact.clone())?;
                target.wire_node(
                    format!("{}.f16", node.name),
                    cast(f16::datum_type()),
                    &[input],
                )
            }
            _ => self.0.translate_node(source, node, target, mapping),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precisions_parse_and_set_their_knobs() {
        assert_eq!("f32".parse::<Precision>().unwrap(), Precision::F32);
        assert_eq!("tf32".parse::<Precision>().unwrap(), Precision::Tf32);
        assert_eq!("f16".parse::<Precision>().unwrap(), Precision::F16);
        let err = format!("{:#}", "bf16".parse::<Precision>().unwrap_err());
        assert!(err.contains("no bf16 tensor type"), "{err}");
        assert!(Precision::F32.knobs().unwrap().is_none());
        assert!(Precision::F16.knobs().unwrap().is_none());
        // The knob is ragged-cuda's: a build without it cannot set it.
        #[cfg(feature = "cuda")]
        {
            let tf32 = Precision::Tf32.knobs().unwrap().expect("a knob scope");
            assert!(tf32.enter(|| crate::cuda::knobs::TRACT_RAGGED_TF32.get()));
        }
        #[cfg(not(feature = "cuda"))]
        assert!(Precision::Tf32.knobs().is_err());
    }

    #[test]
    fn a_half_model_keeps_its_f32_interface_and_computes_in_f16() -> TractResult<()> {
        let mut model = TypedModel::default();
        let x = model.add_source("x", f32::fact([2, 3]))?;
        let k = model.add_const("k", tensor2(&[[0.1f32, 0.2, 0.3], [1.0, 2.0, 3.0]]))?;
        let y = model.wire_node("y", tract_core::ops::math::mul(), &[x, k])?[0];
        model.select_output_outlets(&[y])?;
        let half = half(&model)?;
        assert_eq!(half.input_fact(0)?.datum_type, f32::datum_type());
        assert_eq!(half.output_fact(0)?.datum_type, f32::datum_type());
        assert_eq!(half.node(half.outputs[0].node).name, "y");
        assert!(
            half.nodes()
                .iter()
                .any(|n| n.outputs[0].fact.datum_type == f16::datum_type()),
            "nothing in f16"
        );
        let input = tensor2(&[[1.0f32, 1.0, 1.0], [1.0, 1.0, 1.0]]);
        let run = |m: TypedModel| -> TractResult<Tensor> {
            let out = m.into_runnable()?.run(tvec!(input.clone().into_tvalue()))?;
            Ok(out[0].clone().into_tensor())
        };
        let (full, halved) = (run(model)?, run(half)?);
        // 0.1 is not 0.1 in f16: the product is f16's 0.1 (0.0999755859375), not f32's.
        let h = halved.to_plain_array_view::<f32>()?;
        let f = full.to_plain_array_view::<f32>()?;
        assert_eq!(h[[0, 0]], f16::from_f32(0.1).to_f32());
        assert_ne!(h[[0, 0]], f[[0, 0]]);
        assert_eq!(h[[1, 2]], 3.0);
        Ok(())
    }
}
