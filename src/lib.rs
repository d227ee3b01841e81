//! # tract-ragged
//!
//! Exact variable-width batching for the [tract](https://github.com/sonos/tract) inference
//! engine, on CPU and CUDA.
//!
//! Text lines, audio clips and other sequences come in many widths. Batching them means
//! padding them to the widest, and the padding leaks into the results: convolutions read
//! it at the right border, global pools and attention average over it. A sample's result
//! then depends on the batch it happens to be in. tract-ragged rewrites a model so that
//! it does not: every sample of a batch gets, within float rounding, what it would get
//! alone, at batched speed.
//!
//! ## The contract
//!
//! For a model M with a ragged input and samples s_1..s_N of widths w_1..w_N:
//!
//! 1. **Exact**: the valid region of each sample's outputs equals M run on that sample
//!    alone, within float rounding.
//! 2. **Independent**: no other sample (its content, its width), nor N, nor the padded
//!    width, changes a sample's valid outputs.
//! 3. **Defined padding**: the padded region of every output is zero, and every output
//!    carrying the ragged axis comes with its widths.
//! 4. **Honest refusal**: a model that mixes positions along the ragged axis (a flatten of
//!    W with C, a recurrence over W) is refused when it is prepared, naming the node.
//! 5. **No panics**: bad input is an error, and the runnable stays usable.
//!
//! ## How
//!
//! The [`transform`] follows the ragged axis through the model and, right before every op
//! that could read the padded region, writes there what a sample alone would read past its
//! border ([`ops::Mask`]), then lets tract's dense op run unchanged. Reductions and
//! softmaxes over the axis use the samples' own widths ([`ops`]).
//!
//! ## Example
//!
//! ```no_run
//! use tract_ragged::prelude::*;
//!
//! # fn main() -> TractResult<()> {
//! let model = load_onnx("ch_PP-OCRv4_rec_infer.onnx", Some("N,3,48,W,f32"))?;
//! let runnable = RaggedModel::new(model, RaggedSpec::new("x", 3))?.into_runnable()?;
//! let lines: Vec<Tensor> = vec![
//!     Tensor::zero::<f32>(&[3, 48, 320])?,
//!     Tensor::zero::<f32>(&[3, 48, 96])?,
//! ];
//! // One entry per line: its outputs, batch axis removed, cropped to its width.
//! let outputs = runnable.run_batch(&lines)?;
//! assert_eq!(outputs[1][0].shape(), &[12, 6625]);
//! # Ok(())
//! # }
//! ```

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod backend;
pub mod batch;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod elementwise;
pub mod error;
pub mod evaluate;
pub mod inputs;
pub mod knobs;
pub mod load;
pub mod memory;
pub mod model;
#[cfg(feature = "cli")]
pub mod npz;
#[cfg(feature = "cli")]
pub mod ocr;
pub mod ops;
pub mod options;
pub mod precision;
pub mod profile;
pub mod reduce;
pub mod reference;
pub mod run;
pub mod runnable;
pub mod samples;
pub mod schedule;
pub mod segment;
pub mod spec;
pub mod timeline;
pub mod transform;

pub use load::load_onnx;
pub use model::RaggedModel;
pub use options::{Device, Options, open};
pub use reference::Reference;
pub use runnable::RaggedRunnable;
pub use samples::{Sample, Samples};
pub use spec::RaggedSpec;
pub use transform::{Ragged, RaggedTransform, ragged};

/// References every registration tract-ragged makes for tract to find at run time (the
/// `ragged` transform, the `ragged-cuda` runtime and its backend): a binary that only
/// links the crate (tract's CLI, `scripts/tract-cli.sh`) calls it once, so that the linker
/// keeps them. Registrations are `inventory` entries in their modules' object code, which
/// a linker drops with the module when nothing refers to it.
pub fn link() {
    std::hint::black_box(transform::registered::linked());
    #[cfg(feature = "cuda")]
    std::hint::black_box(cuda::linked());
}

/// Runs `f`, turning a panic (in tract, on a model or input it does not expect) into an
/// error saying what was being done: the caller gets an error, not a dead thread, and the
/// runnable stays usable.
pub(crate) fn no_panic<T>(
    what: impl FnOnce() -> String,
    f: impl FnOnce() -> tract_core::prelude::TractResult<T>,
) -> tract_core::prelude::TractResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(tract_core::internal::anyhow!(
                "{}: tract panicked: {msg}",
                what()
            ))
        }
    }
}

pub mod prelude {
    pub use crate::error::{ErrorKind, kind as error_kind};
    pub use crate::options::{Device, Options};
    pub use crate::precision::Precision;
    pub use crate::samples::{Sample, Samples};
    pub use crate::{RaggedModel, RaggedRunnable, RaggedSpec, load_onnx};
    pub use tract_core::knobs::KnobScope;
    pub use tract_core::prelude::*;
}
