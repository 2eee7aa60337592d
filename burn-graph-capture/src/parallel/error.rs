//! Why a data-parallel group cannot go on: typed, so that a rank learns which peer failed
//! and how, instead of waiting forever in a collective.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A data-parallel failure. Once a group has failed, every rank's next step (or the one in
/// progress) returns it, and the group cannot be used again: build a new one.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum DistError {
    /// A rank's thread unwound (a panic) while it was a member: its peers may be waiting
    /// for collectives it will never join, so the group's communicators were aborted.
    #[error("rank {rank} was lost (its thread panicked); the group was aborted")]
    RankLost {
        /// The lost rank.
        rank: usize,
    },
    /// A rank left the group (its trainer was dropped) while others still stepped: the
    /// ranks ran different numbers of steps.
    #[error("rank {rank} left the group while other ranks still step")]
    RankLeft {
        /// The rank that left.
        rank: usize,
    },
    /// A rank waited longer than the group's timeout for the others.
    #[error(
        "rank {rank} waited {waited_ms} ms for rank(s) {missing:?}; the group was aborted \
         (timeout {timeout_ms} ms)"
    )]
    Timeout {
        /// The rank that gave up waiting.
        rank: usize,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
        /// How long it waited, in milliseconds.
        waited_ms: u64,
        /// The group's timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// A rank failed inside a step, where its peers may already have entered the step's
    /// collectives: the group was aborted.
    #[error("rank {rank} failed inside a step: {detail}; the group was aborted")]
    RankFailed {
        /// The failed rank.
        rank: usize,
        /// What failed.
        detail: String,
    },
    /// The group was aborted by its owner (`DataParallel::abort`).
    #[error("the group was aborted: {0}")]
    Aborted(String),
    /// The ranks do not train the same thing: other parameter shapes, another world size
    /// or another backend.
    #[error("the ranks disagree: {0}")]
    Mismatch(String),
    /// A collective could not be set up or queued (NCCL missing or refusing, a backend
    /// without collectives).
    #[error("collective failed: {0}")]
    Collective(String),
    /// Bad arguments to a group (a rank out of range, a rank taken twice, no ranks).
    #[error("invalid group use: {0}")]
    InvalidUse(String),
}

impl DistError {
    /// Whether peers may be stuck in collectives this failure leaves unfinished, so that
    /// the group's communicators must be aborted. A rank that left after a finished step
    /// leaves no collective unfinished: aborting then would cut the others' last one.
    pub fn aborts(&self) -> bool {
        !matches!(
            self,
            DistError::RankLeft { .. } | DistError::Mismatch(_) | DistError::InvalidUse(_)
        )
    }
}
