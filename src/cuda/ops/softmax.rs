//! [`MaskedSoftmax`] on the device, f32 or f16: one block per row, over the sample's valid
//! prefix only (`kernels/softmax.cu`).

use cudarc::driver::LaunchConfig;
use tract_core::internal::*;
use tract_core::ops::nn::SoftmaxKind;
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;

use super::float_kernel;
use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, device_facts, launch, stride_dim, table_columns};
use crate::cuda::nvrtc::KernelFile;
use crate::ops::{MaskedSoftmax, SampleAxes};

use super::DeviceOp;

crate::kernel_args! {
    /// A row is `len` elements `inner` apart; its sample from the batch axis' stride and
    /// extent, its width from row `w_row`; a row lying in the padded region of another
    /// ragged axis (`o_row` >= 0) is all zeros.
    pub struct SoftmaxGeom {
        table_n: i64,
        len: i64,
        inner: i64,
        batch_stride: i64,
        batch_dim: i64,
        w_row: i64,
        o_stride: i64,
        o_dim: i64,
        o_row: i64,
        log_softmax: i64,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "softmax",
    source: include_str!("../../../kernels/softmax.cu"),
    args: SoftmaxGeom::declaration,
};

/// [`MaskedSoftmax`] on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaMaskedSoftmax(pub MaskedSoftmax);

/// Our masked softmax, f32 or f16, over one or two ragged axes.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<MaskedSoftmax>() else {
        return Ok(None);
    };
    float_kernel(dt, "a masked softmax")?;
    ensure!(
        op.axes.ragged.len() <= 2,
        "ragged-cuda: a masked softmax over three ragged axes"
    );
    Ok(Some(Box::new(CudaMaskedSoftmax(op.clone()))))
}

device_op!(CudaMaskedSoftmax);

impl DeviceOp for CudaMaskedSoftmax {
    const NAME: &'static str = "CudaRaggedMaskedSoftmax";

    fn name(&self) -> StaticName {
        format!("Cuda{}", self.0.name()).into()
    }

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let (x, table) = args_2!(inputs);
        let (x, table) = (x.to_device_tensor()?, table.to_device_tensor()?);
        contiguous(x, op)?;
        let kernel = format!("ragged_softmax_{}", float_kernel(x.datum_type(), op)?);
        let table_n = table_columns(table, op)?;
        let SampleAxes { batch, ragged } = &self.0.axes;
        let axis = self.0.axis;
        let shape = x.shape();
        let w_row = ragged
            .iter()
            .find(|r| r.axis == axis)
            .context("softmax axis is not ragged")?
            .row as i64;
        let (o_stride, o_dim, o_row) = match ragged.iter().find(|r| r.axis != axis) {
            Some(r) => {
                let (s, d) = stride_dim(shape, r.axis);
                (s, d, r.row as i64)
            }
            None => (1, 1, -1),
        };
        let (batch_stride, batch_dim) = stride_dim(shape, *batch);
        let len = shape[axis] as i64;
        let geom = SoftmaxGeom {
            table_n,
            len,
            inner: shape[axis + 1..].iter().product::<usize>() as i64,
            batch_stride,
            batch_dim,
            w_row,
            o_stride,
            o_dim,
            o_row,
            log_softmax: (self.0.kind == SoftmaxKind::LogSoftmax) as i64,
        };
        let rows = (x.len() as i64 / len.max(1)) as u32;
        let output = make_tensor_for_node(ctx, x.datum_type(), shape)?;
        if rows > 0 && len > 0 {
            // One block size whatever the row length: each element of the valid prefix
            // lands on the same thread and the reductions combine them in the same order
            // for a row of the batch and for the same row alone.
            let cfg = LaunchConfig {
                grid_dim: (rows, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: ragged_softmax_{f32,f16}(x, y, table, SoftmaxGeom): x and y hold rows x
            // len of their type, one block per row; the table [K, table_n] i64 with both
            // rows < K.
            unsafe { launch(&KERNELS, &kernel, cfg, &[x, &output, table], &geom) }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaMaskedSoftmax {
    /// The host op's (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(inputs, |f| Ok(f.shape.clone()))
    }

    as_op!();
}
