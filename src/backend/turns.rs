//! Turns: the runs of one call's lanes on a device, one after the other.
//!
//! On a GPU one batch's kernels fill the device: two batches' runs at once each take about
//! twice as long, and lanes started together stay in step (both upload, both run at half
//! speed, both bring their outputs back while the device waits: measured on the H200,
//! benches/NOTES.md). So where the backend says runs take turns
//! ([`crate::backend::Backend::runs_take_turns`]), the lanes of one call run their plans
//! one at a time (`in_turn`) and overlap only the rest: while one lane's batch runs,
//! another packs and uploads the next one and waits for its turn, a third brings the last
//! batch's outputs back and crops them.
//!
//! A turn is the right to queue work on the device, not to wait for it. A plan that has
//! queued all of a run's work hands the turn on with a **mark** ([`queued`]; on CUDA an
//! event recorded on its stream after its last kernel) and only then waits for its work.
//! The next lane's plan orders its own work after that mark ([`follow`]; its stream waits
//! for the event) and queues at once: its launches on the host overlap the device running
//! the previous batch, and its kernels start where those end, never beside them. A plan
//! that hands nothing on keeps the turn until its run returns, its work done.
//!
//! `TRACT_RAGGED_TURNS=0` lets the lanes launch at once instead, each batch's kernels beside
//! the others' on the device: for batches whose launches cost the host more than their
//! kernels cost the device (small batches run plain, as a server's are), where one
//! launcher at a time leaves the device waiting.
//!
//! Turns only order work in time; no result depends on them. Outside a call whose runs
//! take turns (a single batch, a single lane, the host), `in_turn` runs at once and
//! [`follow`] and [`queued`] do nothing. A backend of one's own
//! ([`crate::RaggedModel::into_runnable_on`]) that says its runs take turns calls
//! [`follow`] and [`queued`] from its plans as ragged-cuda's do (`crate::cuda::graph`).

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::timeline::{self, Phase};

/// Whether the lanes of one call on `backend` take turns: where the backend says its runs
/// should ([`crate::backend::Backend::runs_take_turns`]), unless `TRACT_RAGGED_TURNS` is
/// off.
pub(crate) fn taken(backend: &dyn crate::backend::Backend) -> bool {
    backend.runs_take_turns() && crate::knobs::TRACT_RAGGED_TURNS.get()
}

/// What a run leaves for the next turn to order its work after (on CUDA, an event).
pub type Mark = Box<dyn Any + Send>;

/// The turns of one call's lanes (module doc).
#[derive(Default)]
pub(crate) struct Turns {
    state: Mutex<State>,
    handed_on: Condvar,
}

#[derive(Default)]
struct State {
    /// A lane holds the turn.
    taken: bool,
    /// The mark the last run handed on with, for the next one to follow.
    mark: Option<Mark>,
}

impl Turns {
    /// Waits for the turn and takes it, with the mark the last run left.
    fn take(&self) -> Option<Mark> {
        // The lock only orders runs: a poisoned one still does.
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while state.taken {
            state = self
                .handed_on
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        state.taken = true;
        state.mark.take()
    }

    fn hand_on(&self, mark: Option<Mark>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.taken = false;
        state.mark = mark;
        drop(state);
        self.handed_on.notify_one();
    }
}

/// The calling thread's part in a call's turns.
struct Joined {
    turns: Arc<Turns>,
    /// The thread holds the turn now.
    holding: bool,
    /// The previous run's mark, while the thread holds the turn and has not followed it.
    mark: Option<Mark>,
}

thread_local! {
    static JOINED: RefCell<Option<Joined>> = const { RefCell::new(None) };
    /// Time the calling thread waited for turns since it last asked ([`waited`]).
    static WAITED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// A lane's thread taking a call's turns while it lives (module doc); on drop, a panic
/// included, the thread leaves them, handing on a turn it still holds, and takes up again
/// the turns it was in before: a lane waiting on another pool may run another call's
/// lane on the same thread meanwhile (rayon runs a waiting thread's pending work).
pub(crate) struct TakingTurns {
    before: Option<Joined>,
}

impl TakingTurns {
    pub fn join(turns: &Arc<Turns>) -> TakingTurns {
        let before = JOINED.with(|j| {
            j.borrow_mut().replace(Joined {
                turns: turns.clone(),
                holding: false,
                mark: None,
            })
        });
        TakingTurns { before }
    }
}

impl Drop for TakingTurns {
    fn drop(&mut self) {
        release(None);
        let before = self.before.take();
        JOINED.with(|j| *j.borrow_mut() = before);
    }
}

/// Hands the turn on with `mark` if the calling thread holds it.
fn release(mark: Option<Mark>) {
    let turns = JOINED.with(|j| {
        let mut j = j.borrow_mut();
        let joined = j.as_mut().filter(|j| j.holding)?;
        joined.holding = false;
        joined.mark = None;
        Some(joined.turns.clone())
    });
    if let Some(turns) = turns {
        turns.hand_on(mark);
    }
}

/// Hands the turn back when the run is over, however it ends, if the plan did not.
struct Holding;

impl Drop for Holding {
    fn drop(&mut self) {
        // The run returned: its work is done, the next needs no mark to follow.
        release(None);
    }
}

/// Runs `f`, the plan of a batch of `samples` padded to `extents`, in the calling lane's
/// turn (module doc); at once outside a call whose runs take turns. The wait is the
/// timeline's [`Phase::Turn`].
pub(crate) fn in_turn<R>(samples: usize, extents: &[usize], f: impl FnOnce() -> R) -> R {
    let Some(turns) = JOINED.with(|j| j.borrow().as_ref().map(|j| j.turns.clone())) else {
        return f();
    };
    let asked = Instant::now();
    let mark = timeline::phase(Phase::Turn, samples, extents, || turns.take());
    WAITED.with(|w| w.set(w.get() + asked.elapsed()));
    JOINED.with(|j| {
        if let Some(joined) = j.borrow_mut().as_mut() {
            joined.holding = true;
            joined.mark = mark;
        }
    });
    let _holding = Holding;
    f()
}

/// Orders the calling thread's device work after the previous run's: `f` gets the mark
/// that run handed on, if the thread holds the turn and there is one. Called by a plan
/// before it queues any work.
pub fn follow(f: impl FnOnce(&Mark)) {
    let mark = JOINED.with(|j| {
        j.borrow_mut()
            .as_mut()
            .filter(|j| j.holding)
            .and_then(|j| j.mark.take())
    });
    if let Some(mark) = mark {
        f(&mark)
    }
}

/// Whether the calling thread holds a turn now: whether a plan should make a mark for
/// [`queued`].
pub fn holding() -> bool {
    JOINED.with(|j| j.borrow().as_ref().is_some_and(|j| j.holding))
}

/// Hands the turn on, `mark` after the run's last queued work, when the calling thread
/// holds it: the plan has queued all its work and only waits for it now.
pub fn queued(mark: Mark) {
    release(Some(mark));
}

/// How long the calling thread waited for turns since the last call: another batch's
/// run, not part of what its own batch cost.
pub(crate) fn waited() -> Duration {
    WAITED.with(|w| w.replace(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Runs 3 threads x 5 runs in turns; each run records how many runs were in their
    /// queueing part at once, and the order marks were handed on in.
    #[test]
    fn runs_queue_one_at_a_time_and_each_follows_the_last_mark() {
        let turns = Arc::new(Turns::default());
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let followed = Mutex::new(vec![]);
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let _t = TakingTurns::join(&turns);
                    for _ in 0..5 {
                        in_turn(1, &[8], || {
                            assert!(holding());
                            let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(at_once, Ordering::SeqCst);
                            follow(|m| {
                                if let Some(ix) = m.downcast_ref::<usize>() {
                                    followed.lock().unwrap().push(*ix);
                                }
                            });
                            std::thread::sleep(Duration::from_millis(1));
                            let ix = next.fetch_add(1, Ordering::SeqCst);
                            now.fetch_sub(1, Ordering::SeqCst);
                            // Every other run hands on early, the others when they end.
                            if ix.is_multiple_of(2) {
                                queued(Box::new(ix));
                                assert!(!holding());
                            }
                        });
                    }
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 1, "two runs queued at once");
        // Each mark handed on early is followed by the run right after it, and only by it.
        let followed = followed.into_inner().unwrap();
        let expected: Vec<usize> = (0..14).step_by(2).collect();
        assert_eq!(followed, expected);
    }

    /// A lane that runs another call's lane on its thread meanwhile (rayon's waiting
    /// threads do) finds its own turns again after it.
    #[test]
    fn a_lane_run_within_another_leaves_it_its_turns() {
        let (outer, inner) = (Arc::new(Turns::default()), Arc::new(Turns::default()));
        let _outer = TakingTurns::join(&outer);
        {
            let _inner = TakingTurns::join(&inner);
            in_turn(1, &[8], || assert!(holding()));
        }
        in_turn(1, &[8], || {
            assert!(holding());
            queued(Box::new(3usize));
        });
        // The outer call's mark went to the outer turns, none to the inner ones.
        assert!(
            outer
                .take()
                .is_some_and(|m| m.downcast_ref::<usize>() == Some(&3))
        );
        assert!(inner.take().is_none());
    }

    #[test]
    fn outside_turns_runs_at_once_and_marks_go_nowhere() {
        assert!(!holding());
        let ran = in_turn(1, &[8], || {
            follow(|_| panic!("no mark outside turns"));
            queued(Box::new(1usize));
            7
        });
        assert_eq!(ran, 7);
        assert_eq!(waited(), Duration::ZERO);
    }
}
