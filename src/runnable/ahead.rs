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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use tract_core::internal::*;

/// The plans prepared ahead and how far the caller got.
struct Ahead<P> {
    ready: HashMap<usize, TractResult<P>>,
    /// Samples the caller is done with.
    consumed: usize,
    /// The caller stopped (an error): helpers take nothing more.
    stop: bool,
}

/// Calls `each(ix, prepare(ix))` for `ix` in `0..n`, in order, on the caller's thread, while
/// `helpers` threads run `prepare` for the indices ahead, at most `ahead` past the caller;
/// stops at the first error `each` returns. With no helpers, prepares each in turn.
pub(crate) fn in_order<P: Send, R>(
    n: usize,
    helpers: usize,
    ahead: usize,
    prepare: impl Fn(usize) -> TractResult<P> + Sync,
    mut each: impl FnMut(usize, TractResult<P>) -> TractResult<R>,
) -> TractResult<Vec<R>> {
    if helpers == 0 || n < 2 {
        return (0..n).map(|ix| each(ix, prepare(ix))).collect();
    }
    let ahead = ahead.max(1);
    let state = Mutex::new(Ahead {
        ready: HashMap::default(),
        consumed: 0,
        stop: false,
    });
    let changed = Condvar::new();
    let next = AtomicUsize::new(0);
    let (state, changed, next, prepare) = (&state, &changed, &next, &prepare);
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    std::thread::scope(|s| {
        for _ in 0..helpers.min(n) {
            s.spawn(move || {
                loop {
                    // Indices are taken in order: the smallest not ready is always being
                    // prepared, never waiting for room.
                    let ix = next.fetch_add(1, Ordering::AcqRel);
                    if ix >= n {
                        return;
                    }
                    {
                        let mut st = lock();
                        while ix >= st.consumed + ahead && !st.stop {
                            st = changed.wait(st).unwrap_or_else(|e| e.into_inner());
                        }
                        if st.stop {
                            return;
                        }
                    }
                    let plan = crate::no_panic(
                        || format!("Preparing the plan of sample {ix}"),
                        || prepare(ix),
                    );
                    lock().ready.insert(ix, plan);
                    changed.notify_all();
                }
            });
        }
        let mut results = Vec::with_capacity(n);
        for ix in 0..n {
            let plan = {
                let mut st = lock();
                loop {
                    if let Some(plan) = st.ready.remove(&ix) {
                        break plan;
                    }
                    st = changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            let result = each(ix, plan);
            let mut st = lock();
            st.consumed = ix + 1;
            if result.is_err() {
                st.stop = true;
            }
            drop(st);
            changed.notify_all();
            results.push(result?);
        }
        Ok(results)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

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
}
