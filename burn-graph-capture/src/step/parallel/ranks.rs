//! A trainer's side of data-parallel training: its group membership, and the meeting
//! points of a step. Before anything collective runs, the ranks agree on how the step
//! runs (`agreement`); after recording a capture, on whether every rank may launch its
//! graph; in a traced replay, on whether every rank's trace matched
//! (`backend::trace::Peers`). Anything that fails past those points, where peers may
//! already wait in a collective, fails the group.

use std::sync::Arc;

use burn::tensor::ops::FloatTensor;
use burn_backend::Backend;
use serde::{Deserialize, Serialize};

use super::agreement::{self, Proposal, Verdict};
use crate::backend::trace::{GroupFailed, Peers};
use crate::cause::Cause;
use crate::parallel::{Collectives, DistError, RankLink, RankMember};
use crate::step::error::StepError;
use crate::step::mode::FallbackReason;

/// `Collectives::all_reduce_mean` of a backend.
type GroupAverage<B> = fn(Vec<FloatTensor<B>>, &RankLink) -> Result<Vec<FloatTensor<B>>, DistError>;

/// A peer's message this rank could not read (a peer of another version?).
#[derive(Debug, thiserror::Error)]
#[error("a peer's message could not be read: {0}")]
struct UnreadableMessage(#[source] serde_json::Error);

/// How a rank's capture came out, as its peers learn it before launching.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum CaptureOutcome {
    /// Its graph may launch.
    Ready,
    /// It falls back, for this reason.
    Fallback(FallbackReason),
    /// It failed (its step errored while recorded): the group fails.
    Failed(Cause),
}

/// A trainer's membership of a data-parallel group (shared by the parts of a step),
/// with the group's gradient average on the trainer's backend `B`.
pub(crate) struct Rank<B: Backend> {
    member: Arc<RankMember>,
    average: GroupAverage<B>,
}

impl<B: Backend> Clone for Rank<B> {
    fn clone(&self) -> Self {
        Self {
            member: self.member.clone(),
            average: self.average,
        }
    }
}

impl<B: Backend> Rank<B> {
    /// A rank of `member`'s group, averaging through `B`'s collectives.
    pub(crate) fn new(member: RankMember) -> Self
    where
        B: Collectives,
    {
        Self {
            member: Arc::new(member),
            average: B::all_reduce_mean,
        }
    }

    pub(crate) fn member(&self) -> &RankLink {
        &self.member
    }

    /// Each tensor's mean over the ranks (`Collectives::all_reduce_mean`, taken where
    /// the trainer was made: the rest of a step needs no `Collectives` bound).
    pub(crate) fn all_reduce_mean(
        &self,
        tensors: Vec<FloatTensor<B>>,
    ) -> Result<Vec<FloatTensor<B>>, DistError> {
        (self.average)(tensors, &self.member)
    }

    /// The group's failure, as the step error every later step returns.
    pub(crate) fn failure(&self) -> Option<StepError> {
        self.member.failure().map(StepError::DataParallel)
    }

    /// Fails the group: this rank could not finish a step its peers may be inside.
    pub(crate) fn fail(&self, error: impl std::error::Error + Send + Sync + 'static) -> StepError {
        StepError::DataParallel(self.member.fail(DistError::RankFailed {
            rank: self.member.rank(),
            cause: Cause::new(error),
        }))
    }

    /// Fails the group for this rank's step error, unless that error is already the
    /// group's failure.
    pub(crate) fn fail_step(&self, error: StepError) -> StepError {
        match error {
            StepError::DataParallel(_) => error,
            error => self.fail(error),
        }
    }

    /// What this rank does, given what every rank proposes for the step.
    pub(crate) fn agree(&self, proposal: &Proposal) -> Result<Verdict, StepError> {
        let all: Vec<Proposal> = self.exchange(proposal)?;
        Ok(agreement::decide(self.member.rank(), &all))
    }

    /// Whether this rank launches its recorded graph: `None` when every rank may, else
    /// why not (its own reason, or the first rank that fell back). A failed rank fails
    /// the group on every rank.
    pub(crate) fn agree_launch(
        &self,
        own: &CaptureOutcome,
    ) -> Result<Option<FallbackReason>, StepError> {
        let all: Vec<CaptureOutcome> = self.exchange(own)?;
        if let Some((rank, CaptureOutcome::Failed(cause))) = all
            .iter()
            .enumerate()
            .find(|(_, r)| matches!(r, CaptureOutcome::Failed(_)))
        {
            let error = DistError::RankFailed {
                rank,
                cause: cause.clone(),
            };
            return Err(StepError::DataParallel(self.member.fail(error)));
        }
        let outcomes: Vec<Option<FallbackReason>> = all
            .into_iter()
            .map(|r| match r {
                CaptureOutcome::Fallback(reason) => Some(reason),
                _ => None,
            })
            .collect();
        Ok(agreement::launch_verdict(self.member.rank(), &outcomes))
    }

    /// Every rank's `value`, through the group's rendezvous.
    pub(crate) fn exchange<T: Serialize + for<'de> Deserialize<'de>>(
        &self,
        value: &T,
    ) -> Result<Vec<T>, StepError> {
        let payload = serde_json::to_vec(value).map_err(|err| self.fail(err))?;
        let all = self
            .member
            .all_gather(payload)
            .map_err(StepError::DataParallel)?;
        all.iter()
            .map(|bytes| serde_json::from_slice(bytes))
            .collect::<Result<_, _>>()
            .map_err(|err| self.fail(UnreadableMessage(err)))
    }
}

/// A rank's trace agrees with its peers through the group's rendezvous.
impl<B: Backend> Peers for Rank<B> {
    fn agree(&mut self, matching: bool) -> Result<Option<usize>, GroupFailed> {
        let all: Vec<bool> = self.exchange(&matching).map_err(|_| GroupFailed)?;
        Ok(all.iter().position(|matched| !matched))
    }
}
