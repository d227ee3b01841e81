//! tract's `Downsample` on the device: every `stride`-th position along one axis, from
//! `modulo` on (`kernels/downsample.cu`). tract's declutter splits the stride off a
//! strided 1x1 convolution into it (ResNet's shortcuts, RegNet's), and tract-cuda has no
//! kernel for it: it stayed on the host between two syncs. Moves bits: one kernel per
//! element size. Positive strides only (a negative one reads backwards: left to tract).

use tract_core::internal::*;
use tract_core::ops::downsample::Downsample;
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;

use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, device_facts, grid_over, launch};
use crate::cuda::nvrtc::KernelFile;

use super::DeviceOp;

crate::kernel_args! {
    /// A contiguous tensor as `[outer, axis, inner]`: the output's element count, the
    /// product of the axes after `axis`, the output's and the input's extents along it,
    /// the stride and the first position read.
    pub struct DownsampleGeom {
        total: i64,
        inner: i64,
        out_dim: i64,
        in_dim: i64,
        stride: i64,
        modulo: i64,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "downsample",
    source: include_str!("../../../kernels/downsample.cu"),
    args: DownsampleGeom::declaration,
};

/// [`Downsample`] on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaDownsample(pub Downsample);

/// tract's downsamples of a positive stride, for elements of 1, 2, 4 or 8 bytes.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<Downsample>() else {
        return Ok(None);
    };
    if op.stride <= 0 {
        return Ok(None);
    }
    super::element_size_kernel("downsample", dt, "a downsample")?;
    Ok(Some(Box::new(CudaDownsample(op.clone()))))
}

device_op!(CudaDownsample);

impl DeviceOp for CudaDownsample {
    const NAME: &'static str = "CudaDownsample";

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let x = args_1!(inputs);
        let x = x.to_device_tensor()?;
        contiguous(x, op)?;
        let Downsample {
            axis,
            stride,
            modulo,
        } = self.0;
        let shape = x.shape();
        ensure!(
            axis < shape.len(),
            "{op}: axis {axis} of a tensor of rank {}",
            shape.len()
        );
        let in_dim = shape[axis];
        let out_dim = in_dim.saturating_sub(modulo).div_ceil(stride as usize);
        let mut out_shape: TVec<usize> = shape.into();
        out_shape[axis] = out_dim;
        let output = make_tensor_for_node(ctx, x.datum_type(), &out_shape)?;
        let total: usize = out_shape.iter().product();
        if total > 0 {
            let geom = DownsampleGeom {
                total: total as i64,
                inner: shape[axis + 1..].iter().product::<usize>() as i64,
                out_dim: out_dim as i64,
                in_dim: in_dim as i64,
                stride: stride as i64,
                modulo: modulo as i64,
            };
            let name = super::element_size_kernel("downsample", x.datum_type(), op)?;
            // SAFETY: downsample_bK(x, y, DownsampleGeom): y holds `total` elements of K
            // bytes, x the input's; each output position c < out_dim reads input position
            // c * stride + modulo <= (out_dim - 1) * stride + modulo < in_dim (out_dim is
            // the ceiling of (in_dim - modulo) / stride), within the input.
            unsafe { launch(&KERNELS, &name, grid_over(total), &[x, &output], &geom) }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaDownsample {
    /// The host op's (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(inputs, |f| Ok(self.0.output_facts(&[f])?[0].shape.clone()))
    }

    as_op!();
}
