//! Packing samples into a batch, and cropping a batch's outputs back into samples.
//!
//! A sample is given without the batch axis. Packing stacks the samples along a new axis
//! 0 and pads their ragged axis with zeros up to the padded width; what the padding holds
//! does not matter (the model masks it), zeros merely keep it finite. Cropping takes one
//! sample's slice of an output and cuts each ragged axis to the sample's width there.

use tract_core::internal::*;
use tract_core::ndarray::{Axis, Slice};

use crate::transform::OutputLayout;

/// What every sample must agree with: the model's input, batch axis removed.
#[derive(Clone, Debug)]
pub struct SampleFact {
    pub datum_type: DatumType,
    /// The sample's dims, `None` where the model leaves them to the samples (the ragged
    /// axis, and any other symbolic dim).
    pub dims: TVec<Option<usize>>,
    /// The ragged axis, in the sample (without the batch axis).
    pub axis: usize,
}

impl SampleFact {
    /// Checks the samples, naming the first one at fault: rank, type, the fixed dims, the
    /// free dims (equal across the batch but for the ragged one), a width of at least
    /// one, no NaN.
    pub fn check(&self, samples: &[impl std::borrow::Borrow<Tensor>]) -> TractResult<()> {
        ensure!(!samples.is_empty(), "no sample to run");
        let first = samples[0].borrow();
        for (ix, sample) in samples.iter().enumerate() {
            let sample = sample.borrow();
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
                } else if axis != self.axis {
                    ensure!(
                        *dim == first.shape()[axis],
                        "sample {ix} has extent {dim} on axis {axis}, sample 0 has {}: only the \
                         ragged axis {} may differ within a batch",
                        first.shape()[axis],
                        self.axis
                    );
                }
            }
            ensure!(
                sample.shape()[self.axis] >= 1,
                "sample {ix} has width 0 along the ragged axis {}",
                self.axis
            );
            if sample.datum_type().is_float() {
                let as_f32 = sample.cast_to::<f32>()?;
                let plain = as_f32.try_as_plain_ram()?;
                ensure!(
                    !plain.as_slice::<f32>()?.iter().any(|x| x.is_nan()),
                    "sample {ix} holds NaN"
                );
            }
        }
        Ok(())
    }
}

/// The samples' widths along the ragged axis.
pub fn widths(samples: &[impl std::borrow::Borrow<Tensor>], axis: usize) -> Vec<i64> {
    samples
        .iter()
        .map(|s| s.borrow().shape()[axis] as i64)
        .collect()
}

fn pack_t<T: Datum + Copy>(
    samples: &[impl std::borrow::Borrow<Tensor>],
    axis: usize,
    batch: &mut Tensor,
) -> TractResult<()> {
    let mut view = batch.to_plain_array_view_mut::<T>()?;
    for (ix, sample) in samples.iter().enumerate() {
        let sample = sample.borrow();
        let w = sample.shape()[axis];
        let mut slot = view.index_axis_mut(Axis(0), ix);
        slot.slice_axis_mut(Axis(axis), Slice::from(..w))
            .assign(&sample.to_plain_array_view::<T>()?);
    }
    Ok(())
}

/// Stacks checked samples along a new axis 0, padded with zeros to `padded` along the
/// ragged axis `axis` (of the samples).
pub fn pack(
    samples: &[impl std::borrow::Borrow<Tensor>],
    axis: usize,
    padded: usize,
) -> TractResult<Tensor> {
    let first = samples[0].borrow();
    let mut shape: TVec<usize> = first.shape().into();
    shape[axis] = padded;
    shape.insert(0, samples.len());
    let dt = first.datum_type();
    let mut batch = Tensor::zero_dt(dt, &shape)?;
    dispatch_copy!(pack_t(dt)(samples, axis, &mut batch))?;
    Ok(batch)
}

/// Sample `sample`'s part of output `ix` of a run: batch axis removed, each ragged axis
/// cut to the sample's width, read from the run's widths outputs.
///
/// Only slices: an output still on a device (ragged-cuda's outputs are lazy host tensors)
/// is cut there, and comes to the host only when read.
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
    let mut t = output.slice(batch, sample, sample + 1)?;
    for r in &layout.ragged {
        let widths = outputs[r.widths_output].cast_to::<i64>()?;
        let w = widths.try_as_plain_ram()?.as_slice::<i64>()?[sample] as usize;
        if w < t.shape()[r.axis] {
            t = t.slice(r.axis, 0, w)?;
        }
    }
    t.remove_axis(batch)?;
    Ok(t)
}
