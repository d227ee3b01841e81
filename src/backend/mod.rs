//! The backend seam: what running ragged batches needs from the machine a plan runs on,
//! beyond what tract's `Runnable` gives.
//!
//! tract prepares a model on a runtime and runs it; it does not say how a batch should
//! reach the plan, how much memory a batch may take, what a batch costs, how to time a
//! node, or which error means "this batch did not fit". Those differ between the host and
//! a GPU, and they decide both speed (pinned transfers, batch sizes) and behaviour (a
//! batch out of device memory is split and retried, an other error is reported). A
//! [`Backend`] answers them; the core modules ([`crate::runnable`], [`crate::schedule`],
//! [`crate::profile`]) ask it and never look at which runtime they are on.
//!
//! The backend of a runtime is found **by the type of the plans it prepares**, not by its
//! name: `for_runtime` prepares a one-node probe model and asks every registered
//! [`BackendProbe`] whether it recognises the plan. So a runtime that wraps another
//! (renamed, instrumented) gets the wrapped runtime's backend as long as it hands out the
//! wrapped runtime's plans. Plans nobody claims run on the [`HostBackend`]: tensors on the
//! host, which every tract runtime accepts. A backend is registered with
//! `inventory::submit!(BackendProbe { claim: ... })` next to its runtime (ragged-cuda's is
//! in `crate::cuda::backend`), or given explicitly with
//! [`crate::RaggedModel::into_runnable_on`].
//!
//! Out of memory is a type, [`OutOfMemory`], that a backend puts in the error chain where
//! its runtime runs out; the scheduler splits a batch on [`Backend::is_out_of_memory`],
//! never on an error's text; a batch whose failure the backend calls transient
//! ([`Backend::is_transient`]) runs again. Where a backend's runs take turns on its device
//! ([`Backend::runs_take_turns`]), its plans order their work by `turns`.

use std::fmt::Debug;
use std::time::Duration;

use tract_core::internal::*;

use crate::transform::OutputLayout;

mod host;
// Public for device runtimes' plans, which order their work by it.
#[doc(hidden)]
pub mod turns;

pub use host::{HostBackend, preferred_isa_edit};
// For the tests: the host's own ops, compared with tract's.
#[doc(hidden)]
pub use host::{HostConv, HostDepthwise, convs_on_host, depthwise_on_host};

/// What the scheduler's cost model needs from a backend: how large a batch may grow, and
/// what starting one more batch costs against padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostModel {
    /// At most this many samples per batch (beyond it, the backend runs batches less
    /// efficiently per cell than smaller ones).
    pub max_batch: Option<usize>,
    /// A batch's fixed cost, in padded cells along the ragged axis (samples x padded
    /// width): the padding a new batch must save to be worth its overhead.
    pub batch_overhead: u64,
    /// Whether the scheduler should measure what a cell costs at each batch size on the
    /// model and the machine ([`crate::schedule::CellCosts`]) rather than take the two
    /// numbers above.
    pub measured: bool,
    /// Whether `batch_overhead` is a first guess that the runnable refits to the batches
    /// it runs (`crate::schedule::fit`: on a device, a batch's time is a fixed part and
    /// a part per cell).
    pub fitted: bool,
}

/// What the machine a backend runs on can do at most: the bounds a node's achieved rates
/// are set against in a profile (a roofline).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peaks {
    /// Bytes per second to and from memory.
    pub bytes_per_s: f64,
    /// f32 floating-point operations per second (an FMA is two), without tensor cores.
    pub flops_per_s: f64,
    /// f16 operations per second on tensor cores (dense, f32 accumulation), where known.
    pub half_flops_per_s: Option<f64>,
    /// Where the numbers come from, for the reader.
    pub source: &'static str,
}

/// One node's time in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeRun {
    /// The node's id in the plan's model.
    pub node: usize,
    /// Its time where its work runs: on the host, or on the device (between two events).
    pub time: Duration,
    /// Host time spent in its evaluation (on a device: preparing and queuing its work).
    pub host: Duration,
}

/// Per-node times of one run of a plan, as a backend measures them.
#[derive(Clone, Debug, Default)]
pub struct NodeTimes {
    /// Each node run, in evaluation order.
    pub nodes: Vec<NodeRun>,
    /// Whether `time` is device time rather than host time.
    pub device: bool,
    /// On a device: whether the run's tensors came from one arena rather than one
    /// allocation per node output.
    pub arena: bool,
    /// On a device: the bytes of the run's arena (its node outputs, as tract-gpu's memory
    /// schema packs them); none where there is no arena.
    pub arena_bytes: Option<u64>,
    /// What the run gave (a segment's outputs feed the next one).
    pub outputs: TVec<TValue>,
}

/// What running ragged batches needs from the machine a plan runs on (module doc).
pub trait Backend: Debug + Send + Sync {
    /// What the backend is called in messages.
    fn name(&self) -> &'static str;

    /// The plan's ragged input: `samples` stacked along a new axis 0, padded with zeros
    /// to `padded` along each ragged axis `axes` (of the samples).
    fn upload(&self, samples: &[&Tensor], axes: &[usize], padded: &[usize]) -> TractResult<TValue>;

    /// For each of the `n` samples, its outputs in order: batch axis removed, ragged axes
    /// cut to its widths ([`crate::batch::crop`]).
    fn download(
        &self,
        outputs: &[TValue],
        layouts: &[OutputLayout],
        n: usize,
    ) -> TractResult<Vec<TVec<Tensor>>>;

    /// The memory a batch's plan may take when the caller sets no budget, in bytes.
    fn memory_budget(&self) -> u64;

    /// The scheduler's cost model on this backend.
    fn cost_model(&self) -> CostModel;

    /// How many batches may run at once, each in its own thread
    /// ([`crate::schedule`]'s lanes): one unless the backend runs concurrent batches
    /// faster than one after the other.
    fn lanes(&self) -> usize {
        1
    }

    /// Whether the batches that lanes run at once should run their plans one at a time
    /// ([`crate::schedule`]'s turns) and overlap only their transfers and crops: where one
    /// batch fills the machine (a device's kernels), so that two at once each run at half
    /// speed. No on the host, where each lane computes on its own cores.
    fn runs_take_turns(&self) -> bool {
        false
    }

    /// How many threads one by one may prepare the plans of the samples ahead on while it
    /// runs the current one (`crate::runnable::ahead`), `cores` being the host's: none by
    /// default. A backend allows it where a plan prepared on one thread runs on another,
    /// and where a preparation run through [`Backend::preparing`] never disturbs another
    /// thread's run (the helpers are threads of a pool kept for the process, at most
    /// `crate::runnable::ahead`'s `MOST_HELPERS`).
    fn plan_helpers(&self, cores: usize) -> usize {
        let _ = cores;
        0
    }

    /// How many gatherings a server keeps going at once (`crate::serve`): while one runs,
    /// the others gather behind it. Two by default: on the CPU more make smaller
    /// gatherings, more batch shapes and fewer lines/s (benches/NOTES.md, 2026-12-06).
    fn gatherers(&self) -> usize {
        2
    }

    /// Runs `f`, the whole preparation of a plan (which another thread may be running
    /// samples meanwhile), as the backend needs: unchanged by default.
    fn preparing(&self, f: &mut dyn FnMut()) {
        f()
    }

    /// Runs `f` with `threads` threads for the kernels of the plans it runs (tract's
    /// executor on the host); without change where the backend has no such threads.
    fn with_threads(&self, threads: usize, f: &mut dyn FnMut()) {
        let _ = threads;
        f()
    }

    /// Runs `state` on `inputs` once, timing each node; its outputs come back with the
    /// times.
    fn time_nodes(
        &self,
        state: &mut TypedSimpleState,
        inputs: TVec<TValue>,
    ) -> TractResult<NodeTimes>;

    /// Whether one plan, prepared over the model's symbolic batch size and widths, runs
    /// every batch shape on this backend's runtime, where the model is typed symbolically:
    /// no preparation per shape. No by default: a plan per shape, which the host's
    /// optimizer specializes to it.
    fn symbolic_plans(&self) -> bool {
        false
    }

    /// Rewrites a concrete model before its plan is prepared on this backend's runtime,
    /// where the runtime's optimizer would otherwise miss a fast path; the same values
    /// come out. None by default.
    fn before_prepare(&self, model: &mut TypedModel) -> TractResult<()> {
        let _ = model;
        Ok(())
    }

    /// Waits until the work the calling thread has queued is done (a device's stream);
    /// nothing on the host, where a run returns when its work is done. Asked only while a
    /// [`crate::timeline`] is recorded, so that a batch's device time is counted as its run.
    fn settle(&self) -> TractResult<()> {
        Ok(())
    }

    /// The machine's peaks, where the backend knows them.
    fn peaks(&self) -> Option<Peaks> {
        None
    }

    /// Whether `error` means the run did not fit in memory (a smaller batch may).
    fn is_out_of_memory(&self, error: &TractError) -> bool {
        OutOfMemory::in_chain(error)
    }

    /// Whether `error` is a failure of another run's making that the same batch, run
    /// again, does not meet (ragged-cuda: a capture that another thread's CUDA work
    /// invalidated, which the driver's bindings report to whichever thread calls next).
    fn is_transient(&self, _error: &TractError) -> bool {
        false
    }
}

pub use crate::error::OutOfMemory;

/// Recognises the plans of one backend: registered with `inventory::submit!`, asked by
/// `for_plan`.
pub struct BackendProbe {
    /// The backend of `plan`, if `plan` is one of its plans.
    pub claim: fn(plan: &dyn Runnable) -> Option<Arc<dyn Backend>>,
}

inventory::collect!(BackendProbe);

/// The backend of a prepared plan: the first registered probe that claims it, the host
/// otherwise.
pub(crate) fn for_plan(plan: &dyn Runnable) -> Arc<dyn Backend> {
    inventory::iter::<BackendProbe>
        .into_iter()
        .find_map(|probe| (probe.claim)(plan))
        .unwrap_or_else(|| Arc::new(HostBackend))
}

/// The backend of the plans `runtime` prepares, found from a plan of a one-node model.
pub(crate) fn for_runtime(runtime: &dyn Runtime) -> TractResult<Arc<dyn Backend>> {
    let mut probe = TypedModel::default();
    let x = probe.add_source("x", f32::fact([1]))?;
    let y = probe.wire_node("y", tract_core::ops::math::add(), &[x, x])?;
    probe.select_output_outlets(&y)?;
    let plan = crate::no_panic(
        || format!("Preparing a probe model on {}", runtime.name()),
        || runtime.prepare(probe),
    )
    .with_context(|| format!("Finding the backend of runtime {}", runtime.name()))?;
    Ok(for_plan(&*plan))
}
