//! Where a group's ranks meet on the host: an all-gather of small byte payloads, with a
//! timeout, liveness and a sticky failure ([`Meeting`]). Ranks that are threads of one
//! process meet in memory ([`Rendezvous`], here); ranks that are processes meet over TCP
//! (`tcp`).
//!
//! Every agreement between ranks (how the next step runs) and every collective of a CPU
//! backend goes through [`Meeting::all_gather`]: each rank gives its payload and gets
//! every rank's, in rank order, so each rank can compute the same decision from the same
//! inputs. Ranks call it in the same order; a round completes when every rank gave its
//! payload. It never waits forever: a rank that left or was lost, a failure elsewhere, or
//! the timeout ends the wait with a [`DistError`], and a failure stays (every later call
//! returns it).

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::error::{DistError, GroupMisuse};

/// What runs once when a group fails abortively: aborting its communicators, so that
/// peers stuck in a device collective are released.
pub(crate) type FailureHook = Box<dyn Fn(&DistError) + Send + Sync>;

/// The host meeting point of one group, whatever carries it.
pub(crate) trait Meeting: Send + Sync {
    /// Number of ranks.
    fn world(&self) -> usize;
    /// The longest wait for the other ranks.
    fn timeout(&self) -> Duration;
    /// Every rank's payload of this round, in rank order.
    fn all_gather(&self, rank: usize, payload: Vec<u8>) -> Result<Arc<Vec<Vec<u8>>>, DistError>;
    /// Fails the group with `error` unless it failed already; returns the group's failure.
    fn fail(&self, error: DistError) -> DistError;
    /// The group's failure, if it failed.
    fn failure(&self) -> Option<DistError>;
    /// Notes that `rank` left: cleanly, after its last step, or lost (its thread
    /// unwound), which fails the group at once.
    fn leave(&self, rank: usize, lost: bool);
    /// Runs `hook` when the group fails abortively (at once if it already did).
    fn on_failure(&self, hook: FailureHook);
}

/// The meeting point of ranks that are threads of one process.
pub(crate) struct Rendezvous {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    turn: Condvar,
    hooks: Mutex<Vec<FailureHook>>,
}

struct State {
    /// Rounds completed so far.
    round: u64,
    /// This round's payloads, by rank.
    given: Vec<Option<Vec<u8>>>,
    /// The last completed round's payloads.
    published: Arc<Vec<Vec<u8>>>,
    /// Ranks that left (cleanly or not).
    gone: Vec<bool>,
    failure: Option<DistError>,
}

impl Rendezvous {
    pub(crate) fn new(world: usize, timeout: Duration) -> Self {
        Self {
            world,
            timeout,
            state: Mutex::new(State {
                round: 0,
                given: vec![None; world],
                published: Arc::new(Vec::new()),
                gone: vec![false; world],
                failure: None,
            }),
            turn: Condvar::new(),
            hooks: Mutex::new(Vec::new()),
        }
    }

    /// The state survives a panic of a rank holding the lock: every update is one step.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fail_locked(&self, mut state: MutexGuard<'_, State>, error: DistError) -> DistError {
        if let Some(failure) = &state.failure {
            return failure.clone();
        }
        state.failure = Some(error.clone());
        self.turn.notify_all();
        drop(state);
        if error.aborts() {
            tracing::error!(%error, "data-parallel group failed; aborting its communicators");
            let hooks =
                std::mem::take(&mut *self.hooks.lock().unwrap_or_else(PoisonError::into_inner));
            for hook in hooks {
                hook(&error);
            }
        } else {
            tracing::warn!(%error, "data-parallel group failed");
        }
        error
    }
}

impl Meeting for Rendezvous {
    fn world(&self) -> usize {
        self.world
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Every rank's payload of this round, in rank order.
    fn all_gather(&self, rank: usize, payload: Vec<u8>) -> Result<Arc<Vec<Vec<u8>>>, DistError> {
        let started = Instant::now();
        let mut state = self.state();
        if let Some(failure) = &state.failure {
            return Err(failure.clone());
        }
        if let Some(left) = state.gone.iter().position(|gone| *gone) {
            return Err(self.fail_locked(state, DistError::RankLeft { rank: left }));
        }
        if state.given[rank].is_some() {
            let error = DistError::InvalidUse(GroupMisuse::TwoPayloads { rank });
            return Err(self.fail_locked(state, error));
        }
        state.given[rank] = Some(payload);
        let round = state.round;
        if state.given.iter().all(Option::is_some) {
            let payloads = state.given.iter_mut().map(|p| p.take().unwrap_or_default());
            state.published = Arc::new(payloads.collect());
            state.round += 1;
            self.turn.notify_all();
            return Ok(state.published.clone());
        }
        loop {
            let left = self.timeout.saturating_sub(started.elapsed());
            let (next, _) = self
                .turn
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner);
            state = next;
            if state.round > round {
                // The next round cannot complete without this rank: `published` is ours.
                return Ok(state.published.clone());
            }
            if let Some(failure) = &state.failure {
                return Err(failure.clone());
            }
            if let Some(left) = state.gone.iter().position(|gone| *gone) {
                return Err(self.fail_locked(state, DistError::RankLeft { rank: left }));
            }
            if started.elapsed() >= self.timeout {
                let missing = (0..self.world)
                    .filter(|r| state.given[*r].is_none())
                    .collect();
                let error = DistError::Timeout {
                    rank,
                    missing,
                    waited_ms: started.elapsed().as_millis() as u64,
                    timeout_ms: self.timeout.as_millis() as u64,
                };
                return Err(self.fail_locked(state, error));
            }
        }
    }

    /// Fails the group with `error` unless it failed already; returns the group's failure.
    fn fail(&self, error: DistError) -> DistError {
        self.fail_locked(self.state(), error)
    }

    /// The group's failure, if it failed.
    fn failure(&self) -> Option<DistError> {
        self.state().failure.clone()
    }

    /// Notes that `rank` left: cleanly, after its last step, or lost (its thread unwound),
    /// which fails the group at once.
    fn leave(&self, rank: usize, lost: bool) {
        let mut state = self.state();
        state.gone[rank] = true;
        if lost {
            self.fail_locked(state, DistError::RankLost { rank });
        } else {
            self.turn.notify_all();
        }
    }

    /// Runs `hook` when the group fails abortively (at once if it already did).
    fn on_failure(&self, hook: FailureHook) {
        let failure = {
            let state = self.state();
            let mut hooks = self.hooks.lock().unwrap_or_else(PoisonError::into_inner);
            match &state.failure {
                Some(failure) if failure.aborts() => Some(failure.clone()),
                _ => {
                    hooks.push(hook);
                    return;
                }
            }
        };
        if let Some(failure) = failure {
            hook(&failure);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread;

    fn gather_all(rv: &Arc<Rendezvous>, rounds: usize) -> Vec<Vec<Vec<Vec<u8>>>> {
        let handles: Vec<_> = (0..rv.world())
            .map(|rank| {
                let rv = rv.clone();
                thread::spawn(move || {
                    (0..rounds)
                        .map(|round| {
                            let payload = vec![rank as u8, round as u8];
                            rv.all_gather(rank, payload).unwrap().as_ref().clone()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn every_rank_gets_every_payload_in_rank_order_each_round() {
        let rv = Arc::new(Rendezvous::new(3, Duration::from_secs(10)));
        let seen = gather_all(&rv, 50);
        for rank_view in &seen {
            for (round, payloads) in rank_view.iter().enumerate() {
                let expected: Vec<Vec<u8>> =
                    (0..3).map(|rank| vec![rank as u8, round as u8]).collect();
                assert_eq!(payloads, &expected);
            }
        }
    }

    #[test]
    fn a_lone_rank_gathers_its_own_payload() {
        let rv = Rendezvous::new(1, Duration::from_millis(10));
        assert_eq!(rv.all_gather(0, vec![7]).unwrap().as_ref(), &vec![vec![7]]);
    }

    #[test]
    fn a_missing_rank_times_out_with_the_ranks_missing_and_runs_the_hooks_once() {
        let rv = Rendezvous::new(3, Duration::from_millis(100));
        let aborted = Arc::new(AtomicUsize::new(0));
        let count = aborted.clone();
        rv.on_failure(Box::new(move |_| {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        let started = Instant::now();
        let error = rv.all_gather(1, vec![]).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(100));
        let DistError::Timeout { rank, missing, .. } = &error else {
            panic!("{error:?}");
        };
        assert_eq!((*rank, missing.as_slice()), (1, &[0, 2][..]));
        // Sticky, and the hooks ran once.
        assert_eq!(rv.all_gather(0, vec![]).unwrap_err(), error);
        assert_eq!(aborted.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_lost_rank_wakes_its_waiting_peers_at_once() {
        let rv = Arc::new(Rendezvous::new(2, Duration::from_secs(60)));
        let waiter = {
            let rv = rv.clone();
            thread::spawn(move || {
                let started = Instant::now();
                (rv.all_gather(0, vec![1]), started.elapsed())
            })
        };
        thread::sleep(Duration::from_millis(50));
        rv.leave(1, true);
        let (result, waited) = waiter.join().unwrap();
        assert_eq!(result.unwrap_err(), DistError::RankLost { rank: 1 });
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[test]
    fn a_rank_that_left_cleanly_fails_the_next_round_without_aborting() {
        let rv = Rendezvous::new(2, Duration::from_secs(60));
        let aborted = Arc::new(AtomicUsize::new(0));
        let count = aborted.clone();
        rv.on_failure(Box::new(move |_| {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        rv.leave(1, false);
        assert_eq!(
            rv.all_gather(0, vec![]).unwrap_err(),
            DistError::RankLeft { rank: 1 }
        );
        assert_eq!(aborted.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_hook_added_after_an_abortive_failure_runs_at_once() {
        let rv = Rendezvous::new(2, Duration::from_secs(1));
        rv.fail(DistError::Aborted("test".into()));
        let ran = Arc::new(AtomicUsize::new(0));
        let count = ran.clone();
        rv.on_failure(Box::new(move |_| {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}
