//! Op states: what a CUDA op keeps across runs, per thread, per session and node, and
//! freed on its own thread wherever its session ends.
//!
//! cuDNN's objects belong to the thread whose handle made them (cudarc's descriptors are
//! not `Send`), so the ops that keep them across runs (convolutions' descriptors,
//! recurrences' descriptors and weight space, resizes' uploaded plans) keep them in a
//! thread-local [`OpStates`] keyed by tract's session (one plan state) and node.
//!
//! tract says that a session ended ([`EvalOp::drop_session`]) on the thread that drops
//! the plan state, which is often not the thread that ran it: a lane of the pool, a plan
//! helper, or another thread evicting a plan's per-thread state. So ending a session is
//! told to every thread:
//! - the dropping thread frees its own states of the session at once ([`end`]);
//! - while another thread still holds states of it, the session is marked ended for the
//!   process, and that thread frees them at its next [`sweep`], which a plan's plain run
//!   makes before it starts (under [`super::graph::quiet`]: freeing device memory never
//!   happens within a capture), or when the thread ends.
//!
//! A session is marked only while some thread holds a state of it, so the marks are as
//! many as the states left behind, never one per session the process ever had.
//!
//! [`EvalOp::drop_session`]: tract_core::internal::EvalOp::drop_session

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::thread::LocalKey;

use tract_core::internal::SessionId;

/// What op states are keyed by besides the node: tract's [`SessionId`] (tests use their
/// own, so that their sessions never meet a plan's).
pub trait Session: Copy + Eq + Hash + Send + 'static {
    /// The process's table of the sessions of this kind that threads hold.
    fn held() -> &'static Held<Self>;
}

static SESSIONS: LazyLock<Held<SessionId>> = LazyLock::new(Held::default);

impl Session for SessionId {
    fn held() -> &'static Held<SessionId> {
        &SESSIONS
    }
}

/// The sessions that threads' [`OpStates`] hold, and those of them that ended.
pub struct Held<S> {
    /// Bumped each time a held session ends: a thread whose [`OpStates`] saw this
    /// generation has nothing to sweep.
    generation: AtomicU64,
    table: Mutex<Table<S>>,
}

struct Table<S> {
    /// Per session: how many [`OpStates`] hold states of it.
    holders: HashMap<S, usize>,
    /// The held sessions that ended.
    ended: HashSet<S>,
}

impl<S> Default for Held<S> {
    fn default() -> Held<S> {
        Held {
            generation: AtomicU64::new(0),
            table: Mutex::new(Table {
                holders: HashMap::new(),
                ended: HashSet::new(),
            }),
        }
    }
}

impl<S: Session> Held<S> {
    /// The table; a poisoned lock guards plain counts, still right: go on.
    fn table(&self) -> MutexGuard<'_, Table<S>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn hold(&self, session: S) {
        *self.table().holders.entry(session).or_default() += 1;
    }

    fn release(&self, session: S) {
        let mut table = self.table();
        if let Some(n) = table.holders.get_mut(&session) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                table.holders.remove(&session);
                table.ended.remove(&session);
            }
        }
    }

    fn end(&self, session: S) {
        let mut table = self.table();
        if table.holders.contains_key(&session) && table.ended.insert(session) {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Sessions held by some thread (tests).
    pub fn holding(&self) -> usize {
        self.table().holders.len()
    }
}

/// One op kind's states on one thread (module doc).
pub struct OpStates<T, S: Session = SessionId> {
    states: HashMap<(S, usize), T>,
    /// Per session: how many of `states` are of it.
    sessions: HashMap<S, usize>,
    /// The generation of [`Held`] this thread last swept at.
    swept: u64,
}

impl<T, S: Session> Default for OpStates<T, S> {
    fn default() -> OpStates<T, S> {
        OpStates {
            states: HashMap::new(),
            sessions: HashMap::new(),
            swept: 0,
        }
    }
}

impl<T, S: Session> OpStates<T, S> {
    pub fn get(&self, key: &(S, usize)) -> Option<&T> {
        self.states.get(key)
    }

    pub fn get_mut(&mut self, key: &(S, usize)) -> Option<&mut T> {
        self.states.get_mut(key)
    }

    /// Puts `value` at `key`, replacing what was there.
    pub fn insert(&mut self, key: (S, usize), value: T) {
        if self.states.insert(key, value).is_none() {
            let n = self.sessions.entry(key.0).or_default();
            *n += 1;
            if *n == 1 {
                S::held().hold(key.0);
            }
        }
    }

    /// The state at `key`, made by `make` if there is none.
    pub fn get_or_try_insert_with<E>(
        &mut self,
        key: (S, usize),
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<&mut T, E> {
        if !self.states.contains_key(&key) {
            self.insert(key, make()?);
        }
        // Just there, or just put there.
        Ok(self
            .states
            .get_mut(&key)
            .expect("a state just found or made"))
    }

    fn remove(&mut self, key: &(S, usize)) -> Option<T> {
        let value = self.states.remove(key)?;
        if let Some(n) = self.sessions.get_mut(&key.0) {
            *n -= 1;
            if *n == 0 {
                self.sessions.remove(&key.0);
                S::held().release(key.0);
            }
        }
        Some(value)
    }

    /// Frees this thread's states of sessions ended on other threads.
    fn sweep(&mut self) -> Vec<T> {
        let held = S::held();
        let generation = held.generation.load(Ordering::Acquire);
        if generation == self.swept || self.states.is_empty() {
            self.swept = generation;
            return vec![];
        }
        self.swept = generation;
        let ended: Vec<(S, usize)> = {
            let table = held.table();
            self.states
                .keys()
                .filter(|(session, _)| table.ended.contains(session))
                .copied()
                .collect()
        };
        ended.iter().filter_map(|key| self.remove(key)).collect()
    }
}

impl<T, S: Session> Drop for OpStates<T, S> {
    fn drop(&mut self) {
        for session in self.sessions.keys() {
            S::held().release(*session);
        }
    }
}

/// Ends `session`'s state at `node` (an op's [`EvalOp::drop_session`]): freed here if this
/// thread holds it, and freed by every other thread holding states of the session at its
/// next [`sweep`].
///
/// [`EvalOp::drop_session`]: tract_core::internal::EvalOp::drop_session
pub fn end<T: 'static, S: Session>(
    states: &'static LocalKey<RefCell<OpStates<T, S>>>,
    session: S,
    node: usize,
) {
    // A thread ending has no states left to free here (its table went first).
    let mine = states.try_with(|s| s.borrow_mut().remove(&(session, node)));
    drop(mine);
    S::held().end(session);
}

/// Frees this thread's states (of `states`' op kind) of sessions that ended elsewhere.
/// Frees device memory: call it where no capture is under way.
pub fn sweep<T: 'static, S: Session>(states: &'static LocalKey<RefCell<OpStates<T, S>>>) {
    let freed = states.try_with(|s| s.borrow_mut().sweep());
    // Dropped out of the borrow: a state's drop may not reach back into the table.
    drop(freed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    /// Sessions of these tests only.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    struct TestSession(u64);

    static TEST_SESSIONS: LazyLock<Held<TestSession>> = LazyLock::new(Held::default);

    impl Session for TestSession {
        fn held() -> &'static Held<TestSession> {
            &TEST_SESSIONS
        }
    }

    /// Counts its drops.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    thread_local! {
        static STATES: RefCell<OpStates<Counted, TestSession>> = RefCell::default();
    }

    #[test]
    fn a_session_ended_on_another_thread_is_freed_at_the_holders_next_sweep() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let (a, b) = (TestSession(1), TestSession(2));
        let (tell, told) = std::sync::mpsc::channel::<()>();
        let (report, reported) = std::sync::mpsc::channel::<usize>();
        let lane = std::thread::spawn({
            let dropped = dropped.clone();
            move || {
                // The lane holds two nodes of `a` and one of `b`.
                STATES.with_borrow_mut(|s| {
                    for key in [(a, 0), (a, 3), (b, 0)] {
                        s.insert(key, Counted(dropped.clone()));
                    }
                });
                let _ = report.send(0);
                // Told once `a` ended on the test's thread.
                let _ = told.recv();
                sweep(&STATES);
                let _ = report.send(dropped.load(Ordering::SeqCst));
                // Ends when told nothing more.
                let _ = told.recv();
            }
        });
        reported.recv().unwrap();
        assert_eq!(TEST_SESSIONS.holding(), 2);

        // `a` ends on this thread, which holds one node of it too.
        STATES.with_borrow_mut(|s| s.insert((a, 3), Counted(dropped.clone())));
        end(&STATES, a, 0);
        end(&STATES, a, 3);
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            1,
            "this thread's own state of a"
        );
        assert_eq!(TEST_SESSIONS.holding(), 2, "the lane still holds a and b");

        tell.send(()).unwrap();
        assert_eq!(
            reported.recv().unwrap(),
            3,
            "the lane's two states of a, swept"
        );
        assert_eq!(TEST_SESSIONS.holding(), 1, "the lane still holds b");
        assert!(TEST_SESSIONS.table().ended.is_empty());

        drop(tell);
        lane.join().unwrap();
        assert_eq!(
            dropped.load(Ordering::SeqCst),
            4,
            "b, freed as the lane ended"
        );
        assert_eq!(TEST_SESSIONS.holding(), 0);
    }
}
