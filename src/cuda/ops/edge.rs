//! [`EdgeFill`] on the device: a copy of the input reading, past each sample's width along
//! one or two ragged axes, its last valid position there, or the position mirrored about
//! it (`kernels/edge.cu`). Moves bits:
//! one kernel per element size.

use tract_core::internal::*;
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;

use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, device_facts, grid_over, launch, stride_dim, table_columns};
use crate::cuda::nvrtc::KernelFile;
use crate::ops::EdgeFill;

use super::DeviceOp;

crate::kernel_args! {
    /// A contiguous tensor's batch axis and its one or two extended ragged axes, by
    /// stride and extent, with their rows in the widths table (`a1_row` < 0: none);
    /// `reflect` 1 to mirror, 0 to repeat the last valid position.
    pub struct EdgeGeom {
        total: i64,
        reflect: i64,
        table_n: i64,
        batch_stride: i64,
        batch_dim: i64,
        a0_stride: i64,
        a0_dim: i64,
        a0_row: i64,
        a1_stride: i64,
        a1_dim: i64,
        a1_row: i64,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "edge",
    source: include_str!("../../../kernels/edge.cu"),
    args: EdgeGeom::declaration,
};

/// [`EdgeFill`] on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaEdgeFill(pub EdgeFill);

/// Our edge replication, for elements of 1, 2, 4 or 8 bytes along one or two axes.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<EdgeFill>() else {
        return Ok(None);
    };
    super::element_size_kernel("ragged_edge", dt, "an edge replication")?;
    ensure!(
        (1..=2).contains(&op.along.len()),
        "ragged-cuda: no CUDA edge replication along {} axes",
        op.along.len()
    );
    Ok(Some(Box::new(CudaEdgeFill(op.clone()))))
}

device_op!(CudaEdgeFill);

impl DeviceOp for CudaEdgeFill {
    const NAME: &'static str = "CudaRaggedEdgeFill";

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let (x, table) = args_2!(inputs);
        let (x, table) = (x.to_device_tensor()?, table.to_device_tensor()?);
        contiguous(x, op)?;
        let table_n = table_columns(table, op)?;
        let shape = x.shape();
        let axes = &self.0.axes;
        ensure!(
            shape[axes.batch] as i64 == table_n,
            "{op}: {} samples, {table_n} widths",
            shape[axes.batch]
        );
        let row = |axis: usize| -> TractResult<i64> {
            Ok(axes
                .ragged_at(axis)
                .context("an axis that is not ragged")?
                .row as i64)
        };
        let (batch_stride, batch_dim) = stride_dim(shape, axes.batch);
        let a0 = self.0.along[0];
        let (a0_stride, a0_dim) = stride_dim(shape, a0);
        let (a1_stride, a1_dim, a1_row) = match self.0.along.get(1) {
            Some(&a1) => {
                let (s, d) = stride_dim(shape, a1);
                (s, d, row(a1)?)
            }
            None => (1, 1, -1),
        };
        let geom = EdgeGeom {
            total: x.len() as i64,
            reflect: self.0.reflect as i64,
            table_n,
            batch_stride,
            batch_dim,
            a0_stride,
            a0_dim,
            a0_row: row(a0)?,
            a1_stride,
            a1_dim,
            a1_row,
        };
        let output = make_tensor_for_node(ctx, x.datum_type(), shape)?;
        if x.len() > 0 {
            let name = super::element_size_kernel("ragged_edge", x.datum_type(), op)?;
            // SAFETY: ragged_edge_bK(x, y, table, EdgeGeom): x and y hold `total` elements
            // of K bytes (the tensor's), the table [K', table_n] i64 with both rows < K'
            // (the transform's rows), every source index within the tensor (clamped to a
            // position below the width, itself at most the extent).
            unsafe {
                launch(
                    &KERNELS,
                    &name,
                    grid_over(x.len()),
                    &[x, &output, table],
                    &geom,
                )
            }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaEdgeFill {
    /// The host op's (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(inputs, |f| Ok(f.shape.clone()))
    }

    as_op!();
}
