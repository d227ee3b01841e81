//! How a batch reaches its plan, and how the plan's outputs come back as samples.
//!
//! A run is: pack the samples into one padded batch, hand it to the plan, crop each
//! sample's part out of every output. On the CPU the batch is a tensor and the outputs
//! are the plan's own tensors ([`HostTransfer`]). On a GPU the same bytes also cross the
//! bus both ways, and how they cross matters as much as the kernels: through pageable
//! memory, a batch of 256 PP-OCR lines takes longer to come and go than to run. So a
//! runtime may bring its own [`Transfer`]: ragged-cuda packs straight into pinned staging
//! buffers and uploads from there, and brings each output back through them a range of
//! samples at a time, cropping one range while the next crosses the bus
//! ([`crate::cuda::transfer`]).
//!
//! Whatever the transfer, the bytes are the same: a sample's results do not depend on
//! how they travelled.

use std::fmt::Debug;

use tract_core::internal::*;

use crate::batch::{crop_all, pack};
use crate::transform::OutputLayout;

/// Packing a batch into the plan's input, and the plan's outputs into samples.
pub trait Transfer: Debug + Send + Sync {
    /// The plan's ragged input: `samples` stacked along a new axis 0, padded with zeros
    /// to `padded` along `axis` (of the samples).
    fn upload(&self, samples: &[&Tensor], axis: usize, padded: usize) -> TractResult<TValue>;

    /// For each of the `n` samples, its outputs in order: batch axis removed, ragged axes
    /// cut to its widths ([`crate::batch::crop`]).
    fn download(
        &self,
        outputs: &[TValue],
        layouts: &[OutputLayout],
        n: usize,
    ) -> TractResult<Vec<TVec<Tensor>>>;
}

/// Tensors on the host: what tract's runtimes take and give.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostTransfer;

impl Transfer for HostTransfer {
    fn upload(&self, samples: &[&Tensor], axis: usize, padded: usize) -> TractResult<TValue> {
        Ok(pack(samples, axis, padded)?.into_tvalue())
    }

    fn download(
        &self,
        outputs: &[TValue],
        layouts: &[OutputLayout],
        n: usize,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        crop_all(outputs, layouts, n)
    }
}

/// The transfer for batches on `runtime`: its own where it has one, the host's otherwise.
pub fn for_runtime(runtime: &dyn Runtime) -> Arc<dyn Transfer> {
    #[cfg(feature = "cuda")]
    if runtime.name() == "ragged-cuda" {
        return Arc::new(crate::cuda::transfer::PinnedTransfer::default());
    }
    let _ = runtime;
    Arc::new(HostTransfer)
}
