//! `ragged-cuda`: a tract runtime running ragged models (and plain ones) on CUDA.
//!
//! It is tract-cuda's runtime plus what tract-cuda lacks: our ragged ops and pooling on
//! the device. tract-cuda's `CudaTransform` translates the model first, leaving what it
//! does not know on the host between `DeviceSync`s; [`islands`] then puts those nodes on
//! the device with our kernels (`kernels/*.cu`); [`fuse`] runs chains of element-wise
//! ops as one generated kernel each. Before tract-cuda's transform, [`convs`] marks
//! the 1x1 convolutions for cuBLAS, on NCHW as they lie. Width arithmetic stays on the host: the
//! widths table is computed there from the widths input and uploaded once per run. The
//! plan it prepares is a [`graph::CudaPlan`]: states kept per thread, repeated batch
//! shapes replayed as CUDA graphs.
//!
//! Only one CUDA backend can own tract-gpu's device context in a process, so ragged-cuda
//! sits on tract-cuda's context and its per-thread stream (`tract_cuda::with_cuda_stream`).
//!
//! Registered with tract's `register_runtime!` as `ragged-cuda`:
//! `tract_core::runtime::runtime_for_name("ragged-cuda")` finds it whenever the `cuda`
//! feature is on; its `check` fails on a machine without a usable CUDA driver.

use tract_core::internal::*;
use tract_core::transform::ModelTransform;
use tract_cuda::CudaTransform;
use tract_gpu::turn_handler::DeviceTurnHandler;

pub mod convs;
pub mod fuse;
pub mod graph;
pub mod islands;
pub mod kernels;
pub mod ops;
pub mod transfer;

pub use islands::{check_no_host_island, host_nodes, translate_islands};

/// The runtime registered as `ragged-cuda`.
#[derive(Debug)]
pub struct RaggedCudaRuntime;

/// Keeps cuBLAS and cuDNN off TF32 for f32 work, unless the user opted in with
/// `TRACT_RAGGED_TF32=1`.
///
/// On Ampere and later, cuDNN's default math mode lets an f32 convolution run on TF32
/// tensor cores: 10 bits of mantissa, a relative error near 1e-3, far from what the
/// exactness contract promises (measured on PP-OCRv4 rec on an H200: 1.5e-4 on the
/// probabilities against the CPU). `NVIDIA_TF32_OVERRIDE=0` is the switch both libraries
/// read when their handles are created, so it must be set before tract-cuda creates its
/// context and its per-thread streams: here, the first time ragged-cuda is asked for.
fn keep_f32_off_tf32() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let opt_in = std::env::var("TRACT_RAGGED_TF32").is_ok_and(|v| v == "1");
        if !opt_in && std::env::var_os("NVIDIA_TF32_OVERRIDE").is_none() {
            // SAFETY: called once, before any CUDA library is loaded by this runtime;
            // nothing else in this crate reads or writes the environment concurrently.
            unsafe { std::env::set_var("NVIDIA_TF32_OVERRIDE", "0") };
        }
    });
}

impl RaggedCudaRuntime {
    /// The model as ragged-cuda runs it, before the plan: tract-cuda's translation, then
    /// ours, element-wise chains fused (unless `TRACT_RAGGED_FUSE=0`). For inspecting
    /// plans (tests count host nodes and syncs).
    pub fn translate(&self, model: TypedModel) -> TractResult<TypedModel> {
        let fuse = !std::env::var("TRACT_RAGGED_FUSE").is_ok_and(|v| v == "0");
        self.translate_with(model, fuse)
    }

    /// [`Self::translate`], element-wise chains fused or not.
    pub fn translate_with(&self, model: TypedModel, fuse: bool) -> TractResult<TypedModel> {
        // Constants go to the device, kernels are compiled and loaded: no graph capture
        // meanwhile.
        graph::quiet(|| self.translate_quietly(model, fuse))
    }

    fn translate_quietly(&self, mut model: TypedModel, fuse: bool) -> TractResult<TypedModel> {
        self.check()?;
        if !std::env::var("TRACT_RAGGED_CUBLAS").is_ok_and(|v| v == "0") {
            convs::mark_convs(&mut model)?;
        }
        CudaTransform.transform(&mut model)?;
        let mut model = translate_islands(&model)?;
        check_no_host_island(&model)?;
        model.optimize()?;
        if fuse {
            fuse::fuse(&mut model)?;
        }
        Ok(model)
    }

    /// The plan of a model [`Self::translate`] gave.
    pub fn prepare_translated(
        &self,
        model: TypedModel,
        options: &RunOptions,
    ) -> TractResult<Box<dyn Runnable>> {
        graph::quiet(|| self.prepare_quietly(model, options))
    }

    fn prepare_quietly(
        &self,
        model: TypedModel,
        options: &RunOptions,
    ) -> TractResult<Box<dyn Runnable>> {
        // Device tensors are allocated by the turn handler's memory schema, in the order
        // the plan runs: the order must not change under it.
        let options = RunOptions {
            skip_order_opt_ram: true,
            ..options.clone()
        };
        let mut plan = TypedSimplePlan::build(model, &options)?;
        if let Some(handler) =
            DeviceTurnHandler::for_plan(&plan, options.memory_sizing_hints.as_ref())?
        {
            plan = plan.with_turn_handler(handler);
        }
        // Constants were uploaded asynchronously on this thread's stream: let them land
        // before other threads' streams read them.
        tract_cuda::with_cuda_stream(|stream| Ok(stream.synchronize()?))?;
        Ok(Box::new(graph::CudaPlan::new(Arc::new(plan))))
    }
}

impl Runtime for RaggedCudaRuntime {
    fn name(&self) -> StaticName {
        "ragged-cuda".into()
    }

    fn prepare_with_options(
        &self,
        model: TypedModel,
        options: &RunOptions,
    ) -> TractResult<Box<dyn Runnable>> {
        let model = self.translate(model)?;
        self.prepare_translated(model, options)
    }

    fn check(&self) -> TractResult<()> {
        keep_f32_off_tf32();
        tract_cuda::utils::ensure_cuda_runtime_dependencies(
            "ragged-cuda needs a CUDA driver, cuBLAS, cuDNN and NVRTC",
        )
    }
}

register_runtime!(RaggedCudaRuntime = RaggedCudaRuntime);
