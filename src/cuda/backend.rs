//! ragged-cuda's backend: batches through pinned staging buffers, the device's free
//! memory as budget, a GPU cost model, batches in flight in lanes (a stream each), node
//! times from CUDA events, and out of memory recognised in the driver's, cuBLAS's and
//! cuDNN's errors.
//!
//! It claims the plans ragged-cuda prepares ([`CudaPlan`]), whichever runtime hands them
//! out (registered with [`crate::backend::BackendProbe`]).

use std::time::{Duration, Instant};

use cudarc::cublas::result::CublasError;
use cudarc::cublas::sys::cublasStatus_t;
use cudarc::cudnn::CudnnError;
use cudarc::cudnn::sys::cudnnStatus_t;
use cudarc::driver::DriverError;
use cudarc::driver::sys::{CUevent_flags, CUresult};
use tract_core::internal::*;

use super::graph::{CudaPlan, quiet};
use super::transfer::PinnedTransfer;
use crate::backend::{Backend, BackendProbe, CostModel, NodeRun, NodeTimes, OutOfMemory, Peaks};
use crate::transform::OutputLayout;

/// Batches in flight at once by default, each lane a thread with its own stream: while
/// one lane's batch computes (in turn: [`Backend::runs_take_turns`]), others pack and
/// upload the next ones and bring the last ones' outputs back and crop them. Measured on
/// the H200 (benches/NOTES.md, medians of 15): 2 lanes are best on the 112 fixture lines
/// (29.0 ms against 30.1 with 4; 27.6 against 28.1 with one allocator arena), but where
/// crops take longer than runs (256 lines of 320 px in batches of 32: 1 MB of
/// probabilities a line) 2 lanes leave the device waiting (52.1 ms against 37.4 with 4).
pub const LANES: usize = 4;

/// ragged-cuda's backend (module doc).
#[derive(Debug, Default)]
pub struct CudaBackend {
    transfer: PinnedTransfer,
}

fn claim(plan: &dyn Runnable) -> Option<Arc<dyn Backend>> {
    plan.downcast_ref::<CudaPlan>()
        .map(|_| Arc::new(CudaBackend::default()) as Arc<dyn Backend>)
}

inventory::submit!(BackendProbe { claim });

/// Keeps this module's registration in a binary that links tract-ragged without calling
/// it otherwise ([`crate::link`]).
#[inline(never)]
pub(crate) fn linked() -> &'static str {
    std::hint::black_box("ragged-cuda backend")
}

/// Whether one cause of an error is an allocation the device or a CUDA library could not
/// make.
fn is_allocation_failure(cause: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(DriverError(code)) = cause.downcast_ref::<DriverError>() {
        return *code == CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    }
    if let Some(CublasError(status)) = cause.downcast_ref::<CublasError>() {
        return *status == cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED;
    }
    if let Some(CudnnError(status)) = cause.downcast_ref::<CudnnError>() {
        return *status == cudnnStatus_t::CUDNN_STATUS_ALLOC_FAILED;
    }
    false
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    /// The other cores (up to the pool's size): a plan costs tens of milliseconds of host
    /// work where a sample alone runs in about one. Sound only with each preparation
    /// wholly within [`quiet`] ([`Backend::preparing`] below): helpers preparing outside
    /// it made graph captures on the caller's thread fail
    /// (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, an H100).
    fn plan_helpers(&self, cores: usize) -> usize {
        cores.saturating_sub(1)
    }

    /// Eight: an H200 served 1908 and 2086 lines/s to 64 and 128 clients with 8 against
    /// 1645 and 226 with 2 (benches/NOTES.md, 2026-12-06): the gatherings were smaller
    /// and met fewer new batch shapes, so fewer plans were prepared under load.
    fn gatherers(&self) -> usize {
        8
    }

    /// Where `TRACT_RAGGED_SYMBOLIC_PLANS` is on: tract-cuda runs its ops at the shapes
    /// their inputs come with, and a plan's translation (about 40 ms of host work for
    /// PP-OCRv4 rec on an H100, preparations of other threads taking turns) is otherwise
    /// paid for each new batch size and width bucket. On by default (benches/NOTES.md,
    /// 2026-12-06).
    fn symbolic_plans(&self) -> bool {
        super::knobs::TRACT_RAGGED_SYMBOLIC_PLANS.get()
    }

    /// Wholly within [`quiet`]: a preparation allocates and frees device memory, and
    /// evicts plans from the cache (freeing their constants); any of it during another
    /// thread's graph capture invalidates the capture and fails the preparation.
    fn preparing(&self, f: &mut dyn FnMut()) {
        quiet(f)
    }

    fn upload(&self, samples: &[&Tensor], axes: &[usize], padded: &[usize]) -> TractResult<TValue> {
        self.transfer.upload(samples, axes, padded)
    }

    fn download(
        &self,
        outputs: &[TValue],
        layouts: &[OutputLayout],
        n: usize,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        self.transfer.download(outputs, layouts, n)
    }

    /// 80% of the device's free memory (the host's rules where it cannot be read).
    fn memory_budget(&self) -> u64 {
        match device_memory() {
            Ok((free, _)) => free / 5 * 4,
            Err(_) => crate::backend::HostBackend.memory_budget(),
        }
    }

    /// Batches of at most 32, each costing its padded cells plus a fixed part fitted to
    /// the batches the runnable runs ([`crate::schedule::fit`]); until there are enough of
    /// them, 65536 cells (a batch's launches and host work on PP-OCRv4 rec on an H200 cost
    /// about as much as that much padding). Without the cap, the 112 fixture lines ran
    /// slower and from run to run less alike (benches/NOTES.md).
    fn cost_model(&self) -> CostModel {
        CostModel {
            max_batch: Some(32),
            batch_overhead: 65536,
            measured: false,
            fitted: true,
        }
    }

    /// `TRACT_RAGGED_LANES`, or [`LANES`].
    fn lanes(&self) -> usize {
        crate::knobs::lanes().unwrap_or(LANES)
    }

    /// Yes: one batch's kernels fill the device; the lanes overlap the bus and the crops
    /// with another lane's run (benches/NOTES.md).
    fn runs_take_turns(&self) -> bool {
        true
    }

    /// Each node's device time between two events recorded on the stream around its
    /// evaluation (so the cuDNN and cuBLAS work it queues counts too, without serialising
    /// the plan), and the host time its evaluation took. A fresh state loads kernels and
    /// makes descriptors: not while another thread captures a graph.
    fn time_nodes(
        &self,
        state: &mut TypedSimpleState,
        inputs: TVec<TValue>,
    ) -> TractResult<NodeTimes> {
        quiet(|| self.time_nodes_quietly(state, inputs))
    }

    /// Synchronises the calling thread's tract-cuda stream.
    fn settle(&self) -> TractResult<()> {
        tract_cuda::with_cuda_stream(|stream| Ok(stream.synchronize()?))
    }

    /// From the device's attributes: memory clock x bus width x 2 (double data rate), and
    /// SMs x f32 lanes per SM (64 on compute capability 7.x and 8.0, 128 after) x clock x 2;
    /// f16 on tensor cores, SMs x dense f16 FMAs per SM and clock (NVIDIA's data sheets:
    /// 512 on 7.x, 8.6 and 8.9, 1024 on 8.0, 2048 on 9.0) x clock x 2, unknown for others.
    fn peaks(&self) -> Option<Peaks> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let attribute = |a: A| -> Option<f64> {
            tract_cuda::with_cuda_stream(|s| Ok(s.context().attribute(a)?))
                .ok()
                .map(|v| v as f64)
        };
        let memory_khz = attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?;
        let bus_bits = attribute(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?;
        let sms = attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let clock_khz = attribute(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?;
        let major = attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let lanes = if major < 8.0 || (major == 8.0 && minor == 0.0) {
            64.0
        } else {
            128.0
        };
        let tensor_fmas = match (major as u32, minor as u32) {
            (7, _) | (8, 6) | (8, 9) => Some(512.0),
            (8, 0) => Some(1024.0),
            (9, 0) => Some(2048.0),
            _ => None,
        };
        Some(Peaks {
            bytes_per_s: memory_khz * 1e3 * 2.0 * bus_bits / 8.0,
            flops_per_s: sms * lanes * clock_khz * 1e3 * 2.0,
            half_flops_per_s: tensor_fmas.map(|f| sms * f * clock_khz * 1e3 * 2.0),
            source: "the device's attributes",
        })
    }

    /// Out of memory in the chain, or an allocation the driver, cuBLAS or cuDNN could not
    /// make: then the memory pool's spare memory goes back to the driver too
    /// ([`super::memory_pool::release_spare`]), for the smaller batches' allocations outside it.
    fn is_transient(&self, error: &TractError) -> bool {
        super::graph::capture_invalidated(error)
    }

    fn is_out_of_memory(&self, error: &TractError) -> bool {
        let out = OutOfMemory::in_chain(error) || error.chain().any(is_allocation_failure);
        if out {
            let _ = super::memory_pool::release_spare();
        }
        out
    }
}

impl CudaBackend {
    fn time_nodes_quietly(
        &self,
        state: &mut TypedSimpleState,
        inputs: TVec<TValue>,
    ) -> TractResult<NodeTimes> {
        let mut events = vec![];
        let mut arena = false;
        // The arena tract-gpu's session handler allocates for this plan: its memory schema,
        // the plan being concrete.
        let arena_bytes = {
            let plan = state.plan();
            let none = SymbolValues::default();
            tract_gpu::memory::DeviceMemSchema::build(
                plan.model(),
                plan.order_without_consts(),
                &none,
            )
            .and_then(|schema| schema.eval_memory_size(&none))
            .ok()
            .map(|b| b.max(0) as u64)
        };
        let outputs = tract_cuda::with_cuda_stream(|stream| {
            let outputs = state.run_plan_with_eval(
                inputs,
                |turn, node_state, node, input| -> TractResult<_> {
                    arena |= turn
                        .shared
                        .is_some_and(|s| s.get::<tract_gpu::memory::DeviceMemoryPool>().is_some());
                    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
                    let start = stream.record_event(flags)?;
                    let host = Instant::now();
                    let res = tract_core::plan::eval(turn, node_state, node, input);
                    let host = host.elapsed();
                    let end = stream.record_event(flags)?;
                    events.push((node.id, start, end, host));
                    res
                },
            )?;
            stream.synchronize()?;
            Ok(outputs)
        })?;
        let nodes = events
            .into_iter()
            .map(|(node, start, end, host)| {
                Ok(NodeRun {
                    node,
                    time: Duration::from_secs_f64(start.elapsed_ms(&end)? as f64 / 1e3),
                    host,
                })
            })
            .collect::<TractResult<_>>()?;
        Ok(NodeTimes {
            nodes,
            device: true,
            arena,
            arena_bytes: arena.then_some(arena_bytes).flatten(),
            outputs,
        })
    }
}

/// The device's free and total memory, in bytes; free counts what the memory pool keeps
/// unused for the next allocations ([`super::memory_pool`]).
pub fn device_memory() -> TractResult<(u64, u64)> {
    // A device-wide query: not while another thread captures a graph.
    let (free, total, spare) = quiet(|| {
        let (free, total) = tract_cuda::with_cuda_stream(|s| Ok(s.context().mem_get_info()?))?;
        TractResult::Ok((free as u64, total as u64, super::memory_pool::spare()))
    })?;
    Ok((free.saturating_add(spare).min(total), total))
}
