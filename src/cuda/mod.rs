//! `ragged-cuda`: a tract runtime running ragged models (and plain ones) on CUDA.
//!
//! It is tract-cuda's runtime plus what tract-cuda lacks: our ragged ops and pooling on
//! the device. The pipeline, in [`RaggedCudaRuntime::translate`]:
//!
//! 1. [`conv_routing`] marks the convolutions we run ourselves (1x1 as cuBLAS GEMMs on NCHW,
//!    depthwise on our kernel, the rest through cuDNN with f32 kept off TF32),
//!    [`integers`] computes as `i64` the integers tract computes as `TDim` (position
//!    arithmetic), [`expand`] writes the element-wise ops tract-cuda lacks (an exact
//!    GELU, a constant power, `IsNan`, integer negations, absolute values and signs) as
//!    ops it has, and [`quantized`] the integer products of quantized models
//!    (`MatMulInteger`) as products over `i32`, which [`ops::integer_matmul`] runs, and
//!    their dequantizations as float tables and arithmetic;
//! 2. tract-cuda's `CudaTransform` translates what it knows, leaving the rest on the host
//!    between `DeviceSync`s;
//! 3. [`islands`] puts those host nodes on the device as our ops ([`ops`], one per file,
//!    registered in [`ops::TRANSLATORS`]), and refuses a ragged op left on the host;
//! 4. [`fusion`] runs chains of element-wise ops as one generated kernel each.
//!
//! The plan it prepares is a [`graph::CudaPlan`]: states kept per thread, repeated batch
//! shapes replayed as CUDA graphs. Its backend ([`backend::CudaBackend`]: pinned
//! transfers, device memory, the device profiler, out of memory recognised) is found from
//! that plan's type. Width arithmetic stays on the host: the widths table is computed there
//! from the widths input and uploaded once per run. Knobs: [`knobs`].
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

use crate::timeline::{self, Phase};

pub mod abi;
pub mod backend;
pub mod conv_routing;
pub mod cudnn_rnn;
pub mod expand;
pub mod fastdiv;
pub mod fusion;
pub mod graph;
pub mod integers;
pub mod islands;
pub mod knobs;
pub mod launch;
pub mod memory_pool;
pub mod nvrtc;
pub mod op_states;
pub mod ops;
pub mod quantized;
pub mod restage;
pub mod transfer;

pub use islands::{check_no_host_island, host_nodes, translate_islands};

/// The runtime registered as `ragged-cuda`.
#[derive(Debug)]
pub struct RaggedCudaRuntime;

impl RaggedCudaRuntime {
    /// The model as ragged-cuda runs it, before the plan: tract-cuda's translation, then
    /// ours, element-wise chains fused unless `TRACT_RAGGED_FUSE` is off. For inspecting
    /// plans (tests count host nodes and syncs).
    pub fn translate(&self, model: TypedModel) -> TractResult<TypedModel> {
        self.translate_with(model, knobs::TRACT_RAGGED_FUSE.get())
    }

    /// [`Self::translate`], element-wise chains fused or not.
    pub fn translate_with(&self, model: TypedModel, fuse: bool) -> TractResult<TypedModel> {
        // Constants go to the device, kernels are compiled and loaded: no graph capture
        // meanwhile.
        graph::quiet(|| self.translate_quietly(model, fuse))
    }

    fn translate_quietly(&self, mut model: TypedModel, fuse: bool) -> TractResult<TypedModel> {
        self.check()?;
        let n = batch_size(&model);
        let mut model = timeline::phase(Phase::Convert, n, &[], || -> TractResult<_> {
            conv_routing::mark_convs(&mut model, knobs::TRACT_RAGGED_CUBLAS.get())?;
            integers::dims_as_i64(&mut model)?;
            expand::element_wise_for_the_device(&mut model)?;
            quantized::quantized_for_the_device(&mut model)?;
            CudaTransform.transform(&mut model)?;
            let model = translate_islands(&model)?;
            check_no_host_island(&model)?;
            Ok(model)
        })?;
        timeline::phase(Phase::Optimize, n, &[], || model.optimize())?;
        if fuse {
            timeline::phase(Phase::Fuse, n, &[], || fusion::fuse(&mut model))?;
        }
        if knobs::TRACT_RAGGED_DEVICE_ONLY.get() {
            let host = host_nodes(&model)?;
            ensure!(
                host.is_empty(),
                "ragged-cuda: {} nodes would run on the host between the syncs \
                 (TRACT_RAGGED_DEVICE_ONLY): {}",
                host.len(),
                host.join(", ")
            );
        }
        Ok(model)
    }

    /// The plan of a model [`Self::translate`] gave.
    pub fn prepare_translated(
        &self,
        model: TypedModel,
        options: &RunOptions,
    ) -> TractResult<Box<dyn Runnable>> {
        memory_pool::keep_freed_memory();
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
        let n = batch_size(&model);
        let model = timeline::phase(Phase::Translate, n, &[], || self.translate(model))?;
        timeline::phase(Phase::Build, n, &[], || {
            self.prepare_translated(model, options)
        })
    }

    fn check(&self) -> TractResult<()> {
        tract_cuda::utils::ensure_cuda_runtime_dependencies(
            "ragged-cuda needs a CUDA driver, cuBLAS, cuDNN and NVRTC",
        )
    }
}

/// The batch size, to label the timeline's spans (the ragged extents are the scheduler's
/// to say: the span of the whole preparation has them).
fn batch_size(model: &TypedModel) -> usize {
    model
        .input_fact(0)
        .ok()
        .and_then(|f| f.shape.first().and_then(|d| d.to_usize().ok()))
        .unwrap_or(0)
}

register_runtime!(RaggedCudaRuntime = RaggedCudaRuntime);

/// Keeps this module's registration, and the backend's, in a binary that links
/// tract-ragged without calling it otherwise ([`crate::link`]).
#[inline(never)]
pub(crate) fn linked() -> &'static str {
    std::hint::black_box(backend::linked());
    std::hint::black_box("ragged-cuda")
}
