//! Lanes: the batches of runs executed by several threads at once.
//!
//! A plan runs a batch on one thread (tract's CPU kernels are single-threaded unless told
//! otherwise), so a run of many batches leaves all but one core waiting. The scheduler
//! runs its batches in **lanes**: as many threads as the backend says batches may run at
//! once ([`crate::backend::Backend::lanes`]: the host's cores), each taking the next batch
//! from a shared queue in the order given (the costliest first, so that the last batches
//! to finish are short ones), each with its own plan state. Each batch's results are
//! exactly those of the batch run alone: lanes only decide when it runs.
//!
//! - The lanes are threads kept for the process (a pool per lane count), not threads
//!   spawned per run: a device runtime keeps per-thread state (tract-cuda's stream,
//!   ragged-cuda's op states and captured graphs, kept for a few threads only), which a
//!   lane's next batch then finds ready. Every batch runs in the lanes, a call's only
//!   batch too: the callers' threads (a server's many) never hold that state. Where the
//!   backend has a single lane the caller's thread runs its batches.
//! - **Calls share the lanes.** Callers on several threads (the server's gatherers) queue
//!   their batches behind those of the calls before theirs; a lane free takes the next
//!   batch of the first call that has one left. So a lane is never idle while a batch of
//!   some call waits, and the batches of several small runs overlap as one large run's do.
//!   Each caller gets its own batches' results, on its own thread.
//! - The lanes are plain threads, not a rayon pool's: a rayon thread waiting on another
//!   pool (the copy pool, [`crate::batch`]; tract's executor) runs its own pool's pending
//!   work meanwhile, and another call's batch would run nested inside the waiting one
//!   (tract's kernels keep per-thread scratch space that would then be borrowed twice).
//! - When fewer batches are left than lanes, a batch gets the idle lanes' cores as
//!   threads of tract's own executor ([`crate::backend::Backend::with_threads`]), whose
//!   kernels split their work without changing any result bit.
//! - Batches in flight hold their peak memory; a batch starts only when the bytes it needs
//!   are free within the budget ([`MemoryGate`], one per backend for every call on it),
//!   so lanes never take more than one batch at a time would be allowed.
//! - On a backend whose runs take turns ([`crate::backend::Backend::runs_take_turns`]: a
//!   GPU), every batch on it runs its plan in the backend's one set of turns
//!   ([`crate::backend::turns`]), whichever call and thread it comes from (a lane, or a
//!   caller running its single lane): runs one after the other, everything else
//!   overlapped.

use std::any::Any;
use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, mpsc};

use crate::backend::Backend;
use crate::backend::turns::{self, TakingTurns, Turns};

/// One batch for the lanes: what to run and the bytes it holds while it runs.
pub(crate) struct Job<T> {
    pub work: T,
    pub peak_memory: u64,
}

/// Bytes available to the batches in flight on a backend (module doc).
#[derive(Default)]
pub(crate) struct MemoryGate {
    used: Mutex<u64>,
    freed: Condvar,
}

impl MemoryGate {
    /// Waits until `bytes` fit within `budget` beside what the batches in flight hold,
    /// and takes them until the guard drops. A batch above the whole budget (the
    /// scheduler never makes one) waits for the others to finish, then runs alone. A run
    /// within a batch that holds bytes already (a thread's second take) takes none: the
    /// batch's peak covers it, and waiting for itself would never end.
    fn take(&self, bytes: u64, budget: u64) -> Taken<'_> {
        if HOLDING.get() {
            return Taken { gate: None, bytes };
        }
        let mut used = lock(&self.used);
        while *used > 0 && used.saturating_add(bytes) > budget {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used = used.saturating_add(bytes);
        HOLDING.set(true);
        Taken {
            gate: Some(self),
            bytes,
        }
    }
}

thread_local! {
    /// The thread runs a batch that holds bytes of a gate.
    static HOLDING: Cell<bool> = const { Cell::new(false) };
    /// The thread is a lane.
    static IN_LANE: Cell<bool> = const { Cell::new(false) };
}

/// Bytes taken from a gate, given back on drop.
struct Taken<'g> {
    gate: Option<&'g MemoryGate>,
    bytes: u64,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let Some(gate) = self.gate else { return };
        {
            let mut used = lock(&gate.used);
            *used = used.saturating_sub(self.bytes);
        }
        HOLDING.set(false);
        gate.freed.notify_all();
    }
}

/// What every call on one backend shares: its memory and its turns (module doc).
#[derive(Default)]
struct Shared {
    gate: MemoryGate,
    turns: Arc<Turns>,
}

/// What the calls on `backend` share, by its name, kept for the process.
fn shared(backend: &dyn Backend) -> &'static Shared {
    static SHARED: OnceLock<Mutex<HashMap<&'static str, &'static Shared>>> = OnceLock::new();
    let mut all = lock(SHARED.get_or_init(Default::default));
    all.entry(backend.name())
        .or_insert_with(|| Box::leak(Box::default()))
}

/// The locks here only order work: a poisoned one still does.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `jobs` in up to `lanes` lanes (module doc), in their order; `done` gets each
/// job's index and result, on the caller's thread, as they finish, and returns false to
/// stop: no job starts after that; those running finish and are reported too. A panic
/// of `work` reaches the caller once no lane runs any of its jobs.
pub(crate) fn run<T: Sync, R: Send>(
    jobs: &[Job<T>],
    lanes: usize,
    budget: u64,
    backend: &dyn Backend,
    work: impl Fn(&T) -> R + Sync,
    mut done: impl FnMut(usize, R) -> bool,
) {
    let shared = shared(backend);
    // A lane's job that runs jobs of its own runs them itself: waiting for other lanes
    // could wait for ever, every lane waiting so.
    let pool = match lanes <= 1 || IN_LANE.get() {
        true => None,
        false => pool(lanes),
    };
    let Some(pool) = pool else {
        // One lane (or no threads to be had): the caller's thread, in the backend's turns
        // unless the thread is in some already.
        let _turns = (backend.runs_take_turns() && !turns::joined())
            .then(|| TakingTurns::join(&shared.turns));
        for (ix, job) in jobs.iter().enumerate() {
            let taken = shared.gate.take(job.peak_memory, budget);
            let result = work(&job.work);
            drop(taken);
            if !done(ix, result) {
                return;
            }
        }
        return;
    };
    let (tx, rx) = mpsc::channel();
    let call = Call {
        jobs,
        budget,
        backend,
        shared,
        work: &work,
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        tx,
    };
    // SAFETY: the lanes use `call` only between claiming one of its jobs and reporting it
    // done, both under the pool's lock (`Pool::claim`, `Pool::finished`); `Entered`, on
    // every way out of this function (a panic of `done` included), closes the call to new
    // claims and waits, under that lock, until no job of it is in flight, before `call`
    // goes out of scope.
    let erased: &'static (dyn Calling + 'static) =
        unsafe { std::mem::transmute::<&(dyn Calling + '_), _>(&call as &dyn Calling) };
    let entered = pool.enter(erased);
    let mut reported = 0;
    let mut panicked = None;
    while reported < jobs.len() {
        match rx.recv() {
            Ok(Message::Done(ix, result)) => {
                reported += 1;
                if !done(ix, result) {
                    call.stop.store(true, Ordering::Release);
                    break;
                }
            }
            Ok(Message::Panicked(panic)) => {
                call.stop.store(true, Ordering::Release);
                panicked = Some(panic);
                break;
            }
            // `call` holds a sender: cannot happen while it lives.
            Err(_) => break,
        }
    }
    drop(entered);
    // Stopped: the jobs that were running have finished; they are reported too.
    for message in rx.try_iter() {
        match message {
            Message::Done(ix, result) => {
                done(ix, result);
            }
            Message::Panicked(panic) => panicked = panicked.or(Some(panic)),
        }
    }
    if let Some(panic) = panicked {
        resume_unwind(panic)
    }
}

/// What a lane sends a caller.
enum Message<R> {
    Done(usize, R),
    Panicked(Box<dyn Any + Send>),
}

/// A call's jobs, as the lanes see them whatever their types.
trait Calling: Sync {
    /// The index of the call's next job, taken, unless none is left or it stopped.
    fn claim(&self) -> Option<usize>;
    /// How many of its jobs are not taken yet.
    fn unclaimed(&self) -> usize;
    /// Runs job `ix` on the calling lane with `threads` threads, and reports it.
    fn run(&self, ix: usize, threads: usize);
}

struct Call<'a, T, R, W> {
    jobs: &'a [Job<T>],
    budget: u64,
    backend: &'a dyn Backend,
    shared: &'static Shared,
    work: &'a W,
    next: AtomicUsize,
    stop: AtomicBool,
    tx: mpsc::Sender<Message<R>>,
}

impl<T: Sync, R: Send, W: Fn(&T) -> R + Sync> Calling for Call<'_, T, R, W> {
    fn claim(&self) -> Option<usize> {
        if self.stop.load(Ordering::Acquire) || self.next.load(Ordering::Acquire) >= self.jobs.len()
        {
            return None;
        }
        // Claims are made under the pool's lock: no other lane takes this index.
        let ix = self.next.fetch_add(1, Ordering::AcqRel);
        (ix < self.jobs.len()).then_some(ix)
    }

    fn unclaimed(&self) -> usize {
        match self.stop.load(Ordering::Acquire) {
            true => 0,
            false => self
                .jobs
                .len()
                .saturating_sub(self.next.load(Ordering::Acquire)),
        }
    }

    fn run(&self, ix: usize, threads: usize) {
        let Some(job) = self.jobs.get(ix) else { return };
        let _turns = self
            .backend
            .runs_take_turns()
            .then(|| TakingTurns::join(&self.shared.turns));
        let taken = self.shared.gate.take(job.peak_memory, self.budget);
        let mut result = None;
        let ran = catch_unwind(AssertUnwindSafe(|| {
            self.backend
                .with_threads(threads, &mut || result = Some((self.work)(&job.work)))
        }));
        drop(taken);
        let message = match (ran, result) {
            (Ok(()), Some(result)) => Message::Done(ix, result),
            (Err(panic), _) => Message::Panicked(panic),
            (Ok(()), None) => Message::Panicked(Box::new(format!(
                "{} ran nothing within with_threads",
                self.backend.name()
            ))),
        };
        // The caller gone (it stopped, or panicked) wants nothing more.
        let _ = self.tx.send(message);
    }
}

/// A pool of lanes and the calls queued on it (module doc).
struct Pool {
    lanes: usize,
    calls: Mutex<Calls>,
    /// A call entered or a job finished: lanes look for a job, callers for their end.
    changed: Condvar,
}

#[derive(Default)]
struct Calls {
    /// In the order they came.
    entries: Vec<Entry>,
    last_id: u64,
    /// Lanes running a job.
    busy: usize,
}

struct Entry {
    id: u64,
    call: &'static dyn Calling,
    /// Its jobs running now.
    in_flight: usize,
    /// Its caller left: no claims.
    closed: bool,
}

/// A call on a pool, closed and waited for on drop ([`run`]'s safety).
struct Entered {
    pool: &'static Pool,
    id: u64,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut calls = lock(&self.pool.calls);
        loop {
            let Some(at) = calls.entries.iter().position(|e| e.id == self.id) else {
                return;
            };
            calls.entries[at].closed = true;
            if calls.entries[at].in_flight == 0 {
                calls.entries.remove(at);
                return;
            }
            calls = self
                .pool
                .changed
                .wait(calls)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Pool {
    fn enter(&'static self, call: &'static dyn Calling) -> Entered {
        let mut calls = lock(&self.calls);
        calls.last_id += 1;
        let id = calls.last_id;
        calls.entries.push(Entry {
            id,
            call,
            in_flight: 0,
            closed: false,
        });
        drop(calls);
        self.changed.notify_all();
        Entered { pool: self, id }
    }

    /// A lane's loop: the next job of the first call with one left, run, reported; for
    /// the process's life.
    fn lane(&self) {
        IN_LANE.set(true);
        let mut calls = lock(&self.calls);
        loop {
            let claimed = calls
                .entries
                .iter_mut()
                .filter(|e| !e.closed)
                .find_map(|e| {
                    let ix = e.call.claim()?;
                    e.in_flight += 1;
                    Some((e.id, e.call, ix))
                });
            let Some((id, call, ix)) = claimed else {
                calls = self.changed.wait(calls).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            calls.busy += 1;
            // The lanes that will find nothing left to take lend their cores.
            let waiting: usize = calls
                .entries
                .iter()
                .filter(|e| !e.closed)
                .map(|e| e.call.unclaimed())
                .sum();
            let at_work = (calls.busy + waiting).clamp(1, self.lanes);
            let threads = (self.lanes / at_work).max(1);
            drop(calls);
            call.run(ix, threads);
            calls = lock(&self.calls);
            calls.busy -= 1;
            if let Some(entry) = calls.entries.iter_mut().find(|e| e.id == id) {
                entry.in_flight -= 1;
            }
            self.changed.notify_all();
        }
    }
}

/// The pool of `lanes` threads, made on first use and kept for the process.
fn pool(lanes: usize) -> Option<&'static Pool> {
    static POOLS: OnceLock<Mutex<HashMap<usize, &'static Pool>>> = OnceLock::new();
    let mut pools = lock(POOLS.get_or_init(Default::default));
    if let Some(pool) = pools.get(&lanes) {
        return Some(pool);
    }
    let pool: &'static Pool = Box::leak(Box::new(Pool {
        lanes,
        calls: Mutex::default(),
        changed: Condvar::new(),
    }));
    for i in 0..lanes {
        let started = std::thread::Builder::new()
            .name(format!("tract-ragged-lane-{i}/{lanes}"))
            .spawn(move || pool.lane());
        // Fewer lanes than asked still run every call; none, and the caller runs alone.
        if started.is_err() && i == 0 {
            return None;
        }
    }
    pools.insert(lanes, pool);
    Some(pool)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::backend::turns::in_turn;
    use crate::backend::{Backend, CostModel, HostBackend, NodeTimes};
    use crate::transform::OutputLayout;
    use tract_core::internal::*;

    /// `n` jobs of `peak` bytes each, their work their index.
    fn jobs(n: usize, peak: u64) -> Vec<Job<usize>> {
        (0..n)
            .map(|work| Job {
                work,
                peak_memory: peak,
            })
            .collect()
    }

    /// The host's backend under a name of the test's own (what calls on one backend share,
    /// its memory and turns, is the test's alone), its runs taking turns or not.
    #[derive(Debug)]
    struct Own {
        name: &'static str,
        turns: bool,
    }

    const fn own(name: &'static str) -> Own {
        Own { name, turns: false }
    }

    impl Backend for Own {
        fn name(&self) -> &'static str {
            self.name
        }
        fn upload(&self, s: &[&Tensor], axes: &[usize], padded: &[usize]) -> TractResult<TValue> {
            HostBackend.upload(s, axes, padded)
        }
        fn download(
            &self,
            outputs: &[TValue],
            layouts: &[OutputLayout],
            n: usize,
        ) -> TractResult<Vec<TVec<Tensor>>> {
            HostBackend.download(outputs, layouts, n)
        }
        fn memory_budget(&self) -> u64 {
            HostBackend.memory_budget()
        }
        fn cost_model(&self) -> CostModel {
            HostBackend.cost_model()
        }
        fn time_nodes(
            &self,
            state: &mut TypedSimpleState,
            inputs: TVec<TValue>,
        ) -> TractResult<NodeTimes> {
            HostBackend.time_nodes(state, inputs)
        }
        fn runs_take_turns(&self) -> bool {
            self.turns
        }
    }

    /// Runs 12 jobs of `peak` bytes each under a budget of 10 bytes in 4 lanes: how many
    /// ran at once at most, and the jobs answered.
    fn concurrency(peak: u64) -> (usize, Vec<usize>) {
        let jobs = jobs(12, peak);
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let mut answered = vec![];
        run(
            &jobs,
            4,
            10,
            &own("concurrency"),
            |w| {
                let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(at_once, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
                now.fetch_sub(1, Ordering::SeqCst);
                *w * 10
            },
            |ix, r| {
                assert_eq!(r, ix * 10);
                answered.push(ix);
                true
            },
        );
        answered.sort();
        (most.load(Ordering::SeqCst), answered)
    }

    #[test]
    fn batches_in_flight_stay_within_the_budget() {
        let all: Vec<usize> = (0..12).collect();
        let (most, answered) = concurrency(4);
        assert!(most <= 2, "{most} jobs of 4 bytes at once in 10");
        assert_eq!(answered, all);
        let (most, answered) = concurrency(1);
        assert!(most <= 4, "{most} jobs at once in 4 lanes");
        assert_eq!(answered, all);
        // Above the whole budget: one at a time, never stuck.
        let (most, answered) = concurrency(11);
        assert_eq!(most, 1);
        assert_eq!(answered, all);
    }

    /// On a backend whose runs take turns, lanes overlap what jobs do outside their runs
    /// but never two runs; on the host, runs overlap.
    #[test]
    fn runs_take_turns_where_the_backend_says_so() {
        let jobs = jobs(12, 0);
        let most_at_once = |backend: &dyn Backend| {
            let (runs, outside) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let (most_runs, most_outside) = (AtomicUsize::new(0), AtomicUsize::new(0));
            run(
                &jobs,
                4,
                u64::MAX,
                backend,
                |_| {
                    let n = outside.fetch_add(1, Ordering::SeqCst) + 1;
                    most_outside.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(3));
                    outside.fetch_sub(1, Ordering::SeqCst);
                    in_turn(1, &[8], || {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        most_runs.fetch_max(n, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(2));
                        runs.fetch_sub(1, Ordering::SeqCst);
                    });
                },
                |_, _| true,
            );
            (
                most_runs.load(Ordering::SeqCst),
                most_outside.load(Ordering::SeqCst),
            )
        };
        let (runs, outside) = most_at_once(&Own {
            name: "turning",
            turns: true,
        });
        assert_eq!(runs, 1, "runs at once in turns");
        assert!(outside > 1, "lanes did nothing else at once");
        let (runs, _) = most_at_once(&own("not turning"));
        assert!(runs > 1, "host runs waited for each other");
    }

    #[test]
    fn no_job_starts_after_a_stop() {
        let jobs = jobs(100, 0);
        let started = AtomicUsize::new(0);
        let mut answered = 0;
        run(
            &jobs,
            2,
            1,
            &own("stop"),
            |_| {
                started.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
            },
            |_, _| {
                answered += 1;
                false
            },
        );
        let started = started.load(Ordering::SeqCst);
        assert_eq!(answered, started, "every job that ran is reported");
        assert!(started <= 4, "{started} jobs started after the first stop");
    }

    /// Runs `jobs` in `lanes` lanes on `backend`, returning each job's result by index.
    fn answers(
        jobs: &[Job<usize>],
        lanes: usize,
        budget: u64,
        backend: &dyn Backend,
        work: impl Fn(&usize) -> usize + Sync,
    ) -> Vec<usize> {
        let mut answered = vec![usize::MAX; jobs.len()];
        run(jobs, lanes, budget, backend, work, |ix, r| {
            answered[ix] = r;
            true
        });
        answered
    }

    /// A call entering while another runs takes the lanes that one leaves idle, and each
    /// caller gets its own jobs' results.
    #[test]
    fn calls_on_several_threads_share_the_lanes() {
        let backend = own("sharing");
        let (first_started, second_ran) = (AtomicBool::new(false), AtomicBool::new(false));
        let waited_for_second = |ix: &usize| {
            first_started.store(true, Ordering::SeqCst);
            // Two of the first call's three jobs hold their lanes until a job of the
            // second call ran beside them, in the third lane (5 s: never, calls in turn).
            if *ix < 2 {
                let until = std::time::Instant::now() + Duration::from_secs(5);
                while !second_ran.load(Ordering::SeqCst) && std::time::Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert!(second_ran.load(Ordering::SeqCst), "the second call waited");
            }
            ix * 10
        };
        std::thread::scope(|s| {
            let second = s.spawn(|| {
                while !first_started.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                answers(&jobs(3, 0), 3, u64::MAX, &backend, |ix| {
                    second_ran.store(true, Ordering::SeqCst);
                    ix + 100
                })
            });
            let first = answers(&jobs(3, 0), 3, u64::MAX, &backend, waited_for_second);
            assert_eq!(first, vec![0, 10, 20]);
            assert_eq!(second.join().unwrap(), vec![100, 101, 102]);
        });
    }

    /// Calls on several threads together stay within the backend's memory.
    #[test]
    fn calls_on_several_threads_share_the_budget() {
        let backend = own("budget");
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let work = |ix: &usize| {
            let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(at_once, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(3));
            now.fetch_sub(1, Ordering::SeqCst);
            *ix
        };
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let answered = answers(&jobs(6, 4), 4, 10, &backend, work);
                    assert_eq!(answered, (0..6).collect::<Vec<_>>());
                });
            }
        });
        let most = most.load(Ordering::SeqCst);
        assert!(most <= 2, "{most} jobs of 4 bytes at once in 10");
    }

    /// A job's panic reaches its caller, once no lane runs its jobs; the lanes go on
    /// serving calls.
    #[test]
    fn a_panic_reaches_the_caller_and_the_lanes_live_on() {
        let backend = own("panic");
        let jobs = jobs(8, 0);
        for _ in 0..2 {
            let running = AtomicUsize::new(0);
            let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
                answers(&jobs, 3, u64::MAX, &backend, |ix| {
                    running.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(2));
                    running.fetch_sub(1, Ordering::SeqCst);
                    assert_ne!(*ix, 1, "job 1 fails");
                    *ix
                })
            }));
            assert!(caught.is_err());
            assert_eq!(
                running.load(Ordering::SeqCst),
                0,
                "a job ran past the panic"
            );
        }
        assert_eq!(
            answers(&jobs, 3, u64::MAX, &backend, |ix| *ix),
            (0..8).collect::<Vec<_>>()
        );
    }
}
