//! The process-wide registry of which trainer owns which buffer (I6).
//!
//! Two trainers whose models share a parameter buffer must not both bake it into graphs:
//! each replay would write it behind the other's back, and once one trainer frees or
//! re-pins it the other replays into freed memory (the motivating illegal-address
//! crash). Every trainer registers the identities of its parameter and optimizer-state
//! buffers; a buffer already owned by another live trainer marks both as shared, and a
//! shared trainer runs eagerly for its lifetime.
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

#[derive(Default)]
struct Registry {
    owners: HashMap<BufferId, TrainerId>,
    /// Trainer to the first other trainer it was found sharing a buffer with.
    shared: HashMap<TrainerId, TrainerId>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

/// The registry survives a panic elsewhere: its maps are updated in single steps.
fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Replaces `trainer`'s registered buffers `old` by `new`. Returns the trainer it shares
/// a buffer with, if any (now or earlier: sharing is sticky).
pub(crate) fn reregister(
    trainer: TrainerId,
    old: &[BufferId],
    new: &[BufferId],
) -> Option<TrainerId> {
    let mut registry = registry();
    for id in old {
        if registry.owners.get(id) == Some(&trainer) {
            registry.owners.remove(id);
        }
    }
    for id in new {
        match registry.owners.get(id).copied() {
            Some(owner) if owner != trainer => {
                registry.shared.entry(trainer).or_insert(owner);
                registry.shared.entry(owner).or_insert(trainer);
            }
            Some(_) => {}
            None => {
                registry.owners.insert(*id, trainer);
            }
        }
    }
    registry.shared.get(&trainer).copied()
}

/// The trainer `trainer` shares a buffer with, if any. Checked before every step: the
/// other trainer may have registered since this one last did.
pub(crate) fn shared_with(trainer: TrainerId) -> Option<TrainerId> {
    registry().shared.get(&trainer).copied()
}

/// Forgets a dropped trainer: its buffers, and the shares that named it.
pub(crate) fn unregister(trainer: TrainerId, ids: &[BufferId]) {
    let mut registry = registry();
    for id in ids {
        if registry.owners.get(id) == Some(&trainer) {
            registry.owners.remove(id);
        }
    }
    registry.shared.remove(&trainer);
    registry.shared.retain(|_, other| *other != trainer);
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
        let old = self.ids();
        let new: Vec<_> = buffers.iter().map(|(id, _)| *id).collect();
        let shared = reregister(self.trainer, &old, &new);
        // The old tensors are released only now, after their ids left the registry.
        self.buffers = buffers;
        shared
    }

    fn ids(&self) -> Vec<BufferId> {
        self.buffers.iter().map(|(id, _)| *id).collect()
    }
}

impl<T> Drop for Registration<T> {
    fn drop(&mut self) {
        unregister(self.trainer, &self.ids());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(values: &[u64]) -> Vec<BufferId> {
        values.iter().copied().map(BufferId).collect()
    }

    #[test]
    fn a_shared_buffer_marks_both_trainers_until_one_is_dropped() {
        let (a, b, c) = (TrainerId::next(), TrainerId::next(), TrainerId::next());
        let base = u64::MAX - 1000 * a.0;
        assert_eq!(reregister(a, &[], &ids(&[base, base + 1])), None);
        assert_eq!(reregister(c, &[], &ids(&[base + 2])), None);
        assert_eq!(reregister(b, &[], &ids(&[base + 1, base + 3])), Some(a));
        assert_eq!(reregister(a, &[], &[]), Some(b));
        assert_eq!(reregister(c, &[], &[]), None);
        unregister(b, &ids(&[base + 1, base + 3]));
        assert_eq!(reregister(a, &[], &[]), None);
        unregister(a, &ids(&[base, base + 1]));
        unregister(c, &ids(&[base + 2]));
    }

    #[test]
    fn moving_to_new_buffers_releases_the_old_ones() {
        let (a, b) = (TrainerId::next(), TrainerId::next());
        let base = u64::MAX - 1000 * a.0;
        reregister(a, &[], &ids(&[base]));
        reregister(a, &ids(&[base]), &ids(&[base + 1]));
        assert_eq!(reregister(b, &[], &ids(&[base])), None, "base was released");
        unregister(a, &ids(&[base + 1]));
        unregister(b, &ids(&[base]));
    }
}
