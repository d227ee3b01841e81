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
//! - f16 and bf16 models are not supported yet: ragged-cuda's own kernels compute in f32.

use std::str::FromStr;

use tract_core::internal::*;
use tract_core::knobs::KnobScope;

/// What the plans compute in (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    #[default]
    F32,
    Tf32,
}

impl Precision {
    /// The knobs its plans are prepared under; none for fp32.
    pub fn knobs(self) -> TractResult<Option<KnobScope>> {
        match self {
            Precision::F32 => Ok(None),
            Precision::Tf32 => Ok(Some(KnobScope::new([("TRACT_RAGGED_TF32", "on")])?)),
        }
    }
}

impl FromStr for Precision {
    type Err = TractError;

    fn from_str(s: &str) -> TractResult<Precision> {
        match s {
            "f32" | "fp32" => Ok(Precision::F32),
            "tf32" => Ok(Precision::Tf32),
            "f16" | "bf16" => bail!(
                "precision {s} is not supported yet: ragged-cuda's kernels compute in f32 (tf32 \
                 runs its convolutions and 1x1 GEMMs on tensor cores)"
            ),
            other => bail!("unknown precision {other}: f32 or tf32"),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Precision;

    #[test]
    fn precisions_parse_and_set_their_knobs() {
        assert_eq!("f32".parse::<Precision>().unwrap(), Precision::F32);
        assert_eq!("tf32".parse::<Precision>().unwrap(), Precision::Tf32);
        let err = format!("{:#}", "bf16".parse::<Precision>().unwrap_err());
        assert!(err.contains("not supported yet"), "{err}");
        assert!(Precision::F32.knobs().unwrap().is_none());
        // The knob is ragged-cuda's: a build without it cannot set it.
        #[cfg(feature = "cuda")]
        {
            let tf32 = Precision::Tf32.knobs().unwrap().expect("a knob scope");
            assert!(tf32.enter(|| crate::cuda::knobs::TRACT_RAGGED_TF32.get()));
        }
        #[cfg(not(feature = "cuda"))]
        assert!(Precision::Tf32.knobs().is_err());
    }
}
