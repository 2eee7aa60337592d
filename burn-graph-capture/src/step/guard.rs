//! The unlisted-input guard: every allocation a step reads without producing it must be
//! accounted for.
//!
//! A capture session names each allocation the step read from outside itself
//! ([`ExternalRead`]). Each must be one of:
//! - the trainer's own: a parameter or optimizer-state tensor (pinned, on GPUs);
//! - listed: a tensor of the batch, which a replay refills before it launches;
//! - a constant: the same allocation in every warmup step and in the capture. A Burn
//!   tensor is a value, so the same allocation holds the same contents. Where graphs
//!   read constants through pins that traced replays fill (`backend::constant_pin`), a
//!   constant is known by its place instead: the same op reading the same shape and
//!   dtype, whichever tensor it is (each trace copies the one it meets into the pin).
//!
//! Anything else, such as token ids the batch does not list, would be read by every
//! replay as the captured step saw it; its shape then stays eager, with the reading op
//! in the reason. Allocations are compared by identity (`AllocationId`), never by address.

use std::collections::HashSet;

use super::mode::FallbackReason;
use crate::backend::{AllocationId, ExternalRead};

/// The allocations a step may read that the trainer accounts for.
#[derive(Default)]
pub(crate) struct Accounted {
    ids: HashSet<AllocationId>,
}

impl Accounted {
    /// The trainer's own tensors and the batch's tensors of this step.
    pub(crate) fn new(ids: impl IntoIterator<Item = Option<AllocationId>>) -> Self {
        Self {
            ids: ids.into_iter().flatten().collect(),
        }
    }

    /// The allocations accounted for.
    pub(crate) fn ids(&self) -> &HashSet<AllocationId> {
        &self.ids
    }

    /// These and `more`.
    pub(crate) fn with(mut self, more: impl IntoIterator<Item = Option<AllocationId>>) -> Self {
        self.ids.extend(more.into_iter().flatten());
        self
    }

    /// The reads the trainer does not account for: constants, or unlisted inputs.
    pub(crate) fn unaccounted(&self, reads: Vec<ExternalRead>) -> Vec<ExternalRead> {
        reads
            .into_iter()
            .filter(|read| {
                read.allocation
                    .as_ref()
                    .is_none_or(|id| !self.ids.contains(id))
            })
            .collect()
    }
}

/// The reason a step reading `read` stays eager.
pub(crate) fn unlisted(read: &ExternalRead) -> FallbackReason {
    FallbackReason::UnlistedInput {
        op: read.op.into(),
        shape: read.tensor.shape.as_slice().to_vec(),
        dtype: read.tensor.dtype,
    }
}

/// Compares the unaccounted reads of a step with those of the steps before it
/// (`previous`, if any): the reads are constants when they are the same allocations.
/// Otherwise the first read that differs is an unlisted input. A read whose allocation
/// cannot be named is never a constant.
pub(crate) fn check_constants(
    previous: Option<&[ExternalRead]>,
    current: &[ExternalRead],
) -> Result<(), FallbackReason> {
    let Some(previous) = named(previous, current)? else {
        return Ok(());
    };
    let ids = |reads: &[ExternalRead]| -> HashSet<AllocationId> {
        reads.iter().filter_map(|r| r.allocation.clone()).collect()
    };
    let (before, now) = (ids(previous), ids(current));
    let new = current.iter().find(|read| {
        read.allocation
            .as_ref()
            .is_some_and(|id| !before.contains(id))
    });
    let gone = || {
        previous
            .iter()
            .find(|read| read.allocation.as_ref().is_some_and(|id| !now.contains(id)))
    };
    match new.or_else(gone) {
        Some(read) => Err(unlisted(read)),
        None => Ok(()),
    }
}

/// [`check_constants`] for constants known by place (read through pins that traces
/// fill): the same number of reads, each by the same op, of the same shape and dtype, in
/// the same order; their allocations may differ. A read whose allocation cannot be named
/// is never a constant.
pub(crate) fn check_constant_places(
    previous: Option<&[ExternalRead]>,
    current: &[ExternalRead],
) -> Result<(), FallbackReason> {
    let Some(previous) = named(previous, current)? else {
        return Ok(());
    };
    let differs = |(before, now): &(&ExternalRead, &ExternalRead)| {
        before.op != now.op || before.tensor != now.tensor
    };
    match previous.iter().zip(current).find(differs) {
        Some((_, now)) => Err(unlisted(now)),
        None if current.len() > previous.len() => Err(unlisted(&current[previous.len()])),
        None if previous.len() > current.len() => Err(unlisted(&previous[current.len()])),
        None => Ok(()),
    }
}

/// What both checks begin with: a read of `current` whose allocation cannot be named is
/// never a constant; else the reads of the steps before, if any, to compare with.
fn named<'a>(
    previous: Option<&'a [ExternalRead]>,
    current: &[ExternalRead],
) -> Result<Option<&'a [ExternalRead]>, FallbackReason> {
    match current.iter().find(|read| read.allocation.is_none()) {
        Some(read) => Err(unlisted(read)),
        None => Ok(previous),
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Shape};

    use super::*;
    use crate::backend::TensorSig;

    fn read(id: Option<u64>, op: &'static str) -> ExternalRead {
        ExternalRead {
            allocation: id.map(AllocationId::unique),
            op,
            tensor: TensorSig {
                shape: Shape::new([2, 3]),
                dtype: DType::I64,
            },
        }
    }

    #[test]
    fn owned_and_listed_reads_are_accounted_for() {
        let accounted = Accounted::new([Some(AllocationId::unique(1)), None]);
        let left = accounted.unaccounted(vec![
            read(Some(1), "a"),
            read(Some(2), "b"),
            read(None, "c"),
        ]);
        assert_eq!(left, vec![read(Some(2), "b"), read(None, "c")]);
    }

    #[test]
    fn the_same_allocations_in_every_step_are_constants() {
        let steps = [
            vec![read(Some(5), "a"), read(Some(6), "b")],
            vec![read(Some(6), "b"), read(Some(5), "a")],
        ];
        assert_eq!(check_constants(None, &steps[0]), Ok(()));
        assert_eq!(check_constants(Some(&steps[0]), &steps[1]), Ok(()));
    }

    #[test]
    fn a_new_allocation_is_an_unlisted_input_named_by_its_reader() {
        let before = [read(Some(5), "a")];
        let reason =
            check_constants(Some(&before), &[read(Some(7), "float_embedding")]).unwrap_err();
        assert_eq!(
            reason,
            FallbackReason::UnlistedInput {
                op: "float_embedding".into(),
                shape: vec![2, 3],
                dtype: DType::I64
            }
        );
    }

    #[test]
    fn a_read_that_stopped_is_named_too() {
        let before = [read(Some(5), "a"), read(Some(6), "gone")];
        let reason = check_constants(Some(&before), &[read(Some(5), "a")]).unwrap_err();
        assert!(matches!(reason, FallbackReason::UnlistedInput { op, .. } if op == "gone"));
    }

    #[test]
    fn by_place_a_constant_may_be_another_allocation_of_the_same_read() {
        let before = [read(Some(5), "a"), read(Some(6), "b")];
        assert_eq!(
            check_constant_places(Some(&before), &[read(Some(7), "a"), read(Some(8), "b")]),
            Ok(())
        );
        // By allocation the same steps differ.
        assert!(check_constants(Some(&before), &[read(Some(7), "a"), read(Some(8), "b")]).is_err());
    }

    #[test]
    fn by_place_another_reader_or_count_of_reads_differs() {
        let before = [read(Some(5), "a"), read(Some(6), "b")];
        let other_op =
            check_constant_places(Some(&before), &[read(Some(5), "a"), read(Some(6), "c")]);
        assert!(matches!(other_op, Err(FallbackReason::UnlistedInput { op, .. }) if op == "c"));
        let fewer = check_constant_places(Some(&before), &[read(Some(5), "a")]);
        assert!(matches!(fewer, Err(FallbackReason::UnlistedInput { op, .. }) if op == "b"));
        let unnamed = check_constant_places(None, &[read(None, "d")]);
        assert!(matches!(unnamed, Err(FallbackReason::UnlistedInput { op, .. }) if op == "d"));
    }

    #[test]
    fn an_unnamed_allocation_is_never_a_constant() {
        let reason = check_constants(None, &[read(None, "q_matmul")]).unwrap_err();
        assert!(matches!(reason, FallbackReason::UnlistedInput { op, .. } if op == "q_matmul"));
    }
}
