//! [`Collectives`]: what a backend does for a data-parallel group's steps.
//!
//! Bound only where data-parallel training is set up (`GraphTrainer::data_parallel`):
//! backends without collectives train on one rank.

use burn::tensor::ops::FloatTensor;
use burn_backend::Backend;

use super::{DistError, RankLink};

/// Collectives over the ranks of a group, on the backend's own tensors.
pub trait Collectives: Backend {
    /// Joins `member`'s group on `device` (communicators, for backends that have them).
    fn join_group(device: &Self::Device, member: &RankLink) -> Result<(), DistError>;

    /// Each tensor replaced by its mean over the ranks, equal bits on every rank.
    fn all_reduce_mean(
        tensors: Vec<FloatTensor<Self>>,
        member: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError>;

    /// Rank `root`'s tensors on every rank.
    fn broadcast(
        tensors: Vec<FloatTensor<Self>>,
        root: usize,
        member: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError>;
}
