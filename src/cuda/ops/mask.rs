//! [`Mask`] on the device: a copy of the input with the fill past each sample's width
//! (`kernels/mask.cu`).
//!
//! Two kernels: by rows when there is one ragged axis after the batch axis (one division
//! per row), and the general one (one or two ragged axes anywhere). Both move bits: one
//! kernel per element size, the fill passed as the bits of a value of the tensor's type.

use cudarc::driver::LaunchConfig;
use tract_core::internal::*;
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;

use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, device_facts, grid_over, launch, table_columns};
use crate::cuda::nvrtc::KernelFile;
use crate::ops::Mask;

use super::DeviceOp;

crate::kernel_args! {
    /// The general mask: a flat index's sample and its coordinates on up to two ragged
    /// axes, from strides and extents.
    pub struct MaskGeom {
        total: u32,
        table_n: u32,
        batch_stride: u32,
        batch_dim: u32,
        r0_stride: u32,
        r0_dim: u32,
        r0_row: i32,
        r1_stride: u32,
        r1_dim: u32,
        /// Negative with one ragged axis.
        r1_row: i32,
        /// The fill's bits, in the low bytes.
        fill: u64,
    }
}

crate::kernel_args! {
    /// The mask by rows: `rows` rows of `row_len` elements, `inner` per step along the
    /// ragged axis, `rows_per_sample` rows per sample.
    pub struct MaskRowsGeom {
        rows: u32,
        row_len: u32,
        inner: u32,
        rows_per_sample: u32,
        batch_dim: u32,
        table_n: u32,
        row: i32,
        fill: u64,
    }
}

fn args() -> String {
    MaskGeom::declaration() + &MaskRowsGeom::declaration()
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "mask",
    source: include_str!("../../../kernels/mask.cu"),
    args,
};

/// [`Mask`] on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaMask(pub Mask);

/// Our ragged mask, for any element of 1, 2, 4 or 8 bytes along one or two ragged axes.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<Mask>() else {
        return Ok(None);
    };
    super::element_size_kernel("ragged_mask", dt, "a mask")?;
    ensure!(
        (1..=2).contains(&op.axes.ragged.len()),
        "ragged-cuda: no CUDA mask along {} ragged axes",
        op.axes.ragged.len()
    );
    Ok(Some(Box::new(CudaMask(op.clone()))))
}

device_op!(CudaMask);

impl DeviceOp for CudaMask {
    const NAME: &'static str = "CudaRaggedMask";

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let (x, table) = args_2!(inputs);
        let (x, table) = (x.to_device_tensor()?, table.to_device_tensor()?);
        contiguous(x, op)?;
        let table_n = table_columns(table, op)? as u32;
        let axes = &self.0.axes;
        ensure!(
            (1..=2).contains(&axes.ragged.len()),
            "{op}: one or two ragged axes"
        );
        let shape = x.shape();
        ensure!(
            shape[axes.batch] as u32 == table_n,
            "{op}: {} samples, {table_n} widths",
            shape[axes.batch]
        );
        ensure!(
            x.len() <= i32::MAX as usize,
            "{op}: {} elements, the kernel addresses at most 2^31 - 1",
            x.len()
        );
        let dt = x.datum_type();
        let size = dt.size_of();
        super::element_size_kernel("ragged_mask", dt, op)?;
        // The fill's bytes, zero-extended: the kernel keeps the low `size` bytes.
        let mut fill_bytes = [0u8; 8];
        fill_bytes[..size].copy_from_slice(self.0.fill.as_bytes());
        let fill = u64::from_le_bytes(fill_bytes);
        let output = make_tensor_for_node(ctx, x.datum_type(), shape)?;
        let tensors = [x, &output, table];
        if let [ragged] = &*axes.ragged
            && axes.batch < ragged.axis
        {
            let rows = shape[..ragged.axis].iter().product::<usize>() as u32;
            let inner = shape[ragged.axis + 1..].iter().product::<usize>() as u32;
            let geom = MaskRowsGeom {
                rows,
                row_len: shape[ragged.axis] as u32 * inner,
                inner,
                rows_per_sample: shape[axes.batch + 1..ragged.axis].iter().product::<usize>()
                    as u32,
                batch_dim: shape[axes.batch] as u32,
                table_n,
                row: ragged.row as i32,
                fill,
            };
            let block = 128u32;
            let cfg = LaunchConfig {
                grid_dim: (
                    geom.row_len.div_ceil(block).clamp(1, 1024),
                    rows.clamp(1, 65535),
                    1,
                ),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            };
            let name = super::element_size_kernel("ragged_mask_rows", dt, op)?;
            // SAFETY: ragged_mask_rows_b{size}(x, y, table, MaskRowsGeom): x and y hold
            // rows x row_len elements of `size` bytes, the table [K, table_n] i64 with
            // `row` < K (the transform made the table for this model).
            unsafe { launch(&KERNELS, &name, cfg, &tensors, &geom) }?;
        } else {
            let stride_dim = |axis: usize| {
                (
                    shape[axis + 1..].iter().product::<usize>() as u32,
                    shape[axis] as u32,
                )
            };
            let (batch_stride, batch_dim) = stride_dim(axes.batch);
            let (r0_stride, r0_dim) = stride_dim(axes.ragged[0].axis);
            let (r1_stride, r1_dim, r1_row) = match axes.ragged.get(1) {
                Some(r) => {
                    let (s, d) = stride_dim(r.axis);
                    (s, d, r.row as i32)
                }
                None => (1, 1, -1),
            };
            let geom = MaskGeom {
                total: x.len() as u32,
                table_n,
                batch_stride,
                batch_dim,
                r0_stride,
                r0_dim,
                r0_row: axes.ragged[0].row as i32,
                r1_stride,
                r1_dim,
                r1_row,
                fill,
            };
            let name = super::element_size_kernel("ragged_mask", dt, op)?;
            // SAFETY: ragged_mask_b{size}(x, y, table, MaskGeom): x and y hold `total`
            // elements of `size` bytes, the table [K, table_n] i64 with both rows < K.
            unsafe { launch(&KERNELS, &name, grid_over(x.len()), &tensors, &geom) }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaMask {
    /// The host op's (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(inputs, |f| Ok(f.shape.clone()))
    }

    as_op!();
}
