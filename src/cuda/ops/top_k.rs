//! [`TopK`] on the device, f32: one warp per row (`kernels/top_k.cu`), the same picks as
//! the CPU's. Only the reduced outputs cross back to the host.

use cudarc::driver::LaunchConfig;
use tract_core::internal::*;
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node_output;
use tract_gpu::utils::facts_to_device_facts;

use super::f32_only;
use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, launch};
use crate::cuda::nvrtc::KernelFile;
use crate::ops::TopK;

use super::DeviceOp;

crate::kernel_args! {
    /// `rows` rows of `classes` values, the top `k` of each.
    pub struct TopKGeom {
        rows: i64,
        classes: i64,
        k: i64,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "top_k",
    source: include_str!("../../../kernels/top_k.cu"),
    args: TopKGeom::declaration,
};

/// [`TopK`] on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaTopK(pub TopK);

/// Our top k, f32.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<TopK>() else {
        return Ok(None);
    };
    f32_only(dt, "the top k of an output")?;
    Ok(Some(Box::new(CudaTopK(op.clone()))))
}

device_op!(CudaTopK);

impl DeviceOp for CudaTopK {
    const NAME: &'static str = "CudaRaggedTopK";

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let x = args_1!(inputs);
        let x = x.to_device_tensor()?;
        contiguous(x, op)?;
        f32_only(x.datum_type(), op)?;
        let shape = x.shape();
        let classes = *shape.last().context("{op}: a scalar input")?;
        let rows = x.len() / classes.max(1);
        let mut out_shape: TVec<usize> = shape.into();
        *out_shape.last_mut().context("scalar")? = self.0.k;
        let values = make_tensor_for_node_output(ctx, 0, f32::datum_type(), &out_shape)?;
        let positions = make_tensor_for_node_output(ctx, 1, i64::datum_type(), &out_shape)?;
        if rows > 0 && self.0.k > 0 {
            let warps_per_block = 8usize;
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(warps_per_block) as u32, 1, 1),
                block_dim: (32 * warps_per_block as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let geom = TopKGeom {
                rows: rows as i64,
                classes: classes as i64,
                k: self.0.k as i64,
            };
            // SAFETY: ragged_top_k_f32(x, values, positions, TopKGeom): x holds rows x
            // classes f32, values and positions rows x k f32 and i64; one warp per row,
            // whole warps past the last row leave.
            unsafe {
                launch(
                    &KERNELS,
                    "ragged_top_k_f32",
                    cfg,
                    &[x, &values, &positions],
                    &geom,
                )
            }?;
        }
        Ok(tvec!(
            values.into_tensor().into_tvalue(),
            positions.into_tensor().into_tvalue()
        ))
    }
}

impl TypedOp for CudaTopK {
    /// The host op's (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        facts_to_device_facts(inputs, |facts| self.0.output_facts(facts))
    }

    as_op!();
}
