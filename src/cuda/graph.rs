//! A ragged-cuda plan, run with states kept per thread and replayed as a CUDA graph.
//!
//! A small batch costs the host more than the device: PP-OCRv4 rec on one 320 px line is
//! about 220 nodes, each a few microseconds of device work and 10..25 µs of host work
//! (shapes, tract's turn, the driver's launch; measured on the H200's host), so the
//! device waits on the host. Two things are paid again at every run of a plan on a fresh
//! state, and [`CudaPlan`] avoids both:
//!
//! - **Op states.** tract-cuda's convolutions build their cuDNN descriptors and pick an
//!   algorithm in their op state, 190..370 µs of host time per convolution (measured):
//!   a plan run through
//!   `Runnable::run` spawns a state per run and pays it every time. Each thread keeps its
//!   own state instead (not shared across threads: the descriptors were made with the
//!   thread's cuDNN handle, on its stream).
//! - **Launches.** When the same batch shape comes again (with the same host inputs, the
//!   widths of a ragged plan, where the plan cannot stage them again: below), the plan is
//!   captured into a CUDA graph on its second occurrence (once this thread's state made the op states and loaded the kernels in a
//!   plain run), launched, and replayed from the third on: one launch for the whole plan.
//!   Measured on PP-OCRv4 rec, one 320 px line end to end: 2.1 ms without graphs, 0.9 ms
//!   with them (H200).
//!
//! A graph keeps device memory while it lives: its outputs and, reserved by the driver
//! for its own allocations, the run's intermediate tensors. At most `MAX_GRAPHS` (16) are
//! kept per plan and thread, and at most [`MAX_LIVE_GRAPHS`] (64) in the process: past
//! that, keys seen twice run plain instead of being captured. Without the second bound,
//! graph memory grows with threads x plans x 4 (measured on an H200: 8 threads of random
//! PP-OCRv4 rec batches over 32 plans went from 3.8 to 10.1 GB of device memory in 7000
//! batches, as repeated compositions were captured one thread at a time). A batch shape
//! (batch size and padded width) of a restaged model needs one graph per thread whatever
//! the widths of its batches.
//!
//! ## Turns
//!
//! In a lane's turn (`crate::backend::turns`) a run first makes its stream wait for the
//! event the previous run handed on, and hands the turn on itself, with an event of its
//! own, as soon as all its work is queued: before a plain run's first output is brought
//! to the host, after a replay's outputs are copied out.
//!
//! ## What makes a replay give what a run gives
//!
//! A graph replays the launches it captured with the addresses and host values they
//! had. So:
//!
//! - **Host values are staged again, or are the key.** Everything a plan computes on the
//!   host (width tables, divisors) derives from its host inputs, which ragged-cuda keeps
//!   small: the packed batch arrives on the device. During the capture, host tensors cross
//!   to the device through page-locked buffers the graph keeps (a copy from pageable
//!   memory cannot be captured). Where those uploads are all the device sees of the host
//!   inputs ([`super::restage`]), a graph is looked up by the shapes of the inputs, and a
//!   replay first computes the host values again for its own host inputs and writes them
//!   into those buffers: batches of one shape and other widths replay one graph.
//!   Otherwise (a device op reading host values as its parameters: cuDNN's recurrence
//!   lengths, a resize's sizes) it is looked up by the bytes of the host inputs too, and
//!   host inputs above [`MAX_KEY_BYTES`] are never graphed.
//! - **Device inputs are copied in.** The capture's device inputs are kept; a replay
//!   first copies the new inputs into them, on the device.
//! - **Outputs are copied out.** Outputs are allocated by the graph itself
//!   (`AUTO_FREE_ON_LAUNCH`: each launch takes them again, at the same address); a
//!   replay copies them into fresh device tensors, handed back as tract's lazy host
//!   tensors like a plain run's, so a caller may keep them across runs.
//! - Every other device allocation of the run (tract-gpu's arena, cuDNN workspaces,
//!   uploads) is made and freed inside the graph.
//!
//! ## Captures and other threads
//!
//! A capture is invalidated by anything that synchronises the whole device meanwhile,
//! from any thread: a synchronous allocation or free (pinned host memory, cuBLAS's and
//! cuDNN's handles made for a thread's first stream), a module load. ragged-cuda's own
//! such calls (plan preparation, pinned transfers, plain runs, which make a thread's
//! first stream) hold [`quiet`]'s shared lock, and a capture holds it exclusively.
//!
//! So a capture waits for every run of ours under way and holds off the next ones until
//! it is launched: every lane stalls behind it. Under 128 and 512 clients on an H100 a
//! server with graphs served 11-12% fewer lines/s than with graphs off, nearly every
//! capture of a shape that never came back (benches/NOTES.md). With
//! `TRACT_RAGGED_CAPTURE_WHEN_IDLE` on, a capture is made only where no other run of ours
//! is under way, and otherwise put off to a later sight of its key
//! (`graph_capture_deferred`): under load the batches run plain, as with graphs off, while
//! a lone request, or a run of one lane, captures and replays. Off by default: measured
//! on an H100 it took the graphs from an offline run (its four lanes always overlap, so
//! every capture was put off) and changed nothing under load, where [`MAX_LIVE_GRAPHS`]
//! had already stopped captures (benches/NOTES.md).
//!
//! A capture invalidated all
//! the same (by a caller's own CUDA work) is tried again on the key's next run; after
//! [`MAX_FAILURES`] failures, or at once when the plan reads device values back on the
//! host before its outputs, the plan is not graphed any more: its runs stay plain runs
//! (the reason is in [`CudaPlan::graph_refusal`] and in the log).
//!
//! `TRACT_RAGGED_GRAPHS` off turns graphs off.
//!
//! ## Driver errors that arrive as panics
//!
//! tract-cuda 0.23.9 unwraps the driver's error when it allocates a device tensor, so a
//! plan running out of device memory, or an allocation under a capture another thread
//! invalidated, panics. The two are what ragged-cuda acts on (a smaller batch, a capture
//! tried again), so [`CudaPlan::run`] and the capture turn such a panic back into the
//! driver's error, typed (`driver_panic`: the panic's message is all that is left of it);
//! any other panic goes on unwinding out of a run, and fails a capture.

use std::sync::Mutex;
use std::thread::ThreadId;

use cudarc::driver::result as cu;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUresult, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph, CudaStream, DriverError};
use tract_core::internal::*;
use tract_cuda::kernels::{get_sliced_cuda_view, get_sliced_cuda_view_mut};
use tract_gpu::sync::{DeviceSync, DeviceSyncKind};
use tract_gpu::tensor::{DeviceTensor, DeviceTensorExt, LazyHostStorage};

use super::restage::Restage;
use crate::backend::turns;
use crate::counters::{self, Event};

/// Host inputs larger than this (all of them together) are never part of a graph's key:
/// a packed batch that arrives on the host would make a new key at every run.
pub const MAX_KEY_BYTES: usize = 64 << 10;

/// Graphs kept per thread and plan, the least recently used dropped first: sixteen, as
/// one plan may run every batch shape (`Backend::symbolic_plans`), and four lanes then
/// reach the process's bound.
const MAX_GRAPHS: usize = 16;

/// Graphs alive in the process at most: a capture beyond it is not made.
pub const MAX_LIVE_GRAPHS: usize = 64;

/// Graphs alive in the process.
static LIVE_GRAPHS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many CUDA graphs are alive in the process (at most [`MAX_LIVE_GRAPHS`]).
pub fn live_graphs() -> usize {
    LIVE_GRAPHS.load(std::sync::atomic::Ordering::Relaxed)
}

/// One graph counted in [`LIVE_GRAPHS`] while it lives.
struct Live;

impl Live {
    /// A place among the live graphs, if there is one left.
    fn take() -> Option<Live> {
        use std::sync::atomic::Ordering;
        LIVE_GRAPHS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_LIVE_GRAPHS).then_some(n + 1)
            })
            .ok()
            .map(|_| Live)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        LIVE_GRAPHS.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Keys remembered as seen once, waiting for a second occurrence, per thread and plan:
/// a plan running every batch shape meets many between two of the same.
const MAX_SEEN: usize = 64;

/// Threads whose state is kept, the least recently used dropped first: enough for a
/// server's lanes (4) and gatherers (8; a gathering of one batch runs on its gatherer)
/// and a caller or two. A dropped state is made again at the thread's next run, its op
/// states and graphs with it. The graphs' memory is bounded by [`MAX_LIVE_GRAPHS`], not
/// by this.
const MAX_THREADS: usize = 16;

/// Failed captures after which a plan is not graphed any more.
pub const MAX_FAILURES: usize = 3;

/// Held shared by ragged-cuda's calls that may synchronise the device, exclusively by a
/// capture.
static CAPTURES: std::sync::RwLock<()> = std::sync::RwLock::new(());

thread_local! {
    /// How deep this thread is in [`quiet`]: a nested call holds the lock already.
    static QUIET_DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `f`, which may synchronise the whole device, while no capture is under way.
/// Nests: a call within another on the same thread only runs `f` (taking the lock again
/// could wait forever behind a capture waiting for the outer call). No capture is made
/// within it ([`is_quiet`]): it would wait for this thread's own lock.
pub fn quiet<T>(f: impl FnOnce() -> T) -> T {
    if is_quiet() {
        return f();
    }
    // A poisoned lock guards nothing but this ordering: go on. Its wait behind a capture
    // is counted where there was one (a server's metrics show it under load).
    let _guard = match CAPTURES.try_read() {
        Ok(guard) => guard,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            crate::timeline::phase(crate::timeline::Phase::Hold, 0, &[], || {
                CAPTURES.read().unwrap_or_else(|e| e.into_inner())
            })
        }
    };
    QUIET_DEPTH.with(|d| d.set(d.get() + 1));
    // Left at its depth again however `f` ends, a panic included.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            QUIET_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    let _leave = Leave;
    f()
}

/// Whether this thread is within [`quiet`].
pub fn is_quiet() -> bool {
    QUIET_DEPTH.with(|d| d.get() > 0)
}

/// What a graph is looked up by: per input, its type and shape, and the bytes of the
/// host ones.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key(Vec<(DatumType, TVec<usize>, Option<Vec<u8>>)>);

impl Key {
    /// The key of `inputs`, or none when their host bytes are too many to key on. With
    /// `by_shape` (a restaged plan, [`super::restage`]), host inputs are keyed by their
    /// shapes alone.
    fn of(inputs: &[TValue], by_shape: bool) -> Option<Key> {
        let mut host = 0;
        let mut key = vec![];
        for t in inputs {
            let bytes = if on_device(t).is_some() {
                None
            } else {
                // Bytes that are not plainly on the host are not a key.
                if !t.datum_type().is_copy() || !t.is_plain_ram() {
                    return None;
                }
                if by_shape {
                    key.push((t.datum_type(), t.shape().into(), Some(vec![])));
                    continue;
                }
                host += t.len() * t.datum_type().size_of();
                if host > MAX_KEY_BYTES {
                    return None;
                }
                Some(t.as_bytes().to_vec())
            };
            key.push((t.datum_type(), t.shape().into(), bytes));
        }
        Some(Key(key))
    }
}

/// The device tensor a plan input brings, if it lives on the device.
fn on_device(t: &TValue) -> Option<&DeviceTensor> {
    t.storage_as::<LazyHostStorage>()
        .and_then(|lazy| lazy.device())
        .or_else(|| t.to_device_tensor().ok())
}

/// Page-locked host memory a graph's copies read from.
struct Staged {
    ptr: *mut u8,
    len: usize,
    /// The bytes of the value staged (`len` is at least one).
    bytes: usize,
}

// SAFETY: a plain allocation; only read by the graph's copies and freed on drop.
unsafe impl Send for Staged {}

impl Staged {
    fn new(bytes: &[u8]) -> TractResult<Staged> {
        let len = bytes.len().max(1);
        // SAFETY: a fresh allocation of `len` bytes, written in full before any read.
        let ptr = unsafe { cu::malloc_host(len, 0) }
            .with_context(|| format!("Allocating {len} bytes of pinned host memory"))?
            as *mut u8;
        // SAFETY: `ptr` holds `len` >= `bytes.len()` bytes of a fresh allocation, apart
        // from `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        Ok(Staged {
            ptr,
            len,
            bytes: bytes.len(),
        })
    }

    /// Writes a new value of the staged value's size, for the graph's next launch to
    /// upload. The caller makes sure no launch is reading it.
    fn write(&mut self, bytes: &[u8]) -> TractResult<()> {
        ensure!(
            bytes.len() == self.bytes,
            "a restaged value of {} bytes where the capture staged {}",
            bytes.len(),
            self.bytes
        );
        // SAFETY: `ptr` holds `len` >= `self.bytes` bytes, apart from `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr, bytes.len()) };
        Ok(())
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes allocated and initialised in `new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_host`; the graph reading it is dropped before.
        if let Err(e) = unsafe { cu::free_host(self.ptr as _) } {
            log::warn!("Freeing a graph's pinned staging buffer: {e:?}");
        }
    }
}

/// A CUDA graph of one plan run, and what its launches read and write.
///
/// Fields drop in order: the outputs (graph memory, freed outside the graph after at
/// least one launch, which is legal) before the graph.
struct Graphed {
    key: Key,
    /// The capture's outputs: device tensors at the graph's own addresses, or host
    /// tensors computed from the key alone.
    outputs: TVec<TValue>,
    /// The capture's inputs; the device ones are where a replay copies its inputs.
    inputs: TVec<TValue>,
    /// Host values the graph uploads, page-locked, by the upload node that reads each.
    staged: Vec<(usize, Staged)>,
    /// How its host values are computed again for a replay, where they may change.
    restage: Option<Arc<Restage>>,
    /// The symbols the capture's run resolved, which its replays' host values read.
    symbols: SymbolValues,
    /// The end of its last launch: its staged values may be written again after it.
    launched: Option<CudaEvent>,
    graph: SendGraph,
    /// Its place among the process's live graphs.
    _live: Live,
}

/// A graph owned by one thread's entry; only that thread launches it.
struct SendGraph(CudaGraph);

// SAFETY: a graph is used (launched, dropped) by one thread at a time: the thread that
// captured it, which takes its entry out of the plan's table while it runs, or whichever
// thread drops the entry after evicting it.
unsafe impl Send for SendGraph {}

/// What one thread keeps for a plan. Graphs drop before the state whose op states they
/// were captured with.
#[derive(Default)]
struct PerThread {
    graphs: Vec<Graphed>,
    seen: Vec<Key>,
    state: Option<TypedSimpleState>,
}

/// Counts, for tests and benches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Graphs captured.
    pub captured: usize,
    /// Runs that were a graph replay.
    pub replays: usize,
    /// Plain runs.
    pub runs: usize,
    /// Captures that failed.
    pub failed: usize,
    /// Captures put off because other runs were under way.
    pub deferred: usize,
}

/// A plan's restaging for a set of host inputs, or why it has none.
type Restaging = Result<Arc<Restage>, String>;

/// A plan prepared by ragged-cuda: [`Runnable`], with states kept per thread and runs
/// replayed as CUDA graphs (module doc).
pub struct CudaPlan {
    /// Dropped by [`CudaPlan`]'s `Drop`, under [`quiet`]: its device weights are freed
    /// synchronously.
    plan: std::mem::ManuallyDrop<Arc<TypedSimplePlan>>,
    graphs: bool,
    /// Captures only while no other run of ours is under way (`TRACT_RAGGED_CAPTURE_WHEN_IDLE`).
    capture_when_idle: bool,
    threads: Mutex<Vec<(ThreadId, PerThread)>>,
    refusal: Mutex<Option<String>>,
    /// Per set of inputs arriving on the host: the plan's restaging, or why it has none
    /// ([`super::restage`]).
    restages: Mutex<Vec<(Vec<usize>, Restaging)>>,
    stats: Mutex<GraphStats>,
}

impl std::fmt::Debug for CudaPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaPlan {{ graphs: {}, {:?} }}",
            self.graphs,
            self.stats()
        )
    }
}

impl CudaPlan {
    pub fn new(plan: Arc<TypedSimplePlan>) -> CudaPlan {
        let graphs = super::knobs::TRACT_RAGGED_GRAPHS.get();
        CudaPlan {
            plan: std::mem::ManuallyDrop::new(plan),
            graphs,
            capture_when_idle: super::knobs::TRACT_RAGGED_CAPTURE_WHEN_IDLE.get(),
            threads: Mutex::new(vec![]),
            refusal: Mutex::new(None),
            restages: Mutex::new(vec![]),
            stats: Mutex::new(GraphStats::default()),
        }
    }

    /// The model this plan runs (what tests inspect for nodes left on the host).
    pub fn model(&self) -> &TypedModel {
        self.plan.model()
    }

    pub fn stats(&self) -> GraphStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Why this plan is not replayed as a graph, when a capture was refused.
    pub fn graph_refusal(&self) -> Option<String> {
        self.refusal.lock().ok().and_then(|r| r.clone())
    }

    fn count(&self, f: impl FnOnce(&mut GraphStats)) {
        if let Ok(mut s) = self.stats.lock() {
            f(&mut s)
        }
    }

    /// The restaging of this plan for `inputs` (made on first use for the inputs that
    /// arrive on the host), or why there is none.
    pub fn restage(&self, inputs: &[TValue]) -> Restaging {
        let host: Vec<usize> = (0..inputs.len())
            .filter(|ix| on_device(&inputs[*ix]).is_none())
            .collect();
        let Ok(mut restages) = self.restages.lock() else {
            return Err("restagings poisoned".into());
        };
        if let Some((_, r)) = restages.iter().find(|(h, _)| *h == host) {
            return r.clone();
        }
        let r = Restage::of(self.plan.model(), &host).map(Arc::new);
        if let Err(why) = &r {
            log::debug!("ragged-cuda: graphs keyed by the host inputs' bytes: {why}");
        }
        restages.push((host, r.clone()));
        r
    }

    /// Why this plan's graphs are keyed by the bytes of the host inputs, where a run
    /// found it cannot stage them again.
    pub fn restage_refusal(&self) -> Option<String> {
        let restages = self.restages.lock().ok()?;
        restages.iter().find_map(|(_, r)| r.as_ref().err().cloned())
    }

    /// This thread's entry, taken out of the table while the thread runs.
    fn take(&self) -> TractResult<PerThread> {
        let me = std::thread::current().id();
        let mut threads = self
            .threads
            .lock()
            .map_err(|_| anyhow!("plan states poisoned"))?;
        Ok(match threads.iter().position(|(id, _)| *id == me) {
            Some(ix) => threads.remove(ix).1,
            None => PerThread::default(),
        })
    }

    fn give(&self, entry: PerThread) {
        let me = std::thread::current().id();
        if let Ok(mut threads) = self.threads.lock() {
            threads.push((me, entry));
            if threads.len() > MAX_THREADS {
                let evicted = threads.remove(0);
                drop(threads);
                quiet(|| drop(evicted));
            }
        }
    }

    fn run_with(&self, entry: &mut PerThread, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        // Within `quiet` this thread holds the lock a capture takes exclusively.
        let graphed = self.graphs && self.graph_refusal().is_none() && !is_quiet();
        // Asked only where a graph may be looked up: a refused plan never analyses it.
        let restage = if graphed {
            self.restage(&inputs).ok()
        } else {
            None
        };
        let key = if graphed {
            Key::of(&inputs, restage.is_some())
        } else {
            None
        };
        let Some(key) = key else {
            return self.run_plain(entry, inputs);
        };
        if let Some(ix) = entry.graphs.iter().position(|g| g.key == key) {
            let graphed = entry.graphs.remove(ix);
            let mut graphed = graphed;
            let outputs =
                tract_cuda::with_cuda_stream(|stream| replay(&mut graphed, &inputs, stream));
            entry.graphs.push(graphed);
            self.count(|s| s.replays += 1);
            counters::count(Event::GraphReplay);
            return outputs;
        }
        if let Some(ix) = entry.seen.iter().position(|k| *k == key) {
            entry.seen.remove(ix);
            if entry.state.is_none() {
                // A capture needs op states made and kernels loaded by a plain run of
                // this thread's state first.
                entry.seen.push(key);
                return self.run_plain(entry, inputs);
            }
            // The process holds as many graphs as it may: this key runs plain, without
            // waiting for the capture lock.
            let Some(live) = Live::take() else {
                return self.run_plain(entry, inputs);
            };
            // A capture holds every other run of ours off while it waits for those under
            // way and records (module doc). With `capture_when_idle`, made only where no
            // other run of ours is under way; else put off to a later sight of the key.
            let exclusive = match CAPTURES.try_write() {
                Ok(guard) => guard,
                // A poisoned lock guards nothing but this ordering: go on.
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if !self.capture_when_idle => {
                    CAPTURES.write().unwrap_or_else(|e| e.into_inner())
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    drop(live);
                    entry.seen.push(key);
                    counters::count(Event::GraphCaptureDeferred);
                    self.count(|s| s.deferred += 1);
                    return self.run_plain(entry, inputs);
                }
            };
            // The second time: captured, launched once, the outputs copied out.
            match self.capture(entry, key.clone(), inputs.clone(), live, restage, exclusive) {
                Ok(graphed) => {
                    let outputs =
                        tract_cuda::with_cuda_stream(|stream| copy_out(&graphed, stream, vec![]));
                    entry.graphs.push(graphed);
                    if entry.graphs.len() > MAX_GRAPHS {
                        // Its pinned buffers are freed synchronously.
                        let evicted = entry.graphs.remove(0);
                        quiet(|| drop(evicted));
                        counters::count(Event::GraphEviction);
                    }
                    self.count(|s| s.captured += 1);
                    counters::count(Event::GraphCapture);
                    return outputs;
                }
                Err(e) => {
                    let reason = format!("{e:?}");
                    let mut failed = 0;
                    counters::count(Event::GraphCaptureFailed);
                    self.count(|s| {
                        s.failed += 1;
                        failed = s.failed;
                    });
                    let invalidated = capture_invalidated(&e);
                    if invalidated && failed < MAX_FAILURES {
                        log::info!(
                            "ragged-cuda: a CUDA graph capture was invalidated, to be tried again: {reason}"
                        );
                        entry.seen.push(key);
                    } else {
                        log::warn!("ragged-cuda: plan not replayed as a CUDA graph: {reason}");
                        if let Ok(mut r) = self.refusal.lock() {
                            *r = Some(reason);
                        }
                    }
                    // On a fresh state: the capture's is gone.
                    return self.run_plain(entry, inputs);
                }
            }
        }
        entry.seen.push(key);
        if entry.seen.len() > MAX_SEEN {
            entry.seen.remove(0);
        }
        self.run_plain(entry, inputs)
    }

    fn run_plain(&self, entry: &mut PerThread, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let mut state = match entry.state.take() {
            Some(state) => state,
            None => {
                counters::count(Event::PlanState);
                self.plan.spawn()?
            }
        };
        // A run may load kernels or allocate synchronously: not during another thread's
        // capture.
        let outputs = quiet(|| {
            // States this thread keeps for plans dropped elsewhere are freed here, outside
            // any capture.
            super::ops::sweep_op_states();
            let mut handed_on = false;
            state.run_plan_with_eval(inputs, |ctx, op_state, node, values| -> TractResult<_> {
                // At the first output brought to the host every kernel is queued and the run
                // only waits: the next lane in turn may queue its own.
                let to_host = node
                    .op_as::<DeviceSync>()
                    .is_some_and(|sync| sync.kind == DeviceSyncKind::ToHost);
                if to_host && !handed_on {
                    handed_on = true;
                    hand_on_turn()?;
                }
                tract_core::plan::eval(ctx, op_state, node, values)
            })
        })?;
        // Kept only after a run that went through: a failed one may leave values behind.
        entry.state = Some(state);
        self.count(|s| s.runs += 1);
        counters::count(Event::PlainRun);
        Ok(outputs)
    }

    /// Captures one run of the plan on `inputs` into a graph, and launches it once so
    /// that its outputs are allocated (dropping them is then legal).
    fn capture(
        &self,
        entry: &mut PerThread,
        key: Key,
        inputs: TVec<TValue>,
        live: Live,
        restage: Option<Arc<Restage>>,
        // No other thread of ours synchronises the device while the launches are captured.
        _exclusive: std::sync::RwLockWriteGuard<'static, ()>,
    ) -> TractResult<Graphed> {
        // `run_with` captures only once a plain run made this thread's state (and its stream).
        let mut state = entry
            .state
            .take()
            .context("A capture needs this thread's state, warmed by a plain run")?;
        tract_cuda::with_cuda_stream(|stream| {
            // Anything the earlier runs left recorded must not be blamed on the capture.
            stream.context().check_err()?;
            let mut staged = vec![];
            let mut symbols = SymbolValues::default();
            stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                .context("Beginning a CUDA graph capture")?;
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                state.run_plan_with_eval(inputs.clone(), |ctx, op_state, node, values| {
                    // What the run resolved so far: all of it at its last node.
                    symbols.clone_from(ctx.symbols);
                    capture_eval(ctx, op_state, node, values, &mut staged, stream)
                        .with_context(|| format!("Capturing {node}"))
                })
            }))
            .unwrap_or_else(|payload| {
                Err(driver_panic(&*payload).unwrap_or_else(|| {
                    anyhow!(
                        "Running the plan under capture: tract panicked: {}",
                        panic_message(&*payload)
                    )
                }))
            });
            // Always ended, whatever the run gave: the stream must leave capture mode.
            let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
            let graph = stream.end_capture(flags);
            // A capture that something else invalidated fails at whichever launch comes
            // next, in that op's words (cuBLAS's "execution failed"): the driver's
            // reason is the failure's, so that the key is tried again.
            let run = match (run, &graph) {
                (Err(e), Err(d)) if d.0 == CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => {
                    Err(e.context(*d))
                }
                (run, _) => run,
            };
            // Errors that drops recorded during the capture are the capture's: taken
            // now, before another thread's next call reports them as its own.
            let recorded = stream.context().check_err();
            let graphed = run.and_then(|outputs| {
                let launched = (|| {
                    recorded.context("Recorded during the capture")?;
                    let graph = graph
                        .context("Ending the CUDA graph capture")?
                        .context("The capture gave an empty graph")?;
                    check_outputs(&outputs)?;
                    graph
                        .launch()
                        .context("First launch of the captured graph")?;
                    Ok(graph)
                })();
                match launched {
                    Ok(graph) => Ok(Graphed {
                        key,
                        outputs,
                        inputs,
                        staged: std::mem::take(&mut staged),
                        restage,
                        symbols: std::mem::take(&mut symbols),
                        launched: Some(stream.record_event(None)?),
                        graph: SendGraph(graph),
                        _live: live,
                    }),
                    Err(e) => {
                        // Outputs of a graph that never ran: see below.
                        std::mem::forget(outputs);
                        Err(e)
                    }
                }
            });
            match graphed {
                Ok(graphed) => {
                    entry.state = Some(state);
                    Ok(graphed)
                }
                Err(e) => {
                    // The failed turn holds tensors at addresses of a graph that never
                    // ran: freeing them would be refused by the driver, and the refusal
                    // reported to whichever thread calls it next. They are forgotten.
                    std::mem::forget(state);
                    let _ = stream.context().check_err();
                    Err(e)
                }
            }
        })
    }
}

/// A graph's outputs must be tensors of their own, plainly laid out: a view would borrow
/// the turn's arena, which the graph frees at its end.
fn check_outputs(outputs: &[TValue]) -> TractResult<()> {
    for (ix, out) in outputs.iter().enumerate() {
        if let Ok(device) = out.to_device_tensor() {
            ensure!(
                matches!(device, DeviceTensor::Owned(_)),
                "output {ix} is a view of the turn's memory"
            );
            plain_bytes(device, "a graph's output")?;
        }
    }
    Ok(())
}

/// A node's evaluation while its launches are captured. Crossings between host and
/// device are the nodes a capture cannot take as they are: a copy from pageable memory
/// and tract's synchronisation before handing an output to the host.
fn capture_eval(
    ctx: &EvalContext,
    op_state: Option<&mut (dyn OpState + 'static)>,
    node: &TypedNode,
    values: TVec<TValue>,
    staged: &mut Vec<(usize, Staged)>,
    stream: &Arc<CudaStream>,
) -> TractResult<TVec<TValue>> {
    if let Some(sync) = node.op_as::<DeviceSync>() {
        match sync.kind {
            DeviceSyncKind::ToHost => {
                ensure!(
                    node.outputs.iter().all(|o| o.successors.is_empty()),
                    "{node} brings device values to the host for other nodes"
                );
                return Ok(values);
            }
            DeviceSyncKind::ToDevice if on_device(&values[0]).is_none() => {
                return upload_staged(node.id, &values[0], staged, stream)
                    .with_context(|| format!("Uploading for {node} under capture"));
            }
            DeviceSyncKind::ToDevice => {}
        }
    }
    if let Some(axis_ops) = super::islands::fused_sync_to_host(node) {
        ensure!(
            node.outputs.iter().all(|o| o.successors.is_empty()),
            "{node} brings device values to the host for other nodes"
        );
        let device = values[0].to_device_tensor()?;
        let reshaped = reshaped(device.clone(), axis_ops, ctx)
            .with_context(|| format!("Applying the axis ops of {node} under capture"))?;
        return Ok(tvec!(reshaped.into_tensor().into_tvalue()));
    }
    tract_core::plan::eval(ctx, op_state, node, values)
}

/// What tract-cuda's fused axis ops make of a device tensor before a sync to the host,
/// for the ones that only reshape it (a moved axis would make a strided view, which
/// tract copies to the host at once: not capturable).
fn reshaped(
    mut t: DeviceTensor,
    axis_ops: &[tract_gpu::ops::change_axes::GpuAxisOp],
    ctx: &EvalContext,
) -> TractResult<DeviceTensor> {
    for op in axis_ops {
        let mut shape: TVec<usize> = t.shape().into();
        match &op.inner {
            AxisOp::Reshape(skip, from, to) => {
                let from = from.iter().map(|d| d.eval(ctx.symbols)).collect();
                let to = to.iter().map(|d| d.eval(ctx.symbols)).collect();
                AxisOp::Reshape(*skip, from, to).change_shape_array(&mut shape, false)?;
            }
            AxisOp::Add(_) | AxisOp::Rm(_) => op.inner.change_shape_array(&mut shape, false)?,
            AxisOp::Move(..) => bail!("an axis moved on the way to the host"),
        }
        t = t.reshaped(shape)?;
    }
    Ok(t)
}

/// A host tensor uploaded from a page-locked copy that the graph keeps.
fn upload_staged(
    node: usize,
    input: &TValue,
    staged: &mut Vec<(usize, Staged)>,
    stream: &Arc<CudaStream>,
) -> TractResult<TVec<TValue>> {
    let dt = input.datum_type();
    ensure!(
        DeviceTensor::is_supported_dt(dt) && dt.is_copy() && input.is_plain_ram(),
        "a {dt:?} tensor with no plain bytes on the host"
    );
    let bytes = input.as_bytes();
    let host = Staged::new(bytes)?;
    let device = DeviceTensor::uninitialized_dt(dt, input.shape())?;
    if !bytes.is_empty() {
        let mut dst = get_sliced_cuda_view_mut(&device, 0, bytes.len())?;
        stream.memcpy_htod(&host.as_slice()[..bytes.len()], &mut dst)?;
    }
    staged.push((node, host));
    Ok(tvec!(device.into_tensor().into_tvalue()))
}

/// Bytes of a plain, natural-strided device tensor.
fn plain_bytes(t: &DeviceTensor, what: &str) -> TractResult<usize> {
    ensure!(
        !t.is_exotic() && t.strides() == &*Tensor::natural_strides(t.shape()),
        "{what}: a strided or exotic device tensor"
    );
    Ok(t.len() * t.datum_type().size_of())
}

/// One replay: the host values staged again (a restaged graph), the inputs copied in, one
/// launch, the outputs copied out.
fn replay(
    g: &mut Graphed,
    inputs: &[TValue],
    stream: &Arc<CudaStream>,
) -> TractResult<TVec<TValue>> {
    ensure!(inputs.len() == g.inputs.len(), "replay: input count");
    let mut host_outputs = vec![];
    if let Some(restage) = &g.restage {
        let mut values = restage.values(inputs, &g.symbols)?;
        // The last launch's uploads have read the staged values before they change.
        if let Some(launched) = g.launched.take() {
            launched
                .synchronize()
                .context("Waiting for a graph's last launch")?;
        }
        for (node, staged) in &mut g.staged {
            let Some(k) = restage.uploads.iter().position(|u| u == node) else {
                continue;
            };
            let value = values.get(k).context("a restaged value")?;
            ensure!(
                value.datum_type().is_copy() && value.is_plain_ram(),
                "a restaged value of no plain bytes"
            );
            staged
                .write(value.as_bytes())
                .with_context(|| format!("Restaging the value of node {node}"))?;
        }
        let outputs = values.drain(restage.uploads.len()..);
        host_outputs = restage.outputs.iter().copied().zip(outputs).collect();
    }
    for (ix, (kept, new)) in g.inputs.iter().zip(inputs).enumerate() {
        let Some(kept) = on_device(kept) else {
            continue;
        };
        let new =
            on_device(new).with_context(|| format!("replay: input {ix} not on the device"))?;
        let bytes = plain_bytes(kept, "replay input")?;
        ensure!(
            plain_bytes(new, "replay input")? == bytes,
            "replay: input {ix} has another size"
        );
        copy_bytes(new, kept, bytes, stream)?;
    }
    g.graph.0.launch().context("Launching a CUDA graph")?;
    g.launched = Some(stream.record_event(None)?);
    copy_out(g, stream, host_outputs)
}

/// The first `bytes` of `src` into `dst`, on the device, queued on `stream`.
fn copy_bytes(
    src: &DeviceTensor,
    dst: &DeviceTensor,
    bytes: usize,
    stream: &Arc<CudaStream>,
) -> TractResult<()> {
    if bytes > 0 {
        let from = get_sliced_cuda_view(src, 0, bytes)?;
        let mut to = get_sliced_cuda_view_mut(dst, 0, bytes)?;
        stream.memcpy_dtod(&from, &mut to)?;
    }
    Ok(())
}

/// The outputs of the graph's last launch, copied into tensors of their own.
fn copy_out(
    g: &Graphed,
    stream: &Arc<CudaStream>,
    host: Vec<(usize, TValue)>,
) -> TractResult<TVec<TValue>> {
    let copies = g
        .outputs
        .iter()
        .enumerate()
        .map(|(ix, out)| {
            // A host output derived from the host inputs, computed again for this replay.
            if let Some((_, value)) = host.iter().find(|(o, _)| *o == ix) {
                return Ok(Err(value.clone()));
            }
            let Ok(device) = out.to_device_tensor() else {
                return Ok(Err(out.clone()));
            };
            let bytes = plain_bytes(device, "replay output")?;
            let fresh = DeviceTensor::uninitialized_dt(device.datum_type(), device.shape())?;
            copy_bytes(device, &fresh, bytes, stream)?;
            Ok(Ok(fresh))
        })
        .collect::<TractResult<Vec<_>>>()?;
    // Everything is queued: the next lane in turn may queue its own while this one waits.
    hand_on_turn()?;
    copies
        .into_iter()
        .map(|copy| match copy {
            Ok(fresh) => Ok(LazyHostStorage::new(fresh)?.into_tensor().into_tvalue()),
            Err(host) => Ok(host),
        })
        .collect()
}

/// Orders the calling thread's work after what the previous run in turn queued
/// ([`crate::backend::turns`]): its stream waits for the event that run handed on.
fn follow_previous_run() -> TractResult<()> {
    let mut followed = Ok(());
    turns::follow(|mark| {
        if let Some(event) = mark.downcast_ref::<CudaEvent>() {
            followed = tract_cuda::with_cuda_stream(|stream| Ok(stream.wait(event)?));
        }
    });
    followed.context("Waiting for the previous run in turn")
}

/// Hands the turn on, where the calling thread holds one, with an event after the work
/// queued so far on its stream ([`crate::backend::turns`]).
fn hand_on_turn() -> TractResult<()> {
    if turns::holding() {
        let event = tract_cuda::with_cuda_stream(|stream| Ok(stream.record_event(None)?))
            .context("Recording the end of a run's work")?;
        turns::queued(Box::new(event));
    }
    Ok(())
}

impl Drop for CudaPlan {
    fn drop(&mut self) {
        // Pinned buffers of the graphs and the plan's device weights are freed
        // synchronously, which would invalidate another thread's capture.
        let threads = std::mem::take(self.threads.get_mut().unwrap_or_else(|e| e.into_inner()));
        // SAFETY: `plan` is not used again: this is the plan's last moment.
        let plan = unsafe { std::mem::ManuallyDrop::take(&mut self.plan) };
        quiet(|| {
            drop(threads);
            drop(plan);
        });
    }
}

/// The driver errors ragged-cuda acts on, when tract-cuda unwraps them into a panic.
const DRIVER_ERRORS_ACTED_ON: [CUresult; 2] = [
    CUresult::CUDA_ERROR_OUT_OF_MEMORY,
    CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
];

/// A panic's message, where it has one.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(|s| s.as_str())
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default()
}

/// The driver error a panic names, typed, if it is one of [`DRIVER_ERRORS_ACTED_ON`]
/// (tract-cuda's unwrap of a driver error prints its name).
fn driver_panic(payload: &(dyn std::any::Any + Send)) -> Option<TractError> {
    let message = panic_message(payload);
    let code = DRIVER_ERRORS_ACTED_ON
        .into_iter()
        .find(|code| message.contains(&format!("{code:?}")))?;
    Some(TractError::new(DriverError(code)).context("tract-cuda panicked on a driver error"))
}

impl Runnable for CudaPlan {
    fn run(&self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        follow_previous_run()?;
        self.run_once(inputs)
    }

    fn spawn(&self) -> TractResult<Box<dyn State>> {
        Ok(Box::new(self.plan.spawn()?))
    }

    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        Some(&*self.plan)
    }

    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        Runnable::typed_model(&*self.plan)
    }
}

/// `f`'s value, tract-cuda's panics on the driver errors ragged-cuda acts on turned back
/// into those errors, typed (out of memory: a smaller batch; an invalidated capture: the
/// batch again); other panics go on.
pub(crate) fn driver_errors_typed<T>(f: impl FnOnce() -> TractResult<T>) -> TractResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        Err(driver_panic(&*payload).unwrap_or_else(|| std::panic::resume_unwind(payload)))
    })
}

/// Whether `e` is, or was caused by, a capture invalidated: this thread's, or another
/// thread's that cudarc reports to whichever thread calls the context next (it keeps the
/// error a drop met for the next call).
pub(crate) fn capture_invalidated(e: &TractError) -> bool {
    // A driver error given as context is found by anyhow's own downcast, not the chain's.
    let given = e
        .downcast_ref::<DriverError>()
        .is_some_and(|d| d.0 == CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    given
        || e.chain().any(|cause| {
            cause
                .downcast_ref::<DriverError>()
                .is_some_and(|d| d.0 == CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        })
}

impl CudaPlan {
    /// [`Runnable::run`], once its turn is followed.
    fn run_once(&self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let mut entry = self.take()?;
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.run_with(&mut entry, inputs)
        }));
        match run {
            Ok(outputs) => {
                self.give(entry);
                outputs
            }
            Err(payload) => {
                // The thread's state goes with a run that panicked: the next one makes a
                // fresh one. Its graphs' pinned buffers are freed synchronously.
                quiet(|| drop(entry));
                Err(driver_panic(&*payload).unwrap_or_else(|| std::panic::resume_unwind(payload)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A preparation holds `quiet` over calls that take it again: nesting must neither
    /// wait on the lock nor leave the thread marked quiet after, a panic included.
    #[test]
    fn quiet_nests_and_ends() {
        assert!(!is_quiet());
        let inner = quiet(|| quiet(is_quiet) && is_quiet());
        assert!(inner);
        assert!(!is_quiet());
        let panicked = std::panic::catch_unwind(|| quiet(|| panic!("inside")));
        assert!(panicked.is_err());
        assert!(!is_quiet());
        // A capture (the lock taken exclusively) can be had again: nothing still holds it.
        assert!(CAPTURES.try_write().is_ok());

        // A wait behind a capture counts as a hold (process-wide totals: other tests can
        // only add to them).
        use crate::timeline::{Phase, totals};
        let holds = || {
            totals()
                .into_iter()
                .find(|(p, _, _)| *p == Phase::Hold)
                .map_or(0, |(_, _, n)| n)
        };
        let before = holds();
        let capture = CAPTURES.write().unwrap_or_else(|e| e.into_inner());
        let (started, waiting) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _ = started.send(());
            quiet(|| ())
        });
        let _ = waiting.recv();
        // Long enough for the waiter to find the lock taken.
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(capture);
        assert!(waiter.join().is_ok());
        assert!(holds() > before);
    }

    /// An op's failure in a capture that the driver then says was invalidated is an
    /// invalidated capture (tried again), whether the driver's error is a cause or the
    /// context given to the op's; other failures are not.
    #[test]
    fn an_op_failing_in_an_invalidated_capture_is_an_invalidated_capture() {
        let invalidated = DriverError(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        let op = || anyhow!("CudaPointwise: cuBLAS SGEMM failed");
        assert!(capture_invalidated(&op().context(invalidated)));
        assert!(capture_invalidated(
            &TractError::new(invalidated).context("Capturing a node")
        ));
        assert!(!capture_invalidated(&op()));
        assert!(!capture_invalidated(
            &op().context(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY))
        ));
    }
}
