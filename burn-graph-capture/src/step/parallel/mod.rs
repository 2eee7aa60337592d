//! A trainer's side of data-parallel training (the group itself is `crate::parallel`):
//! kept apart so that the step's single-device parts never depend on it, and the rules
//! that keep ranks uniform (I10) sit in one place.
//!
//! `ranks` holds the membership and the step's two meeting points, `agreement` the pure
//! decisions taken there, `collectives` what a step computes over the ranks.

mod agreement;
mod collectives;
mod ranks;

pub(crate) use agreement::{Proposal, Verdict};
pub(crate) use collectives::{average_gradients, broadcast_start, same_structure_as_rank_zero};
pub(crate) use ranks::{CaptureOutcome, Rank};
