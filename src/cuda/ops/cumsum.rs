//! tract's `CumSum` on the device (`kernels/cumsum.cu`): running sums along one axis,
//! forwards or backwards, inclusive or exclusive. Exporters write one for position ids
//! (RoBERTa's, XLM-R's and MPNet's: a cumulative sum of the attention mask), and
//! tract-cuda has no kernel for it: it stayed on the host between two syncs. On i32, i64
//! and f32, the floats added in the order tract's host kernel adds them: the same bits.

use tract_core::internal::*;
use tract_core::ops::array::CumSum;
use tract_gpu::tensor::DeviceTensorExt;
use tract_gpu::turn_handler::make_tensor_for_node;

use crate::cuda::abi::KernelArgs;
use crate::cuda::launch::{contiguous, device_facts, grid_over, launch};
use crate::cuda::nvrtc::KernelFile;

use super::DeviceOp;

crate::kernel_args! {
    /// A contiguous tensor as `[outer, len, inner]`: its count of lines (`outer * inner`),
    /// the extent of the summed axis, the product of the axes after it, and the direction
    /// and kind of the sums (0 or 1).
    pub struct CumSumGeom {
        lines: i64,
        len: i64,
        inner: i64,
        reverse: i64,
        exclusive: i64,
    }
}

/// The kernel file of this op.
pub static KERNELS: KernelFile = KernelFile {
    name: "cumsum",
    source: include_str!("../../../kernels/cumsum.cu"),
    args: CumSumGeom::declaration,
};

/// [`CumSum`] on the device (module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CudaCumSum(pub CumSum);

/// The kernel for elements of `dt`, if there is one.
fn kernel(dt: DatumType) -> Option<&'static str> {
    match dt {
        DatumType::I32 => Some("cumsum_i32"),
        DatumType::I64 => Some("cumsum_i64"),
        DatumType::F32 => Some("cumsum_f32"),
        _ => None,
    }
}

/// tract's cumulative sums of i32, i64 and f32.
pub fn translate(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>> {
    let Some(op) = node.op_as::<CumSum>() else {
        return Ok(None);
    };
    if kernel(dt).is_none() {
        return Ok(None);
    }
    Ok(Some(Box::new(CudaCumSum(op.clone()))))
}

device_op!(CudaCumSum);

impl DeviceOp for CudaCumSum {
    const NAME: &'static str = "CudaCumSum";

    fn info(&self) -> TractResult<Vec<String>> {
        self.0.info()
    }

    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let op = Self::NAME;
        let x = args_1!(inputs);
        let x = x.to_device_tensor()?;
        contiguous(x, op)?;
        let shape = x.shape();
        let axis = self.0.axis;
        ensure!(
            axis < shape.len(),
            "{op}: axis {axis} of a tensor of rank {}",
            shape.len()
        );
        let name = kernel(x.datum_type())
            .with_context(|| format!("{op}: no kernel for {:?}", x.datum_type()))?;
        let output = make_tensor_for_node(ctx, x.datum_type(), shape)?;
        let len = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let lines = shape.iter().product::<usize>() / len.max(1);
        if len > 0 && lines > 0 {
            let geom = CumSumGeom {
                lines: lines as i64,
                len: len as i64,
                inner: inner as i64,
                reverse: self.0.reverse as i64,
                exclusive: self.0.exclusive as i64,
            };
            // SAFETY: cumsum_T(x, y, CumSumGeom): x and y hold `lines * len` elements of T
            // (the kernel's type is the tensors'); line l reads and writes positions
            // (l / inner) * len * inner + l % inner + k * inner for k < len, below
            // outer * len * inner = the element count.
            unsafe { launch(&KERNELS, name, grid_over(lines), &[x, &output], &geom) }?;
        }
        Ok(tvec!(output.into_tensor().into_tvalue()))
    }
}

impl TypedOp for CudaCumSum {
    /// The host op's (its input facts hold the logical shapes).
    fn cost(&self, inputs: &[&TypedFact]) -> TractResult<TVec<(Cost, TDim)>> {
        self.0.cost(inputs)
    }

    fn output_facts(&self, inputs: &[&TypedFact]) -> TractResult<TVec<TypedFact>> {
        device_facts(inputs, |f| Ok(f.shape.clone()))
    }

    as_op!();
}
