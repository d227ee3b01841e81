//! Lanes: the batches of a run executed by several threads at once.
//!
//! A plan runs a batch on one thread (tract's CPU kernels are single-threaded unless told
//! otherwise), so a run of many batches leaves all but one core waiting. The scheduler
//! runs its batches in **lanes**: as many threads as the backend says batches may run at
//! once ([`crate::backend::Backend::lanes`]: the host's cores), each taking the next batch
//! from a shared queue in the order given (the costliest first, so that the last batches
//! to finish are short ones), each with its own plan state. Each batch's results are
//! exactly those of the batch run alone: lanes only decide when it runs.
//!
//! - A batch runs either on its lane's thread alone or on every core of the lanes, through
//!   one executor pool (tract's, [`crate::backend::Backend::with_threads`]) that all such
//!   batches of the run share; tract's kernels and our host ops split their work over it
//!   without changing any result bit. It takes every core where fewer batches are left
//!   unfinished than there are lanes (lanes would otherwise sit idle), or where it holds
//!   one and a half lanes' share of the cost not finished or more (the largest page of
//!   eight, half of their pixels). Sharing one pool lets the cores follow the work: once the small
//!   batches are done, their cores take the large one's pieces. A pool per batch sized by
//!   its share at start did not: on 16 cores, PP-OCRv4 det's eight pages took 290-300 ms
//!   that way and 240 ms sharing (benches/NOTES.md). A lone batch gets every core.
//! - Batches in flight hold their peak memory; a batch starts only when the bytes it needs
//!   are free within the budget ([`MemoryGate`]), so lanes never take more than one
//!   batch at a time would be allowed.
//! - The lanes are the threads of a pool kept for the process (one per lane count the
//!   backend asks for, whatever the count of batches: a run of two batches takes two of
//!   the same threads), not threads spawned per run: a device runtime keeps per-thread
//!   state (tract-cuda's stream, ragged-cuda's op states and captured graphs), which a
//!   lane's next batch then finds ready. A single lane runs on the caller's thread,
//!   where the caller has that state. Each lane is handed to one thread of the pool as a
//!   broadcast job, which no other thread can take: a lane waiting on another pool (the
//!   copy pool, [`crate::batch`]; tract's executor) may run its own pool's pending work
//!   meanwhile, and a lane queued but not started would be such work. For the same
//!   reason a pool runs one call at a time: callers on several threads take the lanes in
//!   turn.
//! - On a backend whose runs take turns ([`crate::backend::Backend::runs_take_turns`]: a
//!   GPU), the lanes of one call run their plans one after the other and overlap
//!   everything else ([`crate::backend::turns`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, mpsc};

use crate::backend::turns::{TakingTurns, Turns};

use crate::backend::Backend;

/// One batch for the lanes: what to run, the bytes it holds while it runs, and what it
/// costs in the schedule's units (0 where not known).
pub(crate) struct Job<T> {
    pub work: T,
    pub peak_memory: u64,
    pub cost: f64,
}

/// Whether the lanes lend their cores to the batches (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lending {
    /// As the module doc says: every core to a batch where lanes would idle or where it
    /// holds most of the cost left, a lone batch included.
    Cores,
    /// Each batch on its lane's thread alone: batches timed to compare their sizes
    /// ([`super::cost`]), which must all run as a batch among many does, however few
    /// of them there are.
    OneThreadEach,
}

/// Whether a batch of `cost` runs on every core of `lanes` rather than on its lane's thread
/// alone (module doc): `batches` batches are not finished, its own included, and they cost
/// `unfinished` in all (the costs are 0 where not known).
fn on_every_core(lanes: usize, batches: usize, cost: f64, unfinished: f64) -> bool {
    if lanes <= 1 {
        return false;
    }
    if batches < lanes {
        return true;
    }
    // Two cores or more of the lanes by its share, its share of them rounded.
    cost > 0.0
        && unfinished.is_finite()
        && unfinished >= cost
        && lanes as f64 * cost / unfinished >= 1.5
}

/// Bytes available to the batches in flight (module doc).
pub(crate) struct MemoryGate {
    budget: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

impl MemoryGate {
    pub fn new(budget: u64) -> MemoryGate {
        MemoryGate {
            budget,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Waits until `bytes` fit beside what the batches in flight hold, and takes them. A
    /// batch above the whole budget (the scheduler never makes one) waits for the others
    /// to finish, then runs alone.
    fn take(&self, bytes: u64) {
        let Ok(mut used) = self.used.lock() else {
            return;
        };
        while *used > 0 && used.saturating_add(bytes) > self.budget {
            match self.freed.wait(used) {
                Ok(u) => used = u,
                Err(_) => return,
            }
        }
        *used = used.saturating_add(bytes);
    }

    fn give(&self, bytes: u64) {
        if let Ok(mut used) = self.used.lock() {
            *used = used.saturating_sub(bytes);
        }
        self.freed.notify_all();
    }
}

/// Runs `jobs` in up to `lanes` lanes (module doc), in their order; `done` gets each
/// job's index and result, on the caller's thread, as they finish, and returns false to
/// stop: no job starts after that; those running finish and are reported too.
pub(crate) fn run<T: Sync, R: Send>(
    jobs: &[Job<T>],
    lanes: usize,
    budget: u64,
    backend: &dyn Backend,
    lending: Lending,
    work: impl Fn(&T) -> R + Sync,
    mut done: impl FnMut(usize, R) -> bool,
) {
    // The pool is the one of the lanes asked for, whatever the jobs: a pool per count of
    // jobs would be other threads, each making its own per-thread state again.
    let pool_lanes = lanes.max(1);
    let lanes = lanes.clamp(1, jobs.len().max(1));
    if lanes == 1 {
        // One batch (or one lane asked for): on the caller's thread, with every core of
        // the lanes when it is the only batch.
        let threads = if jobs.len() == 1 && lending == Lending::Cores {
            pool_lanes
        } else {
            1
        };
        for (ix, job) in jobs.iter().enumerate() {
            let mut result = None;
            backend.with_threads(threads, &mut || result = Some(work(&job.work)));
            let Some(result) = result else { return };
            if !done(ix, result) {
                return;
            }
        }
        return;
    }
    let Some((pool, one_call)) = pool(pool_lanes) else {
        // No threads to be had: one lane.
        return run(jobs, 1, budget, backend, lending, work, done);
    };
    // One call at a time on a pool: a lane thread waiting on another pool runs its own
    // pool's pending work, and another call's lane queued there would run nested inside
    // this call's batch (tract's kernels keep per-thread scratch space that is then
    // borrowed twice). Concurrent callers take the lanes in turn; each call already has
    // every lane to itself.
    let _one_call = one_call.lock().unwrap_or_else(|e| e.into_inner());
    let gate = MemoryGate::new(budget);
    let turns = crate::backend::turns::taken(backend).then(|| Arc::new(Turns::default()));
    let next = AtomicUsize::new(0);
    let running = AtomicUsize::new(0);
    // The cost of the batches not started from each index on, and of those running.
    let mut not_started: Vec<f64> = jobs
        .iter()
        .rev()
        .scan(0.0, |sum, j| {
            *sum += j.cost.max(0.0);
            Some(*sum)
        })
        .collect();
    not_started.reverse();
    let running_cost = Mutex::new(0.0f64);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(usize, R)>();
    let (gate, turns, next, running, stop, work) = (&gate, &turns, &next, &running, &stop, &work);
    let (not_started, running_cost) = (&not_started, &running_cost);
    let lane = |tx: mpsc::Sender<(usize, R)>| {
        // The lane's thread is the pool's: it takes this call's turns for this call's jobs.
        let _turns = turns.as_ref().map(TakingTurns::join);
        loop {
            if stop.load(Ordering::Acquire) {
                break;
            }
            let ix = next.fetch_add(1, Ordering::AcqRel);
            let Some(job) = jobs.get(ix) else {
                break;
            };
            gate.take(job.peak_memory);
            let busy = running.fetch_add(1, Ordering::AcqRel) + 1;
            let waiting = jobs.len().saturating_sub(ix + 1);
            let every_core = {
                let mut running_cost = running_cost.lock().unwrap_or_else(|e| e.into_inner());
                *running_cost += job.cost.max(0.0);
                let unfinished = *running_cost + not_started.get(ix + 1).copied().unwrap_or(0.0);
                on_every_core(pool_lanes, busy + waiting, job.cost, unfinished)
            };
            let threads = if every_core && lending == Lending::Cores {
                pool_lanes
            } else {
                1
            };
            let mut result = None;
            backend.with_threads(threads, &mut || result = Some(work(&job.work)));
            if let Ok(mut running_cost) = running_cost.lock() {
                *running_cost -= job.cost.max(0.0);
            }
            running.fetch_sub(1, Ordering::AcqRel);
            gate.give(job.peak_memory);
            let Some(result) = result else { break };
            if tx.send((ix, result)).is_err() {
                break;
            }
        }
    };
    std::thread::scope(|scope| {
        // Each lane is a broadcast job, given to one thread of the pool and to no other:
        // a lane waiting on another pool (tract's executor, the copy pool) may run work
        // of its own pool meanwhile, and a spawned lane not started yet would be such
        // work, run nested, one lane doing two lanes' batches one after the other.
        scope.spawn(move || {
            pool.broadcast(|_| lane(tx.clone()));
            drop(tx);
        });
        for (ix, result) in rx {
            if !done(ix, result) {
                stop.store(true, Ordering::Release);
            }
        }
    });
}

/// A pool of lanes, and the lock a call holds while it runs on it.
type Pool = (rayon::ThreadPool, Mutex<()>);

/// The pool of `lanes` threads, made on first use and kept for the process, with the
/// lock that keeps it to one call at a time ([`run`]).
fn pool(lanes: usize) -> Option<(&'static rayon::ThreadPool, &'static Mutex<()>)> {
    static POOLS: OnceLock<Mutex<HashMap<usize, &'static Pool>>> = OnceLock::new();
    let mut pools = POOLS.get_or_init(Default::default).lock().ok()?;
    if let Some((pool, lock)) = pools.get(&lanes) {
        return Some((pool, lock));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(lanes)
        .thread_name(move |i| format!("tract-ragged-lane-{i}/{lanes}"))
        .build()
        .ok()?;
    let kept: &'static Pool = Box::leak(Box::new((pool, Mutex::new(()))));
    pools.insert(lanes, kept);
    Some((&kept.0, &kept.1))
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
                cost: 0.0,
            })
            .collect()
    }

    /// The host's backend, but its runs take turns.
    #[derive(Debug)]
    struct Turning;

    impl Backend for Turning {
        fn name(&self) -> &'static str {
            "turning"
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
            true
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
            &HostBackend,
            Lending::Cores,
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
    /// but never two runs, unless `TRACT_RAGGED_TURNS` is off; on the host, runs overlap.
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
                Lending::Cores,
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
        let (runs, outside) = most_at_once(&Turning);
        assert_eq!(runs, 1, "runs at once in turns");
        assert!(outside > 1, "lanes did nothing else at once");
        let (runs, _) = most_at_once(&HostBackend);
        assert!(runs > 1, "host runs waited for each other");
        // TRACT_RAGGED_TURNS off: the backend's runs overlap as the host's do.
        let off = tract_core::knobs::KnobScope::new([("TRACT_RAGGED_TURNS", "false")])
            .expect("a knob of this build");
        let (runs, _) = off.enter(|| most_at_once(&Turning));
        assert!(runs > 1, "runs took turns with TRACT_RAGGED_TURNS off");
    }

    /// A run of fewer jobs than lanes takes threads of the same pool as a run of many: a
    /// device runtime's per-thread states are then made once for all of them.
    #[test]
    fn runs_of_few_batches_take_the_same_threads() {
        use std::sync::Mutex;
        // Lanes of a count no other test asks for: this test's pool is its own.
        let lanes = 7;
        for n in 2..=lanes {
            let names = Mutex::new(vec![]);
            run(
                &jobs(n, 0),
                lanes,
                u64::MAX,
                &HostBackend,
                Lending::Cores,
                |_| {
                    let name = std::thread::current().name().map(String::from);
                    names.lock().unwrap().push(name);
                },
                |_, _| true,
            );
            for name in names.into_inner().unwrap() {
                let name = name.unwrap_or_default();
                assert!(
                    name.starts_with("tract-ragged-lane-") && name.ends_with("/7"),
                    "a run of {n} jobs in {lanes} lanes ran on {name:?}"
                );
            }
        }
    }

    /// The executor threads each job of `jobs` ran with, in `lanes` lanes on the host.
    fn threads_of(jobs: &[Job<usize>], lanes: usize, lending: Lending) -> Vec<usize> {
        let threads = std::sync::Mutex::new(vec![0; jobs.len()]);
        run(
            jobs,
            lanes,
            u64::MAX,
            &HostBackend,
            lending,
            |&ix| {
                let n = match tract_linalg::multithread::current_tract_executor() {
                    tract_linalg::multithread::Executor::MultiThread(pool) => {
                        pool.current_num_threads()
                    }
                    _ => 1,
                };
                threads.lock().unwrap()[ix] = n;
            },
            |_, _| true,
        );
        threads.into_inner().unwrap()
    }

    #[test]
    fn batches_take_every_core_where_lanes_would_idle_or_their_cost_is_large() {
        // Fewer batches than lanes: each on every core, costs known or not.
        assert_eq!(threads_of(&jobs(3, 0), 5, Lending::Cores), vec![5; 3]);
        assert_eq!(threads_of(&jobs(1, 0), 5, Lending::Cores), vec![5]);
        // One batch of most of the cost before many small ones: it takes every core, the
        // small ones started behind it, many more than the lanes, their own thread.
        let mut many: Vec<Job<usize>> = jobs(21, 0);
        for (ix, job) in many.iter_mut().enumerate() {
            job.cost = if ix == 0 { 100.0 } else { 1.0 };
        }
        let threads = threads_of(&many, 5, Lending::Cores);
        assert_eq!(threads[0], 5, "{threads:?}");
        assert!(threads[1..10].iter().all(|&n| n == 1), "{threads:?}");
        // A batch of one lane's share, no more, among many: its own thread.
        assert!(!on_every_core(4, 8, 1.0, 4.0));
        assert!(on_every_core(4, 8, 2.0, 4.0));
        assert!(!on_every_core(1, 1, 1.0, 1.0));
    }

    #[test]
    fn batches_timed_to_compare_sizes_take_one_thread_each() {
        // However few: a lone batch, and fewer than the lanes.
        assert_eq!(threads_of(&jobs(1, 0), 5, Lending::OneThreadEach), vec![1]);
        assert_eq!(
            threads_of(&jobs(3, 0), 5, Lending::OneThreadEach),
            vec![1; 3]
        );
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
            &HostBackend,
            Lending::Cores,
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
}
