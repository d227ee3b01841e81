//! Batches in and out of the device through pinned staging buffers, a part at a time.
//!
//! tract-cuda uploads a plan's input from wherever the host tensor lies and brings each
//! output back into a fresh host tensor: from pageable memory the driver copies through
//! its own small bounce buffers, at a fraction of the bus speed (measured on the H200: a
//! 26 MB batch took 3.5 ms to upload). And cropping a lazy output sample by sample costs
//! a device copy and a synchronisation per sample and output.
//!
//! [`PinnedTransfer`] moves batches through page-locked staging buffers of [`CHUNK`]
//! bytes, two at a time: the samples are packed into one while the other is on its way to
//! the device tensor that the plan takes as it is (tract-gpu's lazy host tensors cross
//! `DeviceSync` without a copy); each output comes back a range of samples at a time, the
//! samples of one part cropped on the host's cores ([`crate::batch`]) while the next part
//! crosses the bus. Pinned memory stays bounded whatever the batch (the scheduler makes
//! batches of hundreds of lines: 1.3 GB of probabilities for 288 lines of PP-OCRv4 rec).
//!
//! The buffers are allocated without `WRITECOMBINED` (cudarc's default for pinned memory):
//! write-combined memory is uncached, and the crops read it back.
//!
//! The copies are queued on tract-cuda's stream of the calling thread with host slices
//! cut out of the pinned buffers: the driver sees pinned memory and copies
//! asynchronously, so each buffer is written or read again only after a synchronisation
//! of the stream.

use std::sync::Mutex;

use cudarc::driver::PinnedHostSlice;
use tract_core::internal::*;
use tract_cuda::kernels::{get_sliced_cuda_view, get_sliced_cuda_view_mut};
use tract_gpu::tensor::{DeviceTensor, LazyHostStorage};

use crate::batch::{crop_output, crop_samples, pack_into, packed_bytes, packed_shape, transpose};
use crate::timeline::{self, Phase};
use crate::transform::OutputLayout;

/// Staging buffers kept for reuse: two for the upload and two for the download of each of
/// the four lanes ragged-cuda's backend runs by default. More than this, the smallest is
/// freed: pinned memory is memory the OS cannot page out, and allocating it again stalls
/// the device.
const KEPT: usize = 16;

/// The bytes a staging buffer holds: a part of a batch. Large enough for the bus to run at
/// full speed, small enough to crop one part while the next is copied.
pub const CHUNK: usize = 32 << 20;

/// A batch moves in at least this many parts where each keeps [`MIN_PART`] bytes: with
/// one part, packing (or cropping) and the bus take turns.
const PARTS: usize = 4;

/// The fewest bytes a part is cut to: below it a copy's fixed cost shows.
const MIN_PART: usize = 2 << 20;

/// Pinned staging buffers for uploads and downloads: how ragged-cuda's backend moves
/// batches ([`super::backend::CudaBackend`]).
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
    /// or a new one of at least [`CHUNK`] bytes. Given back with [`Self::give`] once the
    /// stream is done with it.
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
        let len = bytes.max(CHUNK);
        tract_cuda::with_cuda_stream(|stream| {
            // SAFETY: the bytes are uninitialised; every use writes before it reads (a
            // pack or a download of as many bytes as it then reads).
            unsafe { stream.context().alloc_pinned_with_flags::<u8>(len, 0) }
                .with_context(|| format!("Allocating {len} bytes of pinned host memory"))
        })
    }

    fn give(&self, buffers: impl IntoIterator<Item = PinnedHostSlice<u8>>) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.extend(buffers);
            if kept.len() > KEPT {
                kept.sort_by_key(|b| std::cmp::Reverse(b.len()));
                kept.truncate(KEPT);
            }
        }
    }

    /// Two staging buffers for parts of a batch of `n` samples of `slot` bytes each, and
    /// the samples a part holds: at least [`PARTS`] parts where each keeps [`MIN_PART`]
    /// bytes, so that packing (or cropping) one overlaps the bus moving another, at most
    /// [`CHUNK`] bytes a part.
    fn pair(&self, slot: usize, n: usize) -> TractResult<([PinnedHostSlice<u8>; 2], usize)> {
        let slot = slot.max(1);
        let per_part = n
            .div_ceil(PARTS)
            .max(MIN_PART.div_ceil(slot))
            .min(CHUNK / slot)
            .max(1);
        let bytes = per_part * slot;
        let first = self.take(bytes)?;
        let second = match self.take(bytes) {
            Ok(b) => b,
            Err(e) => {
                self.give([first]);
                return Err(e);
            }
        };
        Ok(([first, second], per_part))
    }
}

/// The device tensor still behind a lazy host tensor from a plan's outputs, if it is.
fn on_device(t: &Tensor) -> Option<&DeviceTensor> {
    let lazy = t.storage_as::<LazyHostStorage>()?;
    if lazy.is_materialized() {
        return None;
    }
    // Downloaded as bytes in its order: only a tensor laid out as its shape says.
    lazy.device()
        .filter(|d| d.strides() == &*Tensor::natural_strides(d.shape()))
}

/// The samples of part `part`, `per_part` a part, out of `n`.
fn part(part: usize, per_part: usize, n: usize) -> std::ops::Range<usize> {
    (part * per_part).min(n)..((part + 1) * per_part).min(n)
}

/// Packs and uploads `samples` into `device`, `per_part` samples at a time.
fn upload_parts(
    samples: &[&Tensor],
    axes: &[usize],
    padded: &[usize],
    device: &DeviceTensor,
    buffers: &mut [PinnedHostSlice<u8>; 2],
    per_part: usize,
) -> TractResult<()> {
    let n = samples.len();
    let slot = packed_bytes(&samples[..1], axes, padded);
    tract_cuda::with_cuda_stream(|stream| {
        // The copy each buffer was last the source of: waited for before it is packed
        // again, while the other buffer's copy goes on.
        let mut copies: [Option<cudarc::driver::CudaEvent>; 2] = [None, None];
        for p in 0..n.div_ceil(per_part) {
            let range = part(p, per_part, n);
            let bytes = range.len() * slot;
            if let Some(copy) = copies[p % 2].take() {
                copy.synchronize()?;
            }
            let host = &mut buffers[p % 2].as_mut_slice()?[..bytes];
            timeline::phase(Phase::Pack, range.len(), padded, || {
                pack_into(&samples[range.clone()], axes, padded, host)
            })?;
            let mut dst = get_sliced_cuda_view_mut(device, range.start * slot, bytes)?;
            stream.memcpy_htod(&*host, &mut dst)?;
            copies[p % 2] = Some(stream.record_event(None)?);
        }
        stream.synchronize()?;
        Ok(())
    })
}

/// Downloads output `ix` from `device` and crops its `n` samples, `per_part` at a time.
fn download_parts(
    outputs: &[TValue],
    layout: &OutputLayout,
    ix: usize,
    n: usize,
    device: &DeviceTensor,
    buffers: &mut [PinnedHostSlice<u8>; 2],
    per_part: usize,
) -> TractResult<Vec<Tensor>> {
    let slot = device.len() * device.datum_type().size_of() / n.max(1);
    let parts = n.div_ceil(per_part);
    tract_cuda::with_cuda_stream(|stream| {
        let queue = |p: usize, buffer: &mut PinnedHostSlice<u8>| -> TractResult<()> {
            let range = part(p, per_part, n);
            let bytes = range.len() * slot;
            let src = get_sliced_cuda_view(device, range.start * slot, bytes)?;
            stream.memcpy_dtoh(&src, &mut buffer.as_mut_slice()?[..bytes])?;
            Ok(())
        };
        let mut crops = Vec::with_capacity(n);
        queue(0, &mut buffers[0])?;
        for p in 0..parts {
            stream.synchronize()?;
            if p + 1 < parts {
                // Part p + 1 crosses the bus while part p is cropped.
                queue(p + 1, &mut buffers[(p + 1) % 2])?;
            }
            let range = part(p, per_part, n);
            let bytes = range.len() * slot;
            let base = range.start * slot;
            let host = &buffers[p % 2].as_slice()?[..bytes];
            let n = range.len();
            let cropped = timeline::phase(Phase::Crop, n, &[], || {
                crop_samples(outputs, layout, ix, range, host, base)
            });
            crops.extend(cropped?);
        }
        Ok(crops)
    })
}

impl PinnedTransfer {
    /// The plan's ragged input: `samples` packed into a device tensor, padded with zeros
    /// to `padded` along `axes`, handed over as tract-gpu's lazy host tensor.
    pub fn upload(
        &self,
        samples: &[&Tensor],
        axes: &[usize],
        padded: &[usize],
    ) -> TractResult<TValue> {
        // Pinned buffers are allocated and freed synchronously: not during a graph capture.
        // tract-cuda allocates by unwrapping the driver's answer.
        super::graph::quiet(|| {
            super::graph::driver_errors_typed(|| self.upload_quietly(samples, axes, padded))
        })
    }

    /// Each of the `n` samples' outputs, cropped: outputs still on the device come back a
    /// part at a time, the others as the host crops them.
    pub fn download(
        &self,
        outputs: &[TValue],
        layouts: &[OutputLayout],
        n: usize,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        super::graph::quiet(|| {
            super::graph::driver_errors_typed(|| self.download_quietly(outputs, layouts, n))
        })
    }

    fn upload_quietly(
        &self,
        samples: &[&Tensor],
        axes: &[usize],
        padded: &[usize],
    ) -> TractResult<TValue> {
        let shape = packed_shape(samples, axes, padded);
        let device = DeviceTensor::uninitialized_dt(samples[0].datum_type(), &shape)?;
        let slot = packed_bytes(&samples[..1], axes, padded);
        let (mut buffers, per_part) = self.pair(slot, samples.len())?;
        let copied = upload_parts(samples, axes, padded, &device, &mut buffers, per_part);
        self.give(buffers);
        copied.context("Uploading the packed batch")?;
        // The plan's `DeviceSync` takes the device tensor out of the lazy host tensor.
        Ok(LazyHostStorage::new(device)?.into_tensor().into_tvalue())
    }

    fn download_quietly(
        &self,
        outputs: &[TValue],
        layouts: &[OutputLayout],
        n: usize,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        let mut per_output = vec![];
        for (ix, layout) in layouts.iter().enumerate() {
            let output = &outputs[ix];
            // A range of samples is a range of bytes when the batch axis comes first.
            let device = on_device(output).filter(|_| layout.batch == Some(0));
            let Some(device) = device else {
                // Left on the host, not per sample, or another layout: the host's way (an
                // output still on the device comes back whole).
                per_output.push(crop_output(outputs, layout, ix, n)?);
                continue;
            };
            let slot = device.len() * device.datum_type().size_of() / n.max(1);
            let (mut buffers, per_part) = self.pair(slot, n)?;
            let crops = download_parts(outputs, layout, ix, n, device, &mut buffers, per_part);
            self.give(buffers);
            per_output.push(crops.with_context(|| format!("Downloading output {ix}"))?);
        }
        Ok(transpose(per_output, n))
    }
}
