//! The CUDA ops of ragged-cuda, one per file, and the one list that registers them.
//!
//! tract-cuda translates the ops it knows and leaves the rest on the host; the island pass
//! ([`super::islands`]) offers each node left there to every entry of [`TRANSLATORS`],
//! and the first that returns an op puts it on the device. Adding a CUDA op is one file
//! here (its op as a [`DeviceOp`] with its name and launch, `device_op!` for tract's
//! traits, its `TypedOp` facts, its `translate`, its kernel file declared with
//! [`super::nvrtc::KernelFile`]) and one line in [`TRANSLATORS`].
//!
//! What the ops share:
//! - they read and write contiguous device tensors allocated by tract-gpu's turn handler
//!   (`make_tensor_for_node`), so that they live in the plan's arena like tract-cuda's;
//! - the ragged ones read the widths table from the device: it is uploaded once per run,
//!   right after the host computes it, and every op picks its rows there;
//! - they launch on this thread's tract-cuda stream through [`super::launch`].

use tract_core::internal::*;

use super::nvrtc::KernelFile;

/// What a CUDA op of ours is beside its facts: its name, written once (plans, profiles and
/// its errors say it), what dumps show of it, and its evaluation. `device_op!` writes
/// tract's `Op` and `EvalOp` from it, so an op's file holds its translation, this, its
/// `TypedOp` (output facts and cost) and its kernel.
pub trait DeviceOp {
    /// The op's name, and the prefix of its errors.
    const NAME: &'static str;

    /// Whether evaluating needs the plan around the node (scratch kept per session and
    /// node, as cuDNN's descriptors are): then there is no evaluation out of a plan.
    const NEEDS_PLAN: bool = false;

    /// The name in plans and profiles, where it says more than [`Self::NAME`] (the pooling
    /// kind, the recurrence's cell).
    fn name(&self) -> StaticName {
        Self::NAME.into()
    }

    /// One-line hints for dumps.
    fn info(&self) -> TractResult<Vec<String>> {
        Ok(vec![])
    }

    /// Evaluates the op on device tensors, on this thread's stream.
    fn run(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>>;

    /// Releases what the op keeps for `session` at `node_id` (see [`Self::NEEDS_PLAN`]).
    fn drop_session(&self, _session: SessionId, _node_id: usize) {}
}

/// tract's `Op` and `EvalOp` for a [`DeviceOp`].
macro_rules! device_op {
    ($op:ty) => {
        impl Op for $op {
            fn name(&self) -> StaticName {
                $crate::cuda::ops::DeviceOp::name(self)
            }

            fn info(&self) -> TractResult<Vec<String>> {
                $crate::cuda::ops::DeviceOp::info(self)
            }

            op_as_typed_op!();
        }

        impl EvalOp for $op {
            fn eval(&self, ctx: &EvalContext, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
                $crate::cuda::ops::DeviceOp::run(self, ctx, inputs)
            }

            fn eval_out_of_plan(&self, inputs: TVec<TValue>) -> TractResult<Option<TVec<TValue>>> {
                if <$op as $crate::cuda::ops::DeviceOp>::NEEDS_PLAN {
                    return Ok(None);
                }
                let ctx = EvalContext::out_of_plan();
                Ok(Some($crate::cuda::ops::DeviceOp::run(self, &ctx, inputs)?))
            }

            fn drop_session(&self, session: SessionId, node_id: usize) {
                $crate::cuda::ops::DeviceOp::drop_session(self, session, node_id)
            }
        }
    };
}

pub mod cudnn_conv;
pub mod cumsum;
pub mod deconv;
pub mod depthwise;
pub mod downsample;
pub mod edge;
pub mod fused_elementwise;
pub mod gather_elements;
pub mod integer_matmul;
pub mod mask;
pub mod pad;
pub mod pointwise;
pub mod pooling;
pub mod recurrence;
pub mod resample;
pub mod resize;
pub mod softmax;
pub mod top_k;

/// Frees this thread's op states of sessions ended on other threads
/// ([`super::op_states`]): every op kind that keeps states per thread, once. Frees device
/// memory: called before a plain run, never within a capture.
pub(crate) fn sweep_op_states() {
    cudnn_conv::sweep();
    recurrence::sweep();
    resize::sweep();
}

pub use cudnn_conv::CudaCudnnConv;
pub use cumsum::CudaCumSum;
pub use deconv::CudaDeconv;
pub use depthwise::CudaDepthwise;
pub use edge::CudaEdgeFill;
pub use fused_elementwise::CudaFusedElementwise;
pub use gather_elements::CudaGatherElements;
pub use integer_matmul::CudaIntegerMatMul;
pub use mask::CudaMask;
pub use pad::CudaPad;
pub use pointwise::CudaPointwise;
pub use pooling::{CudaPool, PoolKind};
pub use recurrence::CudaRecurrence;
pub use resample::CudaSampleResample;
pub use resize::CudaResize;
pub use softmax::CudaMaskedSoftmax;
pub use top_k::CudaTopK;

/// The CUDA op for a node tract-cuda left on the host (all its inputs of `dt`, a type the
/// device holds), `None` when this file does not handle it; an error for one of our
/// ragged ops that cannot go to the device (it would silently run on the host).
pub type Translator = fn(node: &TypedNode, dt: DatumType) -> TractResult<Option<Box<dyn TypedOp>>>;

/// Every CUDA op of ours, tried in order.
pub const TRANSLATORS: &[Translator] = &[
    mask::translate,
    softmax::translate,
    pooling::translate,
    pointwise::translate,
    depthwise::translate,
    cudnn_conv::translate,
    deconv::translate,
    recurrence::translate,
    edge::translate,
    pad::translate,
    resize::translate,
    top_k::translate,
    resample::translate,
    downsample::translate,
    cumsum::translate,
    gather_elements::translate,
    integer_matmul::translate,
];

/// Every kernel file of ours, each declared by the op that launches it: what the tests
/// compile and load whole.
pub static KERNEL_FILES: &[&KernelFile] = &[
    &mask::KERNELS,
    &softmax::KERNELS,
    &pooling::KERNELS,
    &deconv::KERNELS,
    &depthwise::KERNELS,
    &recurrence::KERNELS,
    &edge::KERNELS,
    &pad::KERNELS,
    &resize::KERNELS,
    &resample::KERNELS,
    &top_k::KERNELS,
    &downsample::KERNELS,
    &cumsum::KERNELS,
    &gather_elements::KERNELS,
    &integer_matmul::KERNELS,
];

/// The inputs of the host node (their slots) that a CUDA op also reads on the host,
/// appended after its device inputs: what it needs before it launches anything (a
/// recurrence's lengths, for cuDNN's descriptors; a resize's scales or sizes, for its
/// plans).
pub fn host_inputs(op: &dyn TypedOp) -> TVec<usize> {
    if let Some(r) = op.downcast_ref::<CudaRecurrence>() {
        return r.host_inputs();
    }
    op.downcast_ref::<CudaResize>()
        .map(|r| r.host_slots())
        .unwrap_or_default()
}

/// Fails unless `dt` is f32: what the kernels that have no f16 version compute in.
pub(crate) fn f32_only(dt: DatumType, what: &str) -> TractResult<()> {
    ensure!(
        dt == f32::datum_type(),
        "ragged-cuda: {what} on {dt:?} is not supported (f32 only)"
    );
    Ok(())
}

/// Kernel `{name}_bK` for elements of `dt`, K its size in bytes, as `FOR_EACH_ELEMENT_SIZE`
/// (kernels/common.cuh) names the kernels that move bits; an error naming `what` for a
/// size it has none for (1, 2, 4 and 8 bytes).
pub(crate) fn element_size_kernel(name: &str, dt: DatumType, what: &str) -> TractResult<String> {
    let size = dt.size_of();
    ensure!(
        [1, 2, 4, 8].contains(&size),
        "ragged-cuda: {what} on {dt:?} (elements of {size} bytes) is not supported"
    );
    Ok(format!("{name}_b{size}"))
}

/// The suffix of the kernel for elements of `dt`: `f32`, or `f16` (read and written as
/// f16, computed in f32: `kernels/common.cuh`); an error naming `what` for another type.
pub(crate) fn float_kernel(dt: DatumType, what: &str) -> TractResult<&'static str> {
    match dt {
        DatumType::F32 => Ok("f32"),
        DatumType::F16 => Ok("f16"),
        _ => bail!("ragged-cuda: {what} on {dt:?} is not supported (f32 and f16 only)"),
    }
}

/// Whether our f32-or-f16 kernels take elements of `dt`.
pub(crate) fn is_float_kernel_type(dt: DatumType) -> bool {
    dt == DatumType::F32 || dt == DatumType::F16
}
