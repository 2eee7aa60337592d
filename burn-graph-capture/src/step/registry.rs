//! The process-wide registry of which trainer owns which buffer (I6).
//!
//! Two trainers whose models share a parameter buffer must not both bake it into graphs:
//! each replay would write it behind the other's back, and once one trainer frees or
//! re-pins it the other replays into freed memory (the motivating illegal-address
//! crash). Every trainer registers the identities of the buffers its steps replace or
//! write (trainable parameters, optimizer state but the learning rate:
//! `pinning::shareable_buffers`); a buffer another live trainer holds too marks both as
//! shared, and a shared trainer runs eagerly (and drops its pins) for as long as they
//! hold it.
//!
//! Identities are only meaningful while their buffers live, so each trainer keeps the
//! tensors it registered alive until it registers their successors: a freed address
//! can never be mistaken for a share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

use crate::backend::BufferId;

/// A trainer's identity, unique within the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TrainerId(pub u64);

impl TrainerId {
    pub(crate) fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TrainerId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Who holds which buffer now. A share is decided by the buffers the trainers hold at
/// the time, not by history: trainers built from clones of one model share until their
/// first updates move each onto buffers of its own.
#[derive(Default)]
struct Registry {
    owners: HashMap<BufferId, Vec<TrainerId>>,
    buffers: HashMap<TrainerId, Vec<BufferId>>,
}

impl Registry {
    fn release(&mut self, trainer: TrainerId) {
        for id in self.buffers.remove(&trainer).unwrap_or_default() {
            if let Some(owners) = self.owners.get_mut(&id) {
                owners.retain(|owner| *owner != trainer);
                if owners.is_empty() {
                    self.owners.remove(&id);
                }
            }
        }
    }

    /// The lowest other trainer holding one of `trainer`'s buffers.
    fn shared_with(&self, trainer: TrainerId) -> Option<TrainerId> {
        self.buffers
            .get(&trainer)?
            .iter()
            .filter_map(|id| self.owners.get(id))
            .flatten()
            .filter(|owner| **owner != trainer)
            .min()
            .copied()
    }
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

/// The registry survives a panic elsewhere: its maps are updated in single steps.
fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Registers `new` as `trainer`'s buffers, in place of those it had. Returns the trainer
/// it now shares a buffer with, if any.
pub(crate) fn reregister(trainer: TrainerId, new: &[BufferId]) -> Option<TrainerId> {
    let mut registry = registry();
    registry.release(trainer);
    for id in new {
        let owners = registry.owners.entry(*id).or_default();
        if !owners.contains(&trainer) {
            owners.push(trainer);
        }
    }
    registry.buffers.insert(trainer, new.to_vec());
    registry.shared_with(trainer)
}

/// The trainer `trainer` shares a buffer with now, if any. Checked before every step:
/// the other trainer may have registered, or moved off the shared buffers, since this
/// one last did.
pub(crate) fn shared_with(trainer: TrainerId) -> Option<TrainerId> {
    registry().shared_with(trainer)
}

/// Forgets a dropped trainer and its buffers.
pub(crate) fn unregister(trainer: TrainerId) {
    registry().release(trainer);
}

/// A trainer's registered buffers, with the tensors that keep them alive. Dropping it
/// unregisters the trainer.
pub(crate) struct Registration<T> {
    trainer: TrainerId,
    buffers: Vec<(BufferId, T)>,
}

impl<T> Registration<T> {
    pub(crate) fn new(trainer: TrainerId) -> Self {
        Self {
            trainer,
            buffers: Vec::new(),
        }
    }

    /// Registers `buffers` in place of the current ones; returns the trainer this one
    /// shares a buffer with, if any.
    pub(crate) fn replace(&mut self, buffers: Vec<(BufferId, T)>) -> Option<TrainerId> {
        let new: Vec<_> = buffers.iter().map(|(id, _)| *id).collect();
        let shared = reregister(self.trainer, &new);
        // The old tensors are released only now, after their ids left the registry.
        self.buffers = buffers;
        shared
    }
}

impl<T> Drop for Registration<T> {
    fn drop(&mut self) {
        unregister(self.trainer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(values: &[u64]) -> Vec<BufferId> {
        values.iter().copied().map(BufferId).collect()
    }

    #[test]
    fn a_shared_buffer_marks_both_trainers_while_both_hold_it() {
        let (a, b, c) = (TrainerId::next(), TrainerId::next(), TrainerId::next());
        let base = u64::MAX - 1000 * a.0;
        assert_eq!(reregister(a, &ids(&[base, base + 1])), None);
        assert_eq!(reregister(c, &ids(&[base + 2])), None);
        assert_eq!(reregister(b, &ids(&[base + 1, base + 3])), Some(a));
        assert_eq!(shared_with(a), Some(b));
        assert_eq!(shared_with(c), None);
        unregister(b);
        assert_eq!(shared_with(a), None, "b is gone");
        unregister(a);
        unregister(c);
    }

    #[test]
    fn trainers_that_moved_off_their_shared_buffers_share_no_more() {
        let (a, b) = (TrainerId::next(), TrainerId::next());
        let base = u64::MAX - 1000 * a.0;
        // Clones of one model: the same buffers, until each trainer's first update.
        reregister(a, &ids(&[base, base + 1]));
        assert_eq!(reregister(b, &ids(&[base, base + 1])), Some(a));
        assert_eq!(reregister(a, &ids(&[base + 2, base + 3])), None);
        assert_eq!(shared_with(b), None, "a's update parted them");
        assert_eq!(reregister(b, &ids(&[base + 4, base + 5])), None);
        assert_eq!(
            reregister(b, &ids(&[base + 2])),
            Some(a),
            "and a new share counts"
        );
        unregister(a);
        unregister(b);
    }

    #[test]
    fn moving_to_new_buffers_releases_the_old_ones() {
        let (a, b) = (TrainerId::next(), TrainerId::next());
        let base = u64::MAX - 1000 * a.0;
        reregister(a, &ids(&[base]));
        reregister(a, &ids(&[base + 1]));
        assert_eq!(reregister(b, &ids(&[base])), None, "base was released");
        unregister(a);
        unregister(b);
    }
}
