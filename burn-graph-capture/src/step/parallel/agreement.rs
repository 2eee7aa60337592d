//! How the ranks of a group agree on each step, so that every rank runs the step's
//! collectives the same way: all from one graph launch each, or all eagerly. A rank that
//! launched a graph whose all-reduce waits for a peer running another path would wait
//! forever (NCCL requires captures and launches to be uniform across ranks).
//!
//! Pure decisions, unit-tested here; the trainer exchanges proposals through the group's
//! rendezvous and every rank computes the same verdict from the same proposals.

use serde::{Deserialize, Serialize};

use crate::step::error::StepError;
use crate::step::mode::FallbackReason;

/// What one rank would do for this step, before it does anything collective.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Proposal {
    /// Replay its graph (already prepared: pins checked, batch copied in), `traced` where
    /// its graph has a trace recording and traces are on.
    Replay { traced: bool },
    /// Capture a graph.
    Capture,
    /// Run eagerly, for this reason (warmup and verifying steps included).
    Eager(FallbackReason),
    /// Refuse the step (bad input): nothing runs on any rank.
    Refuse(Box<StepError>),
}

/// What a rank does, given every rank's proposal.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Go on with its own proposal.
    Proceed,
    /// Run eagerly instead, for this reason.
    Eager(FallbackReason),
    /// A rank that proposed a replay drops that graph and runs eagerly: another rank
    /// will capture this shape, and the next step captures on every rank.
    DropGraph(FallbackReason),
    /// Refuse the step: another rank refused it.
    Refuse(StepError),
    /// Replay without a trace: another rank cannot trace its step, and the ranks agree
    /// on a trace at the step's collective, all of them or none.
    ReplayUntraced,
}

/// The verdict for `rank` given all proposals (in rank order).
///
/// - Any refusal: nobody runs the step (refused by the lowest refusing rank).
/// - Any eager rank: everyone runs eagerly; the others say which rank fell back and why.
/// - Captures and replays mixed: a rank's graph was dropped (pins moved, say) while the
///   others kept theirs. All run eagerly this step, and the replaying ranks drop their
///   graph so that the next step captures on every rank.
/// - All replay, some without a trace: all replay untraced.
/// - Otherwise (all capture, or all replay): proceed.
pub(crate) fn decide(rank: usize, proposals: &[Proposal]) -> Verdict {
    let own = &proposals[rank];
    if let Some((by, Proposal::Refuse(error))) =
        first(proposals, |p| matches!(p, Proposal::Refuse(_)))
    {
        if by == rank {
            return Verdict::Proceed;
        }
        return Verdict::Refuse(StepError::PeerRefused {
            rank: by,
            error: error.clone(),
        });
    }
    if let Some((by, Proposal::Eager(reason))) =
        first(proposals, |p| matches!(p, Proposal::Eager(_)))
    {
        return match own {
            Proposal::Eager(_) => Verdict::Proceed,
            _ => Verdict::Eager(FallbackReason::RankFellBack {
                rank: by,
                reason: Box::new(reason.clone()),
            }),
        };
    }
    let capturing = first(proposals, |p| *p == Proposal::Capture);
    let replaying = first(proposals, |p| matches!(p, Proposal::Replay { .. }));
    let untraced = proposals.contains(&Proposal::Replay { traced: false });
    match (capturing, own) {
        (Some((by, _)), Proposal::Replay { .. }) => {
            Verdict::DropGraph(FallbackReason::RankRecaptures { rank: by })
        }
        (Some(_), Proposal::Capture) if let Some((by, _)) = replaying => {
            Verdict::Eager(FallbackReason::RankRecaptures { rank: by })
        }
        (None, Proposal::Replay { traced: true }) if untraced => Verdict::ReplayUntraced,
        _ => Verdict::Proceed,
    }
}

/// Whether every rank may launch its recorded graph: each says whether its capture
/// succeeded (`None`) or why not. `None` when all may; else the reason for `rank`.
pub(crate) fn launch_verdict(
    rank: usize,
    outcomes: &[Option<FallbackReason>],
) -> Option<FallbackReason> {
    let (by, reason) = outcomes
        .iter()
        .enumerate()
        .find_map(|(r, outcome)| outcome.as_ref().map(|reason| (r, reason)))?;
    Some(match &outcomes[rank] {
        Some(own) => own.clone(),
        None => FallbackReason::RankFellBack {
            rank: by,
            reason: Box::new(reason.clone()),
        },
    })
}

fn first(proposals: &[Proposal], pick: impl Fn(&Proposal) -> bool) -> Option<(usize, &Proposal)> {
    proposals.iter().enumerate().find(|(_, p)| pick(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::TensorKind;
    use crate::step::error::EmptyBatch;

    const REPLAY: Proposal = Proposal::Replay { traced: true };

    fn eager(reason: FallbackReason) -> Proposal {
        Proposal::Eager(reason)
    }

    #[test]
    fn uniform_plans_proceed() {
        for plan in [
            Proposal::Replay { traced: true },
            Proposal::Replay { traced: false },
            Proposal::Capture,
            eager(FallbackReason::Warmup),
        ] {
            let all = vec![plan.clone(); 3];
            for rank in 0..3 {
                assert_eq!(decide(rank, &all), Verdict::Proceed, "{plan:?}");
            }
        }
        // Eager ranks proceed with their own reasons, whatever they are.
        let mixed = [
            eager(FallbackReason::Warmup),
            eager(FallbackReason::ModelReplaced),
        ];
        assert_eq!(decide(0, &mixed), Verdict::Proceed);
        assert_eq!(decide(1, &mixed), Verdict::Proceed);
    }

    #[test]
    fn one_eager_rank_makes_every_rank_eager_and_is_named() {
        let proposals = [REPLAY, eager(FallbackReason::PinnedBuffersChanged), REPLAY];
        let expected = Verdict::Eager(FallbackReason::RankFellBack {
            rank: 1,
            reason: Box::new(FallbackReason::PinnedBuffersChanged),
        });
        assert_eq!(decide(0, &proposals), expected);
        assert_eq!(decide(2, &proposals), expected);
        assert_eq!(decide(1, &proposals), Verdict::Proceed);
        // A capture meeting an eager rank does not capture either.
        let capture = [Proposal::Capture, eager(FallbackReason::Warmup)];
        assert!(matches!(
            decide(0, &capture),
            Verdict::Eager(FallbackReason::RankFellBack { rank: 1, .. })
        ));
    }

    #[test]
    fn a_refusal_refuses_the_step_everywhere() {
        let proposals = [
            REPLAY,
            eager(FallbackReason::Warmup),
            Proposal::Refuse(Box::new(StepError::EmptyBatch(EmptyBatch::NoTensors))),
        ];
        assert_eq!(decide(2, &proposals), Verdict::Proceed);
        for rank in 0..2 {
            assert_eq!(
                decide(rank, &proposals),
                Verdict::Refuse(StepError::PeerRefused {
                    rank: 2,
                    error: Box::new(StepError::EmptyBatch(EmptyBatch::NoTensors))
                })
            );
        }
    }

    /// A refusal crosses to the other ranks (as JSON, maybe to another process) as the
    /// refusing rank's own error, which the others' `PeerRefused` keeps as its source.
    #[test]
    fn a_peer_refusal_arrives_typed_and_is_the_source() {
        use std::error::Error as _;

        let refused = StepError::EmptyBatch(EmptyBatch::EmptyTensor {
            kind: TensorKind::Float,
            index: 0,
            shape: vec![0, 3],
        });
        let proposal = Proposal::Refuse(Box::new(refused.clone()));
        let crossed: Proposal = serde_json::from_slice(&serde_json::to_vec(&proposal).unwrap())
            .expect("a proposal reads back");
        let Verdict::Refuse(error) = decide(0, &[Proposal::Capture, crossed]) else {
            panic!("rank 1's refusal refuses the step");
        };
        assert!(matches!(&error, StepError::PeerRefused { rank: 1, error } if **error == refused));
        assert_eq!(
            error.source().map(ToString::to_string),
            Some("empty batch: float tensor 0 has shape [0, 3]".to_string())
        );
    }

    #[test]
    fn mixed_captures_and_replays_run_eagerly_and_the_replays_drop_their_graphs() {
        let proposals = [REPLAY, Proposal::Capture, REPLAY];
        assert_eq!(
            decide(0, &proposals),
            Verdict::DropGraph(FallbackReason::RankRecaptures { rank: 1 })
        );
        assert_eq!(
            decide(1, &proposals),
            Verdict::Eager(FallbackReason::RankRecaptures { rank: 0 })
        );
        assert_eq!(decide(2, &proposals), decide(0, &proposals));
    }

    #[test]
    fn replays_are_traced_on_every_rank_or_on_none() {
        let proposals = [REPLAY, Proposal::Replay { traced: false }, REPLAY];
        assert_eq!(decide(0, &proposals), Verdict::ReplayUntraced);
        assert_eq!(decide(2, &proposals), Verdict::ReplayUntraced);
        assert_eq!(decide(1, &proposals), Verdict::Proceed);
        // A capture among them still makes the replays drop their graphs.
        let capture = [
            REPLAY,
            Proposal::Capture,
            Proposal::Replay { traced: false },
        ];
        assert_eq!(
            decide(0, &capture),
            Verdict::DropGraph(FallbackReason::RankRecaptures { rank: 1 })
        );
    }

    #[test]
    fn a_launch_needs_every_capture() {
        assert_eq!(launch_verdict(0, &[None, None]), None);
        let failed = [None, Some(FallbackReason::GraphCacheFull)];
        assert_eq!(
            launch_verdict(0, &failed),
            Some(FallbackReason::RankFellBack {
                rank: 1,
                reason: Box::new(FallbackReason::GraphCacheFull)
            })
        );
        assert_eq!(
            launch_verdict(1, &failed),
            Some(FallbackReason::GraphCacheFull)
        );
    }
}
