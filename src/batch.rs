//! Packing samples into a batch, and cropping a batch's outputs back into samples.
//!
//! A sample is given without the batch axis. Packing stacks the samples along a new axis
//! 0 and pads their ragged axes with zeros up to the padded extents; what the padding
//! holds does not matter (the model masks it), zeros merely keep it finite. Cropping takes
//! one sample's slice of an output and cuts each ragged axis to the sample's width there.
//!
//! Both are plain memory copies, and on a GPU they are a good part of a batch's time
//! (256 lines of PP-OCRv4 rec: 47 MB in, 271 MB of probabilities out). So they work on
//! bytes, in runs as long as the layout allows (a sample's whole slot when the batch axis
//! is the outermost one), spread over the host's cores when there is enough to copy, and
//! they read and write any byte buffer: a tensor's, or a pinned staging buffer's
//! (`cuda::transfer`).

use crate::error::BadSample;
use tract_core::internal::*;

use crate::transform::OutputLayout;

/// What every sample must agree with: the model's input, batch axis removed.
#[derive(Clone, Debug)]
pub struct SampleFact {
    pub datum_type: DatumType,
    /// The sample's dims, `None` where the model leaves them to the samples (the ragged
    /// axes, and any other symbolic dim).
    pub dims: TVec<Option<usize>>,
    /// The ragged axes, in the sample (without the batch axis), ascending.
    pub axes: TVec<usize>,
    /// Per ragged axis, the multiple its widths must be (1: any), and why.
    pub alignment: TVec<(u64, Option<String>)>,
    /// The largest magnitude a value may have, where the model computes in a narrower type
    /// than the samples' (f16: 65504).
    pub largest: Option<f32>,
}

impl SampleFact {
    /// The last ragged axis (the only one of a line), in the sample.
    pub fn axis(&self) -> usize {
        *self.axes.last().unwrap_or(&0)
    }

    /// A sample's widths, one per ragged axis.
    pub fn widths_of(&self, sample: &Tensor) -> TVec<usize> {
        self.axes.iter().map(|a| sample.shape()[*a]).collect()
    }

    /// Checks the samples, naming the first one at fault: rank, type, the fixed dims, the
    /// free dims (equal across the batch but for the ragged ones), widths of at least
    /// one, no NaN and no infinity. Every value is read: on the host's cores
    /// (`par_map`) when the samples are large enough, the first sample at fault reported.
    pub fn check(&self, samples: &[impl std::borrow::Borrow<Tensor>]) -> TractResult<()> {
        self.check_from(0, samples)
    }

    /// [`Self::check`] on samples that are the caller's from index `first_index` on: the
    /// errors name them by the caller's indices.
    pub fn check_from(
        &self,
        first_index: usize,
        samples: &[impl std::borrow::Borrow<Tensor>],
    ) -> TractResult<()> {
        ensure!(!samples.is_empty(), "no sample to run");
        let first = samples[0].borrow();
        let indexed: Vec<(usize, &Tensor)> = samples
            .iter()
            .enumerate()
            .map(|(ix, s)| (first_index + ix, s.borrow()))
            .collect();
        let bytes = indexed
            .iter()
            .map(|(_, s)| s.len() * s.datum_type().size_of())
            .sum();
        crate::timeline::phase(crate::timeline::Phase::Check, samples.len(), &[], || {
            par_map(indexed, bytes, |(ix, sample)| {
                self.check_sample(ix, sample, Some((first_index, first)))
            })
        })?;
        Ok(())
    }

    /// Checks sample `ix` alone, and, with `first` (another sample and its index), that
    /// its free dims are the same as that sample's: they share a batch.
    /// A sample that does not fit is a [`BadSample`].
    pub fn check_sample(
        &self,
        ix: usize,
        sample: &Tensor,
        first: Option<(usize, &Tensor)>,
    ) -> TractResult<()> {
        self.check_sample_fits(ix, sample, first).map_err(|e| {
            anyhow!(BadSample {
                index: ix,
                name: None,
                input: None,
                reason: format!("{e:#}"),
            })
        })
    }

    fn check_sample_fits(
        &self,
        ix: usize,
        sample: &Tensor,
        first: Option<(usize, &Tensor)>,
    ) -> TractResult<()> {
        ensure!(
            sample.rank() == self.dims.len(),
            "sample {ix} has rank {} (shape {:?}), the model expects rank {} without the \
             batch axis",
            sample.rank(),
            sample.shape(),
            self.dims.len()
        );
        ensure!(
            sample.datum_type() == self.datum_type,
            "sample {ix} is {:?}, the model expects {:?}",
            sample.datum_type(),
            self.datum_type
        );
        for (axis, (dim, expected)) in sample.shape().iter().zip(&self.dims).enumerate() {
            if let Some(expected) = expected {
                ensure!(
                    dim == expected,
                    "sample {ix} has extent {dim} on axis {axis}, the model expects {expected}"
                );
            } else if let Some((first_ix, first)) = first.filter(|_| !self.axes.contains(&axis)) {
                ensure!(
                    *dim == first.shape()[axis],
                    "sample {ix} has extent {dim} on axis {axis}, sample {first_ix} has {}: \
                     only the ragged axes {:?} may differ within a batch",
                    first.shape()[axis],
                    self.axes
                );
            }
        }
        for (k, &axis) in self.axes.iter().enumerate() {
            let w = sample.shape()[axis];
            ensure!(
                w >= 1,
                "sample {ix} has width 0 along the ragged axis {axis}"
            );
            if let Some((m, why)) = self.alignment.get(k).filter(|(m, _)| *m > 1) {
                ensure!(
                    (w as u64).is_multiple_of(*m),
                    "sample {ix} has width {w} along axis {axis}: this model takes widths that \
                     are multiples of {m} there ({}), as its own preprocessing sizes them",
                    why.as_deref().unwrap_or("?")
                );
            }
        }
        if let Some(largest) = self.largest
            && let Some((at, value)) = first_beyond(sample, largest)?
        {
            bail!(
                "sample {ix} holds {value} at element {at}, beyond {largest}, the largest value \
                 of the precision this model runs in (f16): it would become an infinity \
                 inside; run it in f32"
            );
        }
        if let Some((at, value)) = first_non_finite(sample)? {
            bail!(
                "sample {ix} holds {value} at element {at}: non-finite values are refused \
                 (through the model they turn into NaNs whose fate depends on the kernels, \
                 so batched and alone could differ)"
            );
        }
        Ok(())
    }
}

/// The first value of an f32 tensor beyond `largest` in magnitude, with its flat index.
fn first_beyond(t: &Tensor, largest: f32) -> TractResult<Option<(usize, String)>> {
    if t.datum_type() != DatumType::F32 {
        return Ok(None);
    }
    let values = t.try_as_plain_ram()?.as_slice::<f32>()?;
    Ok(values
        .iter()
        .position(|v| v.abs() > largest)
        .map(|at| (at, format!("{}", values[at]))))
}

/// The first NaN or infinity of a float tensor, with its flat index.
fn first_non_finite(t: &Tensor) -> TractResult<Option<(usize, String)>> {
    /// Scanned a block at a time with a fold the compiler vectorises (samples are tens of
    /// megabytes), the element found only in a block that has one.
    fn find<T: Datum + Copy + Into<f64>>(
        t: &Tensor,
        non_finite: impl Fn(T) -> bool,
    ) -> TractResult<Option<(usize, String)>> {
        let values = t.try_as_plain_ram()?.as_slice::<T>()?;
        const BLOCK: usize = 256;
        for (block, chunk) in values.chunks(BLOCK).enumerate() {
            if chunk.iter().fold(false, |any, v| any | non_finite(*v)) {
                let at = chunk.iter().position(|v| non_finite(*v)).unwrap_or(0) + block * BLOCK;
                let v: f64 = values[at].into();
                return Ok(Some((at, format!("{v}"))));
            }
        }
        Ok(None)
    }
    match t.datum_type() {
        DatumType::F16 => find::<f16>(t, |v| !v.is_finite()),
        DatumType::F32 => find::<f32>(t, |v| !v.is_finite()),
        DatumType::F64 => find::<f64>(t, |v| !v.is_finite()),
        _ => Ok(None),
    }
}

/// The samples' widths along each ragged axis `axes` (of the samples): one vector per
/// axis, one width per sample.
pub fn widths(samples: &[impl std::borrow::Borrow<Tensor>], axes: &[usize]) -> Vec<Vec<i64>> {
    axes.iter()
        .map(|axis| {
            samples
                .iter()
                .map(|s| s.borrow().shape()[*axis] as i64)
                .collect()
        })
        .collect()
}

/// The bytes one task of the copy pool moves: large enough to amortise a task, small
/// enough that a batch of a few samples spreads over every core. One core copies at a
/// fraction of a host's memory bandwidth (2 GB/s of the 40 that 16 cores reach on the
/// H200's host), and a batch's part of a few samples would otherwise leave most cores
/// waiting.
pub(crate) const PIECE: usize = 1 << 20;

/// The host's cores for copying, a pool kept for the process: threads that persist keep
/// their allocator arenas, so that outputs freed by one run are the next run's memory
/// rather than fresh pages to fault in.
fn copy_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(cores)
            .thread_name(|i| format!("tract-ragged-copy-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// `f` over `items`, in order, spread over the host's cores ([`copy_pool`]) when `bytes`
/// (the memory the work moves) is worth it; the first error in the items' order.
pub(crate) fn par_map<I: Send, T: Send>(
    items: Vec<I>,
    bytes: usize,
    f: impl Fn(I) -> TractResult<T> + Sync + Send,
) -> TractResult<Vec<T>> {
    use rayon::prelude::*;
    let pool = copy_pool().filter(|p| p.current_num_threads() > 1);
    let Some(pool) = pool.filter(|_| items.len() > 1 && bytes >= 2 * PIECE) else {
        return items.into_iter().map(f).collect();
    };
    // A task's panic reaches the caller, as a serial loop's would.
    let results: Vec<TractResult<T>> = pool.install(|| items.into_par_iter().map(&f).collect());
    results.into_iter().collect()
}

/// Copies each source into its destination (pairs of equal lengths) over the host's
/// cores, in pieces of at most [`PIECE`] bytes.
fn par_copy(pairs: Vec<(&mut [u8], &[u8])>) -> TractResult<()> {
    let mut pieces = vec![];
    let mut bytes = 0;
    for (dst, src) in pairs {
        ensure!(
            dst.len() == src.len(),
            "copying {} bytes into {}",
            src.len(),
            dst.len()
        );
        bytes += dst.len();
        pieces.extend(dst.chunks_mut(PIECE).zip(src.chunks(PIECE)));
    }
    par_map(pieces, bytes, |(dst, src)| {
        dst.copy_from_slice(src);
        Ok(())
    })?;
    Ok(())
}

/// How samples lie in a packed batch, in bytes. A slot is a sample's shape padded to
/// the padded extents along its ragged axes, and it is written in runs along the last
/// ragged axis: `rows` runs (every position of the axes before it, within the padded
/// extents), each `padded * inner` bytes, of which a sample fills its width times `inner`
/// (the bytes of one step: the axes after it) when the row lies within its widths along
/// the other ragged axes, and nothing otherwise.
#[derive(Clone, Debug)]
struct Slots {
    /// The padded shape of the axes before the last ragged axis.
    outer: TVec<usize>,
    /// The other ragged axes, among those.
    ragged: TVec<usize>,
    last: usize,
    inner: usize,
    padded: usize,
}

impl Slots {
    fn new(first: &Tensor, axes: &[usize], padded: &[usize]) -> Slots {
        let shape = first.shape();
        let last = *axes.last().unwrap_or(&0);
        let mut outer: TVec<usize> = shape[..last].into();
        for (axis, extent) in axes.iter().zip(padded) {
            if *axis < last {
                outer[*axis] = *extent;
            }
        }
        Slots {
            outer,
            ragged: axes[..axes.len().saturating_sub(1)].into(),
            last,
            inner: shape[last + 1..].iter().product::<usize>() * first.datum_type().size_of(),
            padded: *padded.last().unwrap_or(&0),
        }
    }

    fn rows(&self) -> usize {
        self.outer.iter().product()
    }

    /// The bytes of one sample's slot in the batch.
    fn slot(&self) -> usize {
        self.rows() * self.padded * self.inner
    }

    /// The bytes of one row of a slot.
    fn row(&self) -> usize {
        self.padded * self.inner
    }

    /// Writes the rows of `sample` (of `shape`) from padded row `first` on into `dst`
    /// (whole rows of its slot), zeros past its widths.
    fn write_rows(&self, sample: &[u8], shape: &[usize], first: usize, dst: &mut [u8]) {
        let (run, stride) = (shape[self.last] * self.inner, self.row());
        // The row's position in the padded extents, and where the sample's own row lies.
        let mut index: TVec<usize> = tvec![0; self.outer.len()];
        let mut rest = first;
        for d in (0..self.outer.len()).rev() {
            index[d] = rest % self.outer[d].max(1);
            rest /= self.outer[d].max(1);
        }
        for dst in dst.chunks_exact_mut(stride) {
            let inside = self.ragged.iter().all(|a| index[*a] < shape[*a]);
            if inside {
                let row = index
                    .iter()
                    .zip(&shape[..self.last])
                    .fold(0, |row, (i, extent)| row * extent + i);
                dst[..run].copy_from_slice(&sample[row * run..(row + 1) * run]);
                dst[run..].fill(0);
            } else {
                dst.fill(0);
            }
            for d in (0..index.len()).rev() {
                index[d] += 1;
                if index[d] < self.outer[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    }
}

/// The shape of a packed batch of `samples` padded to `padded` along `axes` (of the
/// samples).
pub fn packed_shape(samples: &[&Tensor], axes: &[usize], padded: &[usize]) -> TVec<usize> {
    let mut shape: TVec<usize> = samples[0].shape().into();
    for (axis, extent) in axes.iter().zip(padded) {
        shape[*axis] = *extent;
    }
    shape.insert(0, samples.len());
    shape
}

/// The bytes of a packed batch of `samples` padded to `padded` along `axes`.
pub fn packed_bytes(samples: &[&Tensor], axes: &[usize], padded: &[usize]) -> usize {
    Slots::new(samples[0], axes, padded).slot() * samples.len()
}

/// Packs checked samples into `dst` (exactly [`packed_bytes`] long), as [`pack`] lays
/// them out.
pub fn pack_into(
    samples: &[&Tensor],
    axes: &[usize],
    padded: &[usize],
    dst: &mut [u8],
) -> TractResult<()> {
    let slots = Slots::new(samples[0], axes, padded);
    ensure!(
        dst.len() == slots.slot() * samples.len(),
        "packing {} samples into {} bytes, they need {}",
        samples.len(),
        dst.len(),
        slots.slot() * samples.len()
    );
    ensure!(
        samples[0].datum_type().is_copy(),
        "samples of {:?} cannot be packed as bytes",
        samples[0].datum_type()
    );
    let total = dst.len();
    // Each sample's slot in pieces of whole rows, about PIECE bytes each.
    let rows_per_piece = (PIECE / slots.row().max(1)).max(1);
    let mut jobs: Vec<(&Tensor, usize, &mut [u8])> = vec![];
    for (sample, slot) in samples
        .iter()
        .copied()
        .zip(dst.chunks_exact_mut(slots.slot().max(1)))
    {
        let piece = rows_per_piece * slots.row().max(1);
        for (k, rows) in slot.chunks_mut(piece).enumerate() {
            jobs.push((sample, k * rows_per_piece, rows));
        }
    }
    par_map(jobs, total, |(sample, first, rows)| {
        let bytes = crate::host_view::bytes(sample)?;
        slots.write_rows(bytes, sample.shape(), first, rows);
        Ok(())
    })?;
    Ok(())
}

/// Stacks checked samples along a new axis 0, padded with zeros to `padded` along the
/// ragged axes `axes` (of the samples).
pub fn pack(
    samples: &[impl std::borrow::Borrow<Tensor>],
    axes: &[usize],
    padded: &[usize],
) -> TractResult<Tensor> {
    let samples: Vec<&Tensor> = samples.iter().map(|s| s.borrow()).collect();
    let shape = packed_shape(&samples, axes, padded);
    let dt = samples[0].datum_type();
    // SAFETY: every byte is written by `pack_into`, padding included.
    let mut batch = unsafe { Tensor::uninitialized_dt(dt, &shape)? };
    pack_into(
        &samples,
        axes,
        padded,
        batch.try_as_plain_ram_mut()?.as_bytes_mut(),
    )?;
    Ok(batch)
}

/// Where one sample's crop lies in an output, and how to copy it out in runs.
#[derive(Clone, Debug)]
struct Crop {
    dt: DatumType,
    /// The crop's extents, batch axis (of extent 1) included.
    extents: TVec<usize>,
    batch: usize,
    /// In bytes, in the whole output.
    start: usize,
    strides: TVec<usize>,
    /// The longest runs the crop's bytes come in, and the outer axes they repeat over.
    run: usize,
    outer: usize,
}

impl Crop {
    /// Sample `sample`'s crop of an output of `shape`, cut to `cuts` (axis, width).
    fn new(
        dt: DatumType,
        shape: &[usize],
        batch: usize,
        sample: usize,
        cuts: &[(usize, usize)],
    ) -> Crop {
        let size = dt.size_of();
        let strides: TVec<usize> = Tensor::natural_strides(shape)
            .iter()
            .map(|s| *s as usize * size)
            .collect();
        let mut extents: TVec<usize> = shape.into();
        extents[batch] = 1;
        for (axis, w) in cuts {
            extents[*axis] = extents[*axis].min(*w);
        }
        // The run: the inner axes the crop keeps whole, and the first one it cuts.
        let mut run = size;
        let mut outer = shape.len();
        while outer > 0 {
            outer -= 1;
            run *= extents[outer];
            if extents[outer] != shape[outer] {
                break;
            }
        }
        Crop {
            dt,
            start: sample * strides[batch],
            extents,
            batch,
            strides,
            run,
            outer,
        }
    }

    /// The crop, copied out of `bytes`, the output's bytes from byte `base` on; batch axis
    /// removed.
    fn copy(&self, bytes: &[u8], base: usize) -> TractResult<Tensor> {
        let mut t = self.uninitialized()?;
        let mut dst = t.try_as_plain_ram_mut()?;
        for (dst, src) in self.runs(dst.as_bytes_mut(), bytes, base)? {
            dst.copy_from_slice(src);
        }
        Ok(t)
    }

    /// The crop's tensor, to be written by [`Self::runs`].
    fn uninitialized(&self) -> TractResult<Tensor> {
        let mut shape = self.extents.clone();
        shape.remove(self.batch);
        // SAFETY: every byte is written by the caller, through `runs`.
        unsafe { Tensor::uninitialized_dt(self.dt, &shape) }
    }

    /// The crop's runs: each piece of `dst` (the crop's bytes) with the bytes of `bytes`
    /// (the output's, from byte `base` on) it takes.
    fn runs<'a>(
        &self,
        dst: &'a mut [u8],
        bytes: &'a [u8],
        base: usize,
    ) -> TractResult<Vec<(&'a mut [u8], &'a [u8])>> {
        let mut runs = vec![];
        let mut index: TVec<usize> = tvec![0; self.outer];
        for chunk in dst.chunks_exact_mut(self.run.max(1)) {
            let at = self.start
                + index
                    .iter()
                    .zip(&self.strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            let at = at
                .checked_sub(base)
                .context("a crop starts before the bytes it is cut from")?;
            let src = bytes
                .get(at..at + self.run)
                .context("a crop reaches past the bytes it is cut from")?;
            runs.push((chunk, src));
            // Odometer over the outer axes.
            for d in (0..self.outer).rev() {
                index[d] += 1;
                if index[d] < self.extents[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Ok(runs)
    }
}

/// Sample `sample`'s part of output `ix` of a run: batch axis removed, each ragged axis
/// cut to the sample's width, read from the run's widths outputs.
pub fn crop(
    outputs: &[TValue],
    layout: &OutputLayout,
    ix: usize,
    sample: usize,
) -> TractResult<Tensor> {
    let output = &outputs[ix];
    let Some(batch) = layout.batch else {
        return Ok(output.clone().into_tensor());
    };
    let cuts = cuts(outputs, layout)?;
    let mine: Vec<(usize, usize)> = cuts.iter().map(|(a, w)| (*a, w[sample])).collect();
    if !output.datum_type().is_copy() {
        let mut t = output.slice(batch, sample, sample + 1)?;
        for (axis, w) in mine {
            if w < t.shape()[axis] {
                t = t.slice(axis, 0, w)?;
            }
        }
        t.remove_axis(batch)?;
        return Ok(t);
    }
    Crop::new(output.datum_type(), output.shape(), batch, sample, &mine)
        .copy(output.try_as_plain_ram()?.as_bytes(), 0)
}

/// Each ragged axis of an output and the samples' widths along it.
fn cuts(outputs: &[TValue], layout: &OutputLayout) -> TractResult<Vec<(usize, Vec<usize>)>> {
    layout
        .ragged
        .iter()
        .map(|r| {
            let widths = outputs
                .get(r.widths_output)
                .context("a widths output is missing")?
                .cast_to::<i64>()?;
            let widths = widths.try_as_plain_ram()?;
            Ok((
                r.axis,
                widths
                    .as_slice::<i64>()?
                    .iter()
                    .map(|w| (*w).max(0) as usize)
                    .collect(),
            ))
        })
        .collect()
}

/// Every sample's crops of output `ix`, from its bytes on the host (an output left on a
/// device comes back in one copy).
pub fn crop_output(
    outputs: &[TValue],
    layout: &OutputLayout,
    ix: usize,
    n: usize,
) -> TractResult<Vec<Tensor>> {
    let output = &outputs[ix];
    let bytes = if output.datum_type().is_copy() {
        output.try_as_plain_ram()?.as_bytes()
    } else {
        &[]
    };
    crop_samples(outputs, layout, ix, 0..n, bytes, 0)
}

/// The crops of the samples in `samples` of output `ix`, read from `bytes`: the output's
/// bytes from byte `base` on, as far as those samples' crops reach. With the batch axis
/// first, a range of samples is a range of bytes, so that an output can come to the host
/// and be cropped a part at a time.
pub fn crop_samples(
    outputs: &[TValue],
    layout: &OutputLayout,
    ix: usize,
    samples: std::ops::Range<usize>,
    bytes: &[u8],
    base: usize,
) -> TractResult<Vec<Tensor>> {
    let output = &outputs[ix];
    let Some(batch) = layout.batch else {
        return Ok(vec![output.clone().into_tensor(); samples.len()]);
    };
    if !output.datum_type().is_copy() {
        return samples.map(|s| crop(outputs, layout, ix, s)).collect();
    }
    let cuts = cuts(outputs, layout)?;
    let crops: Vec<Crop> = samples
        .map(|sample| {
            let mine: Vec<(usize, usize)> = cuts.iter().map(|(a, w)| (*a, w[sample])).collect();
            Crop::new(output.datum_type(), output.shape(), batch, sample, &mine)
        })
        .collect();
    // Every crop allocated first, then all their runs copied in pieces over the cores:
    // a part of a few samples still keeps every core copying.
    let mut tensors = crops
        .iter()
        .map(|c| c.uninitialized())
        .collect::<TractResult<Vec<Tensor>>>()?;
    {
        let mut views = tensors
            .iter_mut()
            .map(|t| t.try_as_plain_ram_mut())
            .collect::<TractResult<Vec<_>>>()?;
        let mut pairs = vec![];
        for (crop, view) in crops.iter().zip(views.iter_mut()) {
            pairs.extend(crop.runs(view.as_bytes_mut(), bytes, base)?);
        }
        par_copy(pairs).with_context(|| format!("Cropping output {ix}"))?;
    }
    Ok(tensors)
}

/// Every sample's outputs, from the outputs of a run of `n` samples: for each sample, its
/// outputs in order. Reads each output's bytes on the host (bringing an output left on a
/// device back in one copy).
pub fn crop_all(
    outputs: &[TValue],
    layouts: &[OutputLayout],
    n: usize,
) -> TractResult<Vec<TVec<Tensor>>> {
    let per_output = (0..layouts.len())
        .map(|ix| crop_output(outputs, &layouts[ix], ix, n))
        .collect::<TractResult<Vec<_>>>()?;
    Ok(transpose(per_output, n))
}

/// Per output, per sample → per sample, per output.
pub(crate) fn transpose(per_output: Vec<Vec<Tensor>>, n: usize) -> Vec<TVec<Tensor>> {
    let mut samples: Vec<TVec<Tensor>> = (0..n).map(|_| tvec![]).collect();
    for crops in per_output {
        for (sample, t) in samples.iter_mut().zip(crops) {
            sample.push(t);
        }
    }
    samples
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::OutputAxis;

    fn ramp(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_shape(shape, &(0..n).map(|x| x as f32).collect::<Vec<_>>()).unwrap()
    }

    /// Crops by slicing, one axis at a time: what [`Crop`] must copy in runs.
    fn sliced(t: &Tensor, batch: usize, sample: usize, cuts: &[(usize, usize)]) -> Tensor {
        let mut t = t.slice(batch, sample, sample + 1).unwrap();
        for (axis, w) in cuts {
            t = t.slice(*axis, 0, *w).unwrap();
        }
        t.remove_axis(batch).unwrap();
        t
    }

    #[test]
    fn crops_are_the_slices_whatever_the_layout() {
        let shape = [3, 4, 5, 6];
        let t = ramp(&shape);
        let bytes = t.as_bytes();
        for batch in 0..4 {
            for axis in (0..4).filter(|a| *a != batch) {
                for w in 1..=shape[axis] {
                    for sample in 0..shape[batch] {
                        let cuts = [(axis, w)];
                        let crop = Crop::new(f32::datum_type(), &shape, batch, sample, &cuts);
                        assert_eq!(
                            crop.copy(bytes, 0).unwrap(),
                            sliced(&t, batch, sample, &cuts),
                            "batch {batch}, cut axis {axis} to {w}, sample {sample}"
                        );
                    }
                }
            }
        }
        // Two ragged axes (attention scores).
        let cuts = [(2, 3), (3, 2)];
        let crop = Crop::new(f32::datum_type(), &shape, 0, 1, &cuts);
        assert_eq!(crop.copy(bytes, 0).unwrap(), sliced(&t, 0, 1, &cuts));
        // From a part of the bytes: sample 2's slot on, batch axis first.
        let slot = bytes.len() / 3;
        let crop = Crop::new(f32::datum_type(), &shape, 0, 2, &cuts);
        assert_eq!(
            crop.copy(&bytes[2 * slot..], 2 * slot).unwrap(),
            sliced(&t, 0, 2, &cuts)
        );
    }

    #[test]
    fn crop_output_reads_the_widths_outputs() {
        let out = ramp(&[2, 5, 3]).into_tvalue();
        let widths = tensor1(&[4i64, 2]).into_tvalue();
        let layout = OutputLayout {
            batch: Some(0),
            ragged: vec![OutputAxis {
                axis: 1,
                widths_output: 1,
                row: 0,
            }],
        };
        let outputs = [out.clone(), widths];
        let crops = crop_output(&outputs, &layout, 0, 2).unwrap();
        assert_eq!(crops[0], sliced(&out, 0, 0, &[(1, 4)]));
        assert_eq!(crops[1], sliced(&out, 0, 1, &[(1, 2)]));
        assert_eq!(crop(&outputs, &layout, 0, 1).unwrap(), crops[1]);
    }

    #[test]
    fn packing_pads_with_zeros() {
        let a = ramp(&[2, 3, 2]);
        let b = ramp(&[2, 1, 2]);
        let batch = pack(&[&a, &b], &[1], &[4]).unwrap();
        assert_eq!(batch.shape(), &[2, 2, 4, 2]);
        for (ix, s) in [&a, &b].iter().enumerate() {
            let w = s.shape()[1];
            let slot = batch.slice(0, ix, ix + 1).unwrap();
            assert_eq!(
                slot.slice(2, 0, w).unwrap().into_shape(s.shape()).unwrap(),
                **s
            );
            let pad = slot.slice(2, w, 4).unwrap();
            let pad = pad.try_as_plain_ram().unwrap();
            assert!(pad.as_slice::<f32>().unwrap().iter().all(|x| *x == 0.0));
        }
    }

    #[test]
    fn packing_pads_two_ragged_axes_with_zeros() {
        let a = ramp(&[2, 3, 4]);
        let b = ramp(&[2, 1, 2]);
        let batch = pack(&[&a, &b], &[1, 2], &[4, 5]).unwrap();
        assert_eq!(batch.shape(), &[2, 2, 4, 5]);
        for (ix, s) in [&a, &b].iter().enumerate() {
            let (h, w) = (s.shape()[1], s.shape()[2]);
            let slot = batch.slice(0, ix, ix + 1).unwrap();
            let inner = slot.slice(2, 0, h).unwrap().slice(3, 0, w).unwrap();
            assert_eq!(inner.into_shape(s.shape()).unwrap(), **s);
            let total: f32 = slot
                .try_as_plain_ram()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .iter()
                .sum();
            let own: f32 = s
                .try_as_plain_ram()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .iter()
                .sum();
            assert_eq!(total, own, "the padding holds zeros");
        }
    }

    #[test]
    fn parallel_map_keeps_the_order() {
        let items: Vec<usize> = (0..1000).collect();
        let out = par_map(items, 1 << 30, |i| Ok(i * 2)).unwrap();
        assert_eq!(out, (0..1000).map(|i| i * 2).collect::<Vec<_>>());
    }
}
