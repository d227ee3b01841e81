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
//! border (a mask), then lets tract's dense op run unchanged. Reductions and softmaxes
//! over the axis use the samples' own widths. `docs/transform.md` says it op by op.
//!
//! ## Example
//!
//! ```no_run
//! use tract_ragged::prelude::*;
//!
//! # fn main() -> TractResult<()> {
//! let options = Options::default().input_fact("N,3,48,W,f32");
//! let runnable = tract_ragged::open("ch_PP-OCRv4_rec_infer.onnx", "x:3".parse()?, &options)?;
//! let lines: Vec<Tensor> = vec![
//!     Tensor::zero::<f32>(&[3, 48, 320])?,
//!     Tensor::zero::<f32>(&[3, 48, 96])?,
//! ];
//! // One entry per line: its outputs, batch axis removed, cropped to its width.
//! let outputs = runnable.run(&lines)?;
//! assert_eq!(outputs[1][0].shape(), &[12, 6625]);
//! # Ok(())
//! # }
//! ```
//!
//! ## The API
//!
//! - [`open`] a model as [`Options`] say (or [`RaggedModel::new`] then
//!   [`RaggedModel::prepare`] for a model built in code);
//! - run [`Samples`] through the runnable's verbs ([`run`]): `run`, `run_each`,
//!   `run_batch`, `run_one_by_one`, `run_packed`;
//! - read what went wrong by its kind ([`error`]); tune with knobs ([`knobs`]).
//!
//! Modules hidden from these docs are public for the CLI and the tests only.

#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

// The API: what the docs show and the CHANGELOG tracks.
pub mod backend;
pub mod error;
pub mod host_view;
pub mod inputs;
pub mod knobs;
pub mod load;
pub mod model;
pub mod options;
pub mod precision;
pub mod reference;
pub mod run;
pub mod runnable;
pub mod samples;
pub mod schedule;
#[cfg(feature = "serve")]
pub mod serve;
pub mod spec;
pub mod transform;

// Internal: public for the CLI and the tests, not part of the API (hidden from the docs,
// no promise between versions).
#[doc(hidden)]
pub mod batch;
#[doc(hidden)]
pub mod counters;
#[cfg(feature = "cuda")]
#[doc(hidden)]
pub mod cuda;
#[doc(hidden)]
pub mod elementwise;
pub(crate) mod evaluate;
pub(crate) mod memory;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod npz;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod ocr;
#[doc(hidden)]
pub mod ops;
#[doc(hidden)]
pub mod profile;
#[doc(hidden)]
pub mod segment;
#[doc(hidden)]
pub mod timeline;
pub(crate) mod top_k_outputs;

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

/// What a user of tract-ragged imports: the entry points, their options and samples, the
/// error kinds, and tract's own prelude.
pub mod prelude {
    pub use crate::error::{ErrorKind, kind as error_kind};
    pub use crate::options::{Device, Options};
    pub use crate::precision::Precision;
    pub use crate::samples::{Sample, Samples};
    pub use crate::{RaggedModel, RaggedRunnable, RaggedSpec, load_onnx};
    pub use tract_core::knobs::KnobScope;
    pub use tract_core::prelude::*;
}
