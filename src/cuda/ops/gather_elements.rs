//! tract's `GatherElements` on the device (`kernels/gather_elements.cu`): for every
//! coordinate of the indices, the data at that coordinate with the axis' coordinate
//! replaced by the index there. Exporters write one for RoBERTa's token types (a buffer
//! read at each token's position id) and DeBERTa's relative positions (attention scores
//! gathered at each pair's relative distance), and tract-cuda has no kernel for it: it
//! stayed on the host between two syncs. Moves bits: one kernel per element size and
//! index type (i32, i64); ranks up to 6.
//!
//! An index outside the axis gives 0 on the device, where tract's host kernel fails: a
//! kernel cannot raise an error without the host waiting for it. The indices the exports
//! compute (positions, clamped distances) are within the axis.

use tract_core::internal::*;
use tract_core::ops::array::GatherElements;
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;

use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, grid_over, launch};
use crate::cuda::nvrtc::KernelFile;
use tract_gpu::utils::facts_to_device_facts;

use super::DeviceOp;

/// The largest rank the kernel takes.
const RANK: usize = 6;

crate::kernel_args! {
    /// The output's element count, the gathered axis and the data's extent along it, the
    /// output's (the indices') shape and the data's strides, each padded with leading
    /// ones (and zeros) to `RANK` (6) axes.
    pub struct GatherElementsGeom {
        total: i64,
        axis: i64,
        axis_dim: i64,
        out_dims: [i64; 6],
        data_strides: [i64; 6],
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "gather_elements",
    source: include_str!("../../../kernels/gather_elements.cu"),
    args: GatherElementsGeom::declaration,
};

/// [`GatherElements`] on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaGatherElements(pub GatherElements);

/// The kernel for data of `dt` and indices of `index`.
fn kernel(dt: DatumType, index: DatumType, what: &str) -> TractResult<String> {
    let prefix = match index {
        DatumType::I64 => "gather_elements_i64",
        DatumType::I32 => "gather_elements_i32",
        _ => bail!("ragged-cuda: {what} with indices of {index:?} is not supported"),
    };
    super::element_size_kernel(prefix, dt, what)
}

/// tract's `GatherElements` of data of 1, 2, 4 or 8 bytes, of rank up to 6. Its indices
/// are i32 or i64, the two types ONNX allows (and `TDim` index arithmetic is `i64` on the
/// device: [`crate::cuda::integers`]); the kernel's launch checks them.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<GatherElements>() else {
        return Ok(None);
    };
    if ![1, 2, 4, 8].contains(&dt.size_of()) {
        return Ok(None);
    }
    Ok(Some(Box::new(CudaGatherElements(op.clone()))))
}

device_op!(CudaGatherElements);

impl DeviceOp for CudaGatherElements {
    const NAME: &'static str = "CudaGatherElements";

    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![format!("axis: {}", self.0.axis)])
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let (data, indices) = args_2!(inputs);
        let (data, indices) = (data.to_device_tensor()?, indices.to_device_tensor()?);
        contiguous(data, op)?;
        contiguous(indices, op)?;
        let axis = self.0.axis;
        let rank = data.rank();
        ensure!(
            rank == indices.rank() && axis < rank && rank <= RANK,
            "{op}: data {:?} and indices {:?} along axis {axis} (same ranks, up to {RANK})",
            data.shape(),
            indices.shape()
        );
        for d in (0..rank).filter(|d| *d != axis) {
            ensure!(
                indices.shape()[d] <= data.shape()[d],
                "{op}: indices {:?} larger than data {:?} off axis {axis}",
                indices.shape(),
                data.shape()
            );
        }
        let name = kernel(data.datum_type(), indices.datum_type(), op)?;
        let output = make_tensor_for_node(ctx, data.datum_type(), indices.shape())?;
        let total = indices.len();
        if total > 0 {
            let pad = RANK - rank;
            let strides = Tensor::natural_strides(data.shape());
            let mut geom = GatherElementsGeom {
                total: total as i64,
                axis: (axis + pad) as i64,
                axis_dim: data.shape()[axis] as i64,
                out_dims: [1; RANK],
                data_strides: [0; RANK],
            };
            for d in 0..rank {
                geom.out_dims[pad + d] = indices.shape()[d] as i64;
                geom.data_strides[pad + d] = strides[d] as i64;
            }
            // SAFETY: gather_elements_I_bK(data, indices, y, GatherElementsGeom): y and
            // indices hold `total` elements (y of the data's K bytes, indices of I); each
            // output coordinate is below the indices' shape, itself at most the data's off
            // the axis (checked above), and the index read is used only within
            // [0, axis_dim): every data offset is within the data.
            unsafe {
                launch(
                    &KERNELS,
                    &name,
                    grid_over(total),
                    &[data, indices, &output],
                    &geom,
                )
            }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaGatherElements {
    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| self.0.output_facts(facts))
    }

    as_op!();
}
