//! A depthwise 2-D convolution on the device, f32, channels first, one filter per channel
//! (`kernels/depthwise.cu`), for the convolutions [`crate::cuda::convs`] marked
//! [`Depthwise`].
//!
//! tract-cuda runs every convolution through cuDNN with one fixed algorithm (implicit
//! precomputed GEMM), which is slow on one filter per channel; a direct kernel reads and
//! writes at the memory bandwidth. One thread per output element, along the width
//! (coalesced); the summation order is fixed per element, whatever the batch.

use cudarc::driver::LaunchConfig;
use tract_core::internal::*;
use tract_core::ops::cnn::Conv;
use tract_gpu::turn_handler::make_tensor_for_node;
use tract_gpu::utils::facts_to_device_facts;

use crate::cuda::abi::KernelArgs;
use crate::cuda::convs::{DEPTHWISE_MAX_TAPS as MAX_TAPS, Depthwise};
use crate::cuda::kernels::KernelFile;
use crate::cuda::launch::{contiguous_f32, launch};

crate::kernel_args! {
    /// A depthwise convolution of `c` channels, `ih x iw` to `oh x ow`.
    pub struct DepthwiseGeom {
        c: u32,
        ih: u32,
        iw: u32,
        oh: u32,
        ow: u32,
        kh: i32,
        kw: i32,
        sh: i32,
        sw: i32,
        dh: i32,
        dw: i32,
        ph: i32,
        pw: i32,
        /// Output elements: one thread each.
        total: u32,
        /// Planes (samples x channels): a block row each.
        planes: u32,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "depthwise",
    source: include_str!("../../../kernels/depthwise.cu"),
    args: DepthwiseGeom::declaration,
};

/// A depthwise convolution on the device (module doc). Inputs: data, kernel (OIHW), bias.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaDepthwise(pub Conv);

/// The convolutions marked [`Depthwise`] (on f32).
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    match node.op_as::<Depthwise>() {
        Some(Depthwise(conv)) if dt == f32::datum_type() => {
            Ok(Some(Box::new(CudaDepthwise(conv.clone()))))
        }
        _ => Ok(None),
    }
}

impl Op for CudaDepthwise {
    fn name(&self) -> StaticName {
        "CudaDepthwise".into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    op_as_typed_op!();
}

impl EvalOp for CudaDepthwise {
    op_out_of_plan!();

    fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        ensure!(inputs.len() == 3, "CudaDepthwise: data, kernel and bias");
        let inputs = contiguous_f32(&inputs, "CudaDepthwise")?;
        let (x, k, b) = (inputs[0], inputs[1], inputs[2]);
        let spec = &self.0.pool_spec;
        let shape = x.shape();
        ensure!(
            shape.len() == 4 && k.len() == shape[1] * spec.kernel_shape.iter().product::<usize>(),
            "CudaDepthwise: input {shape:?} and kernel {:?} are not one 2-D filter per channel",
            k.shape()
        );
        ensure!(
            b.len() == shape[1],
            "CudaDepthwise: {} biases for {} channels",
            b.len(),
            shape[1]
        );
        ensure!(
            spec.kernel_shape.iter().product::<usize>() <= MAX_TAPS,
            "CudaDepthwise: filters of more than {MAX_TAPS} taps"
        );
        let padding = spec.computed_padding(&shape[2..]);
        let output_shape = [
            shape[0],
            shape[1],
            padding[0].convoluted,
            padding[1].convoluted,
        ];
        let output = make_tensor_for_node(ctx, f32::datum_type(), &output_shape)?;
        let total = output.len();
        ensure!(
            total <= i32::MAX as usize && x.len() <= i32::MAX as usize,
            "CudaDepthwise: tensors of 2^31 elements or more are not supported"
        );
        if total > 0 {
            let int = |v: usize| v as i32;
            let geom = DepthwiseGeom {
                c: shape[1] as u32,
                ih: shape[2] as u32,
                iw: shape[3] as u32,
                oh: output_shape[2] as u32,
                ow: output_shape[3] as u32,
                kh: int(spec.kernel_shape[0]),
                kw: int(spec.kernel_shape[1]),
                sh: int(spec.stride(0)),
                sw: int(spec.stride(1)),
                dh: int(spec.dilation(0)),
                dw: int(spec.dilation(1)),
                ph: int(padding[0].pad_before),
                pw: int(padding[1].pad_before),
                total: total as u32,
                planes: (shape[0] * shape[1]) as u32,
            };
            // Unit stride and dilation along the width: a strip of outputs per thread.
            let strip = spec.stride(1) == 1 && spec.dilation(1) == 1 && spec.kernel_shape[1] <= 7;
            let (name, per_plane) = if strip {
                (
                    "ragged_depthwise_f32_s1",
                    output_shape[2] * output_shape[3].div_ceil(4),
                )
            } else {
                ("ragged_depthwise_f32", output_shape[2] * output_shape[3])
            };
            let planes = shape[0] * shape[1];
            let rows = planes.min(65535);
            let cfg = LaunchConfig {
                grid_dim: (
                    per_plane.div_ceil(256).clamp(1, 65535) as u32,
                    rows as u32,
                    planes.div_ceil(rows) as u32,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: ragged_depthwise_f32[_s1](x, k, b, y, DepthwiseGeom): x is [N, c, ih, iw],
            // k c filters of kh x kw (at most MAX_TAPS), b c biases, y `total` f32 of
            // [N, c, oh, ow], all contiguous (checked above); a block row per plane, rows
            // past the last plane leave.
            unsafe { launch(&KERNELS, name, cfg, &[x, k, b, &output], &geom) }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaDepthwise {
    /// The convolution's own (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| self.0.output_facts(facts))
    }

    as_op!();
}
