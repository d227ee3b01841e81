//! [`SampleResample`] on the device, f32 or f16: one axis resampled with each sample's own plan
//! (`kernels/resample.cu`). The plans are width arithmetic: [`crate::ops::ResamplePlan`]
//! makes them on the host from the widths table, and they cross to the device once per
//! run like the table.

use tract_core::internal::*;
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;

use super::float_kernel;
use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, device_facts, grid_over, launch, stride_dim};
use crate::cuda::nvrtc::KernelFile;
use crate::ops::SampleResample;

use super::DeviceOp;

crate::kernel_args! {
    /// One axis of `[outer, len, inner]` resampled from `len_in` to `len_out` positions,
    /// `window` taps per sample and output position; the batch axis of the output by its
    /// stride and extent.
    pub struct SampleResampleGeom {
        total: i64,
        len_in: i64,
        len_out: i64,
        inner: i64,
        window: i64,
        batch_stride: i64,
        batch_dim: i64,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "resample",
    source: include_str!("../../../kernels/resample.cu"),
    args: SampleResampleGeom::declaration,
};

/// [`SampleResample`] on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaSampleResample(pub SampleResample);

/// Our per-sample resampling, f32 or f16 (summed in f32, as tract resamples).
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<SampleResample>() else {
        return Ok(None);
    };
    float_kernel(dt, "a per-sample resize")?;
    Ok(Some(Box::new(CudaSampleResample(op.clone()))))
}

device_op!(CudaSampleResample);

impl DeviceOp for CudaSampleResample {
    const NAME: &'static str = "CudaRaggedSampleResample";

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let (x, indices, weights) = args_3!(inputs);
        let (x, indices, weights) = (
            x.to_device_tensor()?,
            indices.to_device_tensor()?,
            weights.to_device_tensor()?,
        );
        for t in [x, indices, weights] {
            contiguous(t, op)?;
        }
        let kernel = format!(
            "ragged_sample_resample_{}",
            float_kernel(x.datum_type(), op)?
        );
        ensure!(
            indices.datum_type() == i32::datum_type()
                && weights.datum_type() == f32::datum_type()
                && indices.rank() == 3
                && indices.shape() == weights.shape(),
            "{op}: plans {:?} {:?} and {:?} {:?}",
            indices.datum_type(),
            indices.shape(),
            weights.datum_type(),
            weights.shape()
        );
        let (n, len_out, window) = (indices.shape()[0], indices.shape()[1], indices.shape()[2]);
        let (axis, batch) = (self.0.axis, self.0.batch);
        ensure!(
            x.shape().get(batch) == Some(&n) && axis < x.rank(),
            "{op}: a tensor of shape {:?} for {n} samples' plans",
            x.shape()
        );
        let mut shape: TVec<usize> = x.shape().into();
        shape[axis] = len_out;
        let (batch_stride, batch_dim) = stride_dim(&shape, batch);
        let geom = SampleResampleGeom {
            total: shape.iter().product::<usize>() as i64,
            len_in: x.shape()[axis] as i64,
            len_out: len_out as i64,
            inner: x.shape()[axis + 1..].iter().product::<usize>() as i64,
            window: window as i64,
            batch_stride,
            batch_dim,
        };
        let output = make_tensor_for_node(ctx, x.datum_type(), &shape)?;
        if output.len() > 0 {
            // SAFETY: ragged_sample_resample_{f32,f16}(x, y, indices, weights, geom): x holds
            // outer x len_in x inner of its type (its shape), y outer x len_out x inner of
            // the same (`total`), the weights f32,
            // the plans N x len_out x window, every index below len_in (the host's plan
            // clamps them within each sample's width, at most the extent).
            unsafe {
                launch(
                    &KERNELS,
                    &kernel,
                    grid_over(output.len()),
                    &[x, &output, indices, weights],
                    &geom,
                )
            }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaSampleResample {
    /// The host op's (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        // A device fact keeps its host shape.
        let len_out = inputs[1].shape[1].clone();
        let axis = self.0.axis;
        device_facts(&inputs[..1], |f| {
            let mut shape = f.shape.to_tvec();
            shape[axis] = len_out.clone();
            Ok(shape.into())
        })
    }

    as_op!();
}
