//! Batches in and out of the device through pinned staging buffers.
//!
//! tract-cuda uploads a plan's input from wherever the host tensor lies and brings each
//! output back into a fresh host tensor: from pageable memory the driver copies through
//! its own small bounce buffers, at a third of the bus speed or less (measured on the
//! H200: a 26 MB batch took 3.5 ms to upload). And cropping a lazy output sample by sample
//! costs a device copy and a synchronisation per sample and output.
//!
//! [`PinnedTransfer`] keeps a few page-locked buffers and reuses them: the samples are
//! packed straight into one and uploaded from there into a device tensor that the plan
//! takes as it is (tract-gpu's lazy host tensors cross `DeviceSync` without a copy); each
//! output comes back into one in a single copy, and the samples are cropped from it on
//! the host's cores ([`crate::batch`]).
//!
//! The buffers are allocated without `WRITECOMBINED` (cudarc's default for pinned memory):
//! write-combined memory is uncached, and the crops read it back.

use std::sync::Mutex;

use cudarc::driver::PinnedHostSlice;
use tract_core::internal::*;
use tract_cuda::kernels::{get_cuda_view, get_cuda_view_mut};
use tract_gpu::tensor::{DeviceTensor, LazyHostStorage};

use crate::batch::{crop_output, pack_into, packed_bytes, transpose};
use crate::transfer::Transfer;
use crate::transform::OutputLayout;

/// Staging buffers kept for reuse. More than this, the smallest is freed: pinned memory
/// is memory the OS cannot page out.
const KEPT: usize = 4;

/// Staging buffers grow in steps of this many bytes, so that close sizes share one.
const GRAIN: usize = 16 << 20;

/// Pinned staging buffers for uploads and downloads: [`Transfer`] for ragged-cuda.
#[derive(Default)]
pub struct PinnedTransfer {
    kept: Mutex<Vec<PinnedHostSlice<u8>>>,
}

impl std::fmt::Debug for PinnedTransfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self
            .kept
            .lock()
            .map(|k| k.iter().map(|b| b.len()).collect::<Vec<_>>())
            .unwrap_or_default();
        write!(f, "PinnedTransfer {{ kept: {kept:?} }}")
    }
}

impl PinnedTransfer {
    /// A staging buffer of at least `bytes`: the smallest kept one that is large enough,
    /// or a new one. Given back with [`Self::give`] once the device is done with it.
    fn take(&self, bytes: usize) -> TractResult<PinnedHostSlice<u8>> {
        {
            let mut kept = self
                .kept
                .lock()
                .map_err(|_| anyhow!("staging buffers poisoned"))?;
            let fitting = kept
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() >= bytes)
                .min_by_key(|(_, b)| b.len())
                .map(|(ix, _)| ix);
            if let Some(ix) = fitting {
                return Ok(kept.swap_remove(ix));
            }
        }
        let len = bytes.div_ceil(GRAIN).max(1) * GRAIN;
        tract_cuda::with_cuda_stream(|stream| {
            // SAFETY: the bytes are uninitialised; every use writes before it reads (a
            // pack or a download of as many bytes as it then reads).
            unsafe { stream.context().alloc_pinned_with_flags::<u8>(len, 0) }
                .with_context(|| format!("Allocating {len} bytes of pinned host memory"))
        })
    }

    fn give(&self, buffer: PinnedHostSlice<u8>) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.push(buffer);
            if kept.len() > KEPT {
                kept.sort_by_key(|b| std::cmp::Reverse(b.len()));
                kept.truncate(KEPT);
            }
        }
    }
}

/// The device tensor still behind a lazy host tensor from a plan's outputs, if it is.
fn on_device(t: &Tensor) -> Option<&DeviceTensor> {
    let lazy = t.storage_as::<LazyHostStorage>()?;
    if lazy.is_materialized() {
        return None;
    }
    // Downloaded whole, as bytes in its order: only a tensor laid out as its shape says.
    lazy.device()
        .filter(|d| d.strides() == &*Tensor::natural_strides(d.shape()))
}

impl Transfer for PinnedTransfer {
    fn upload(&self, samples: &[&Tensor], axis: usize, padded: usize) -> TractResult<TValue> {
        let first = samples[0];
        let mut shape: TVec<usize> = first.shape().into();
        shape[axis] = padded;
        shape.insert(0, samples.len());
        let bytes = packed_bytes(samples, axis, padded);
        let mut staging = self.take(bytes)?;
        let device = DeviceTensor::uninitialized_dt(first.datum_type(), &shape)?;
        let copied = (|| -> TractResult<()> {
            let host = &mut staging.as_mut_slice()?[..bytes];
            pack_into(samples, axis, padded, host)?;
            tract_cuda::with_cuda_stream(|stream| {
                stream.memcpy_htod(&*host, &mut get_cuda_view_mut(&device))?;
                // The staging buffer is reused once given back: the copy must be over.
                stream.synchronize()?;
                Ok(())
            })
        })();
        self.give(staging);
        copied.context("Uploading the packed batch")?;
        // The plan's `DeviceSync` takes the device tensor out of the lazy host tensor.
        Ok(LazyHostStorage::new(device)?.into_tensor().into_tvalue())
    }

    fn download(
        &self,
        outputs: &[TValue],
        layouts: &[OutputLayout],
        n: usize,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        let mut per_output = vec![];
        for (ix, layout) in layouts.iter().enumerate() {
            let output = &outputs[ix];
            let device = on_device(output).filter(|_| layout.batch.is_some());
            let Some(device) = device else {
                // Left on the host, or not per sample: the host's way.
                let bytes = if output.datum_type().is_copy() {
                    output.try_as_plain_ram()?.as_bytes()
                } else {
                    &[]
                };
                per_output.push(crop_output(outputs, layout, ix, n, bytes)?);
                continue;
            };
            let bytes = device.len() * device.datum_type().size_of();
            let mut staging = self.take(bytes)?;
            let crops = (|| -> TractResult<Vec<Tensor>> {
                let host = &mut staging.as_mut_slice()?[..bytes];
                tract_cuda::with_cuda_stream(|stream| {
                    stream.memcpy_dtoh(&get_cuda_view(device), &mut *host)?;
                    stream.synchronize()?;
                    Ok(())
                })?;
                crop_output(outputs, layout, ix, n, host)
            })();
            self.give(staging);
            per_output.push(crops.with_context(|| format!("Downloading output {ix}"))?);
        }
        Ok(transpose(per_output, n))
    }
}
