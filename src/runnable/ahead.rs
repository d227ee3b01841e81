//! Plans prepared ahead: one by one, the plans of the next samples prepared on other
//! threads while the current sample runs.
//!
//! The reference runs each sample alone on the original model at its own widths: a plan
//! per width, and samples of many widths meet a new one at nearly every sample. On the host
//! preparing a plan costs about as much as running the sample (PP-OCRv4 rec: tens of
//! milliseconds each, benches/NOTES.md), so one by one on one thread spent close to half
//! its time preparing. The samples still run one after the other on the caller's thread, each on
//! the same plan as before: only when its plan is prepared changes, never a result. How
//! many helpers is the backend's to say ([`crate::backend::Backend::plan_helpers`]).
//! Helpers stay at most two samples each ahead, so that the plans waiting take little
//! memory.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, OnceLock};

use tract_core::internal::*;

/// The most helpers a call gets: the threads of the pool they run on.
pub(crate) const MOST_HELPERS: usize = 12;

/// The helpers' threads, kept for the process rather than spawned per call: a device
/// runtime keeps per-thread state (tract-cuda's stream and its library handles) that a
/// thread frees as it ends, and freeing device memory synchronises the device, which
/// breaks another thread's graph capture in flight. None where no thread can be had.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(MOST_HELPERS)
            .thread_name(|i| format!("tract-ragged-plans-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// The plans prepared ahead, and what is being prepared.
struct Ahead<P> {
    ready: HashMap<usize, TractResult<P>>,
    /// Per index, whether a thread (a helper, or the caller) took its preparation.
    taken: Vec<bool>,
    /// The next index not handed out yet.
    next: usize,
    /// Samples the caller is done with.
    consumed: usize,
    /// Preparations handed to helpers and not over yet (started or not).
    in_flight: usize,
}

/// What a call's helpers share.
struct Shared<P, F> {
    state: Mutex<Ahead<P>>,
    changed: Condvar,
    prepare: F,
    n: usize,
    helpers: usize,
    ahead: usize,
}

impl<P: Send, F: Fn(usize) -> TractResult<P> + Sync> Shared<P, F> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ahead<P>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn prepared(&self, ix: usize) -> TractResult<P> {
        crate::no_panic(
            || format!("Preparing the plan of sample {ix}"),
            || (self.prepare)(ix),
        )
    }

    /// Hands the next indices out to helpers while there is room: fewer than `helpers`
    /// in flight, none more than `ahead` past the caller.
    fn hand_out<'s>(&'s self, scope: &rayon::Scope<'s>) {
        let mut st = self.lock();
        while st.in_flight < self.helpers && st.next < self.n.min(st.consumed + self.ahead) {
            let job = st.next;
            st.next += 1;
            st.in_flight += 1;
            scope.spawn(move |scope| self.help(job, scope));
        }
    }

    /// A helper's job: prepares `job` unless the caller took it, then hands out more.
    fn help<'s>(&'s self, job: usize, scope: &rayon::Scope<'s>) {
        let mine = !std::mem::replace(&mut self.lock().taken[job], true);
        let plan = mine.then(|| self.prepared(job));
        let mut st = self.lock();
        if let Some(plan) = plan {
            st.ready.insert(job, plan);
        }
        st.in_flight -= 1;
        drop(st);
        self.changed.notify_all();
        self.hand_out(scope);
    }

    /// Sample `ix`'s plan: prepared by a helper, or here where no helper started it.
    fn take(&self, ix: usize) -> TractResult<P> {
        let mut st = self.lock();
        st.next = st.next.max(ix + 1);
        loop {
            if let Some(plan) = st.ready.remove(&ix) {
                return plan;
            }
            if !std::mem::replace(&mut st.taken[ix], true) {
                drop(st);
                return self.prepared(ix);
            }
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Calls `each(ix, prepare(ix))` for `ix` in `0..n`, in order, on the caller's thread, while
/// up to `helpers` threads of the pool run `prepare` for the indices ahead, at most `ahead`
/// past the caller; stops at the first error `each` returns. With no helpers, prepares
/// each in turn.
///
/// Each preparation is a job of its own, handed out (by the caller, or by a helper as it
/// finishes one) only where there is room ahead, so that a job never waits and calls at
/// once share the pool's threads preparation by preparation; the caller prepares a
/// sample itself where no helper started it yet (the pool's threads busy with other
/// calls).
pub(crate) fn in_order<P: Send, R>(
    n: usize,
    helpers: usize,
    ahead: usize,
    prepare: impl Fn(usize) -> TractResult<P> + Sync,
    mut each: impl FnMut(usize, TractResult<P>) -> TractResult<R>,
) -> TractResult<Vec<R>> {
    let pool = pool().filter(|_| helpers > 0 && n >= 2);
    let Some(pool) = pool else {
        return (0..n).map(|ix| each(ix, prepare(ix))).collect();
    };
    let shared = Shared {
        state: Mutex::new(Ahead {
            ready: HashMap::default(),
            taken: vec![false; n],
            next: 0,
            consumed: 0,
            in_flight: 0,
        }),
        changed: Condvar::new(),
        prepare,
        n,
        helpers: helpers.min(MOST_HELPERS),
        ahead: ahead.max(1),
    };
    let shared = &shared;
    pool.in_place_scope(|scope| {
        let mut results = Vec::with_capacity(n);
        for ix in 0..n {
            shared.hand_out(scope);
            let plan = shared.take(ix);
            // An error stops the run; preparations in flight finish with the scope, and
            // hand out no more.
            let result = each(ix, plan);
            let mut st = shared.lock();
            st.consumed = ix + 1;
            if result.is_err() {
                st.next = n;
            }
            drop(st);
            results.push(result?);
        }
        Ok(results)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Every index prepared once and consumed in order; never more than `ahead` past the
    /// caller; an error stops the run and is the answer.
    #[test]
    fn plans_come_in_order_and_never_too_far_ahead() {
        let consumed = AtomicUsize::new(0);
        let prepared = Mutex::new(vec![]);
        let results = in_order(
            50,
            3,
            4,
            |ix| {
                assert!(
                    ix < consumed.load(Ordering::SeqCst) + 4,
                    "{ix} too far ahead"
                );
                prepared.lock().unwrap().push(ix);
                Ok(ix * 10)
            },
            |ix, plan| {
                assert_eq!(plan?, ix * 10);
                consumed.store(ix + 1, Ordering::SeqCst);
                Ok(ix)
            },
        )
        .unwrap();
        assert_eq!(results, (0..50).collect::<Vec<_>>());
        let mut prepared = prepared.into_inner().unwrap();
        prepared.sort();
        assert_eq!(prepared, (0..50).collect::<Vec<_>>());
        let failed = in_order(
            50,
            2,
            3,
            |ix| match ix {
                7 => bail!("no plan for 7"),
                _ => Ok(ix),
            },
            |_, plan| plan,
        );
        assert!(format!("{:?}", failed.unwrap_err()).contains("no plan for 7"));
        // A panic while preparing is an error of that sample, not a hang.
        let panicked = in_order(
            10,
            2,
            3,
            |ix| {
                assert!(ix != 4, "boom");
                Ok(ix)
            },
            |_, plan| plan,
        );
        assert!(format!("{:?}", panicked.unwrap_err()).contains("sample 4"));
    }

    /// A call whose helpers cannot start (another call holds every thread of the pool)
    /// prepares its plans itself and answers all its samples.
    #[test]
    fn a_call_goes_on_while_another_holds_every_helper() {
        let released = (Mutex::new(false), Condvar::new());
        let started = AtomicUsize::new(0);
        let answered = (Mutex::new(0usize), Condvar::new());
        std::thread::scope(|s| {
            let held = s.spawn(|| {
                in_order(
                    2 * MOST_HELPERS,
                    MOST_HELPERS,
                    MOST_HELPERS,
                    |ix| {
                        started.fetch_add(1, Ordering::SeqCst);
                        let mut go = released.0.lock().unwrap();
                        while !*go {
                            go = released.1.wait(go).unwrap();
                        }
                        Ok(ix)
                    },
                    |_, plan| plan,
                )
            });
            while started.load(Ordering::SeqCst) < MOST_HELPERS {
                std::thread::yield_now();
            }
            let other = s.spawn(|| {
                in_order(
                    20,
                    3,
                    6,
                    |ix| Ok(ix * 2),
                    |ix, plan| {
                        assert_eq!(plan?, ix * 2);
                        *answered.0.lock().unwrap() += 1;
                        answered.1.notify_all();
                        Ok(ix)
                    },
                )
            });
            // Every sample of the other call answered while the pool is held.
            let mut count = answered.0.lock().unwrap();
            while *count < 20 {
                count = answered.1.wait(count).unwrap();
            }
            drop(count);
            *released.0.lock().unwrap() = true;
            released.1.notify_all();
            assert_eq!(other.join().unwrap().unwrap(), (0..20).collect::<Vec<_>>());
            let held = held.join().unwrap().unwrap();
            assert_eq!(held, (0..2 * MOST_HELPERS).collect::<Vec<_>>());
        });
    }
}
