//! Per-input-shape lifecycle: warmup, then a graph, or eager with a reason.
//!
//! This is the trainer's decision logic with no backend calls in it, so every path,
//! including the ones only GPUs reach, is unit-tested on the CPU.

use std::collections::HashMap;

use super::guard;
use super::input::InputKey;
use super::mode::FallbackReason;
use crate::backend::{CaptureBreaker, ExternalRead, OpSignature};

/// What one recorded step did, as far as graph decisions go.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Observation {
    /// Its op signature.
    pub(crate) signature: OpSignature,
    /// Its capture breakers.
    pub(crate) breakers: Vec<CaptureBreaker>,
    /// Its reads of allocations the trainer does not account for (`guard`).
    pub(crate) unaccounted: Vec<ExternalRead>,
}

impl Observation {
    /// Why a step that did this cannot follow `previous` (the steps before it) into a
    /// graph: a breaker, another signature, or reads that are not constants.
    pub(crate) fn verdict(&self, previous: Option<&Observation>) -> Option<FallbackReason> {
        if let Some(breaker) = self.breakers.first() {
            return Some(FallbackReason::CaptureBreaker(breaker.clone()));
        }
        if let Some(first_difference) =
            previous.and_then(|p| p.signature.first_difference(&self.signature))
        {
            return Some(FallbackReason::NonStaticControlFlow { first_difference });
        }
        let before = previous.map(|p| p.unaccounted.as_slice());
        guard::check_constants(before, &self.unaccounted).err()
    }
}

/// A graph with what its step did when it was recorded.
pub(crate) trait Recorded {
    /// The recorded step's observation.
    fn observation(&self) -> &Observation;
}

/// Where one input shape stands.
#[derive(Debug)]
pub(crate) enum Phase<G> {
    /// Eager warmup steps so far, and what they all did.
    Warming {
        done: usize,
        seen: Option<Observation>,
    },
    /// Warmup verified a static step; the next step may be captured if it does the same.
    Ready(Observation),
    /// A graph recorded for this shape.
    Captured(G),
    /// A graph whose model was replaced: the next step runs eagerly and must do what
    /// the graph recorded before the graph replays again.
    Suspect(G),
    /// This shape runs eagerly for good.
    Disabled(FallbackReason),
}

/// What the trainer should do for one step.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Run eagerly inside a capture session and report the observation.
    Warmup,
    /// Run eagerly, for this reason.
    Eager(FallbackReason),
    /// Capture this step into a graph.
    Capture,
    /// Replay this shape's graph.
    Replay,
    /// Run eagerly inside a session and compare with the shape's graph.
    Verify,
}

/// The phase after `done` warmup steps that all did what `last` did.
fn warming<G>(done: usize, last: Observation, warmup_steps: usize) -> Phase<G> {
    if done >= warmup_steps {
        Phase::Ready(last)
    } else {
        Phase::Warming {
            done,
            seen: Some(last),
        }
    }
}

/// The graphs of one trainer, keyed by input shape, bounded in number.
#[derive(Debug)]
pub(crate) struct GraphCache<G> {
    entries: HashMap<InputKey, Phase<G>>,
    max_entries: usize,
    warmup_steps: usize,
}

impl<G: Recorded> GraphCache<G> {
    pub(crate) fn new(max_entries: usize, warmup_steps: usize) -> Self {
        Self {
            entries: HashMap::new(),
            max_entries,
            warmup_steps,
        }
    }

    /// Decides how the step for `key` runs. `hardware` tells whether graphs exist.
    pub(crate) fn plan(&mut self, key: &InputKey, hardware: bool) -> Plan {
        if !self.entries.contains_key(key) {
            if self.entries.len() >= self.max_entries {
                return Plan::Eager(FallbackReason::GraphCacheFull);
            }
            self.entries.insert(
                key.clone(),
                Phase::Warming {
                    done: 0,
                    seen: None,
                },
            );
        }
        match &self.entries[key] {
            Phase::Warming { .. } => Plan::Warmup,
            Phase::Ready(_) if hardware => Plan::Capture,
            Phase::Ready(_) => Plan::Eager(FallbackReason::NoHardwareGraphs),
            Phase::Captured(_) => Plan::Replay,
            Phase::Suspect(_) => Plan::Verify,
            Phase::Disabled(reason) => Plan::Eager(reason.clone()),
        }
    }

    /// Records a warmup step. Returns the reason if it disabled the shape.
    pub(crate) fn warmed(&mut self, key: &InputKey, step: Observation) -> Option<FallbackReason> {
        let entry = self.entries.get_mut(key)?;
        let Phase::Warming { done, seen } = entry else {
            return None;
        };
        let verdict = step.verdict(seen.as_ref());
        *entry = match verdict.clone() {
            Some(reason) => Phase::Disabled(reason),
            None => warming(*done + 1, step, self.warmup_steps),
        };
        verdict
    }

    /// Whether the next step of `key` is its last warmup step (the one before capture).
    pub(crate) fn last_warmup(&self, key: &InputKey) -> bool {
        matches!(self.entries.get(key), Some(Phase::Warming { done, .. }) if done + 1 >= self.warmup_steps)
    }

    /// What the warmup steps of `key` did, once it is ready for capture.
    pub(crate) fn warmed_up(&self, key: &InputKey) -> Option<&Observation> {
        match self.entries.get(key) {
            Some(Phase::Ready(seen)) => Some(seen),
            _ => None,
        }
    }

    /// Stores the graph captured for `key`.
    pub(crate) fn captured(&mut self, key: &InputKey, graph: G) {
        self.entries.insert(key.clone(), Phase::Captured(graph));
    }

    /// Records a verifying step of a suspect graph: the graph replays again when the
    /// step did what it recorded; otherwise it is dropped and the step counts as the
    /// first warmup step of a new graph. Returns the reason in that case.
    pub(crate) fn verified(&mut self, key: &InputKey, step: Observation) -> Option<FallbackReason> {
        // A shape whose graph was dropped meanwhile keeps the phase it has now.
        if !matches!(self.entries.get(key), Some(Phase::Suspect(_))) {
            return None;
        }
        let Some(Phase::Suspect(graph)) = self.entries.remove(key) else {
            unreachable!("a suspect graph: checked above");
        };
        match step.verdict(Some(graph.observation())) {
            None => {
                self.entries.insert(key.clone(), Phase::Captured(graph));
                None
            }
            Some(reason) => {
                drop(graph);
                let (phase, verdict) = match step.verdict(None) {
                    Some(own) => (Phase::Disabled(own.clone()), own),
                    None => (warming(1, step, self.warmup_steps), reason),
                };
                self.entries.insert(key.clone(), phase);
                Some(verdict)
            }
        }
    }

    /// Makes `key` eager for good.
    pub(crate) fn disable(&mut self, key: &InputKey, reason: FallbackReason) {
        self.entries.insert(key.clone(), Phase::Disabled(reason));
    }

    /// The graph for `key`, if one was captured.
    pub(crate) fn graph(&self, key: &InputKey) -> Option<&G> {
        match self.entries.get(key) {
            Some(Phase::Captured(graph)) => Some(graph),
            _ => None,
        }
    }

    /// Marks every graph suspect: each must match an eager step before it replays.
    pub(crate) fn suspect_graphs(&mut self) {
        for phase in self.entries.values_mut() {
            let placeholder = Phase::Warming {
                done: 0,
                seen: None,
            };
            *phase = match std::mem::replace(phase, placeholder) {
                Phase::Captured(graph) => Phase::Suspect(graph),
                other => other,
            };
        }
    }

    /// Drops the graph of `key`, if it has one: its next step captures again.
    pub(crate) fn drop_graph(&mut self, key: &InputKey) {
        if let Some(phase) = self.entries.get_mut(key)
            && let Phase::Captured(graph) | Phase::Suspect(graph) = phase
        {
            *phase = Phase::Ready(graph.observation().clone());
        }
    }

    /// Drops every graph; their shapes get captured again at their next step.
    pub(crate) fn drop_graphs(&mut self) {
        for phase in self.entries.values_mut() {
            let observation = match phase {
                Phase::Captured(graph) | Phase::Suspect(graph) => graph.observation().clone(),
                _ => continue,
            };
            *phase = Phase::Ready(observation);
        }
    }

    /// Drops every graph and sends each shape that had one, or was ready for one, back
    /// to its last warmup step: the pins they would use are gone, and the next ones
    /// must be rehearsed on before a capture (`Graphs::rehearsal_inputs`).
    pub(crate) fn rewarm(&mut self) {
        let last = self.warmup_steps.saturating_sub(1);
        for phase in self.entries.values_mut() {
            let observation = match phase {
                Phase::Captured(graph) | Phase::Suspect(graph) => graph.observation().clone(),
                Phase::Ready(observation) => observation.clone(),
                _ => continue,
            };
            *phase = Phase::Warming {
                done: last,
                seen: Some(observation),
            };
        }
    }

    /// Forgets every shape (dropping all graphs): each warms up again at its next step.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// Makes every shape eager for good (dropping all graphs).
    pub(crate) fn disable_all(&mut self, reason: FallbackReason) {
        for phase in self.entries.values_mut() {
            *phase = Phase::Disabled(reason.clone());
        }
    }

    /// Number of graphs alive.
    pub(crate) fn graphs_alive(&self) -> usize {
        self.entries
            .values()
            .filter(|p| matches!(p, Phase::Captured(_) | Phase::Suspect(_)))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Shape};

    use super::*;
    use crate::backend::{AllocationId, BreakerKind, CaptureSession, TensorSig};

    /// A stand-in graph: a name and the observation it was recorded with.
    #[derive(Debug, PartialEq)]
    struct Fake(&'static str, Observation);

    impl Recorded for Fake {
        fn observation(&self) -> &Observation {
            &self.1
        }
    }

    fn key(batch: usize) -> InputKey {
        InputKey::of_shapes([Shape::new([batch, 3])])
    }

    /// An observation of `ops` dummy ops (a signature of that length), reading `reads`.
    fn observed(ops: usize, reads: &[u64]) -> Observation {
        let (_, recording) = CaptureSession::record(|| {
            for _ in 0..ops {
                crate::backend::session::record_op("op", None, |_| {});
            }
        });
        let unaccounted = reads
            .iter()
            .map(|&id| ExternalRead {
                allocation: Some(AllocationId::unique(id)),
                op: "int_reshape",
                tensor: TensorSig {
                    shape: Shape::new([4]),
                    dtype: DType::I64,
                },
            })
            .collect();
        Observation {
            signature: recording.signature,
            breakers: recording.breakers,
            unaccounted,
        }
    }

    fn warm(cache: &mut GraphCache<Fake>, key: &InputKey, steps: usize) {
        for _ in 0..steps {
            assert_eq!(cache.plan(key, true), Plan::Warmup);
            assert_eq!(cache.warmed(key, observed(2, &[9])), None);
        }
    }

    fn capture(cache: &mut GraphCache<Fake>, key: &InputKey, name: &'static str) {
        assert_eq!(cache.plan(key, true), Plan::Capture);
        let seen = cache.warmed_up(key).unwrap().clone();
        cache.captured(key, Fake(name, seen));
    }

    #[test]
    fn warmup_then_capture_then_replay() {
        let mut cache = GraphCache::new(4, 3);
        warm(&mut cache, &key(8), 3);
        capture(&mut cache, &key(8), "graph");
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);
        assert_eq!(cache.graph(&key(8)).unwrap().0, "graph");
        assert_eq!(cache.graphs_alive(), 1);
    }

    #[test]
    fn without_hardware_a_ready_shape_says_so() {
        let mut cache = GraphCache::<Fake>::new(4, 1);
        assert_eq!(cache.plan(&key(8), false), Plan::Warmup);
        cache.warmed(&key(8), observed(1, &[]));
        assert_eq!(
            cache.plan(&key(8), false),
            Plan::Eager(FallbackReason::NoHardwareGraphs)
        );
    }

    #[test]
    fn a_new_shape_gets_its_own_warmup_and_graph_within_the_bound() {
        let mut cache = GraphCache::new(2, 1);
        warm(&mut cache, &key(8), 1);
        capture(&mut cache, &key(8), "a");
        warm(&mut cache, &key(4), 1);
        capture(&mut cache, &key(4), "b");
        assert_eq!(
            cache.plan(&key(2), true),
            Plan::Eager(FallbackReason::GraphCacheFull)
        );
        assert_eq!(cache.graphs_alive(), 2);
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Replay,
            "old shapes keep their graph"
        );
    }

    #[test]
    fn differing_warmup_signatures_disable_the_shape() {
        let mut cache = GraphCache::<Fake>::new(4, 3);
        cache.plan(&key(8), true);
        assert_eq!(cache.warmed(&key(8), observed(2, &[])), None);
        cache.plan(&key(8), true);
        let reason = FallbackReason::NonStaticControlFlow {
            first_difference: 2,
        };
        assert_eq!(
            cache.warmed(&key(8), observed(3, &[])),
            Some(reason.clone())
        );
        assert_eq!(cache.plan(&key(8), true), Plan::Eager(reason));
    }

    #[test]
    fn a_breaker_in_warmup_disables_the_shape() {
        let mut cache = GraphCache::<Fake>::new(4, 3);
        cache.plan(&key(8), true);
        let mut with_breaker = observed(1, &[]);
        let breaker = CaptureBreaker::new(BreakerKind::HostRead, "float_into_data");
        with_breaker.breakers.push(breaker.clone());
        let reason = FallbackReason::CaptureBreaker(breaker);
        assert_eq!(cache.warmed(&key(8), with_breaker), Some(reason.clone()));
        assert_eq!(cache.plan(&key(8), true), Plan::Eager(reason));
    }

    #[test]
    fn a_read_that_changes_between_warmup_steps_disables_the_shape() {
        let mut cache = GraphCache::<Fake>::new(4, 3);
        cache.plan(&key(8), true);
        assert_eq!(cache.warmed(&key(8), observed(2, &[1, 2])), None);
        cache.plan(&key(8), true);
        let reason = cache.warmed(&key(8), observed(2, &[1, 3])).unwrap();
        assert_eq!(reason.kind(), "UnlistedInput");
        assert_eq!(cache.plan(&key(8), true), Plan::Eager(reason));
    }

    #[test]
    fn a_suspect_graph_replays_again_only_after_a_matching_step() {
        let mut cache = GraphCache::new(4, 1);
        warm(&mut cache, &key(8), 1);
        capture(&mut cache, &key(8), "a");
        cache.suspect_graphs();
        assert_eq!(cache.plan(&key(8), true), Plan::Verify);
        assert_eq!(cache.verified(&key(8), observed(2, &[9])), None);
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);

        cache.suspect_graphs();
        let reason = cache.verified(&key(8), observed(2, &[10])).unwrap();
        assert_eq!(reason.kind(), "UnlistedInput");
        assert_eq!(cache.graphs_alive(), 0, "the outdated graph is dropped");
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Capture,
            "the verifying step was its first warmup step"
        );
    }

    #[test]
    fn dropped_graphs_are_captured_again_and_disabled_shapes_stay_eager() {
        let mut cache = GraphCache::new(4, 1);
        warm(&mut cache, &key(8), 1);
        capture(&mut cache, &key(8), "a");
        cache.drop_graphs();
        assert_eq!(cache.graphs_alive(), 0);
        assert_eq!(cache.plan(&key(8), true), Plan::Capture);
        cache.disable_all(FallbackReason::RecaptureLimit);
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Eager(FallbackReason::RecaptureLimit)
        );
    }

    #[test]
    fn one_dropped_graph_is_captured_again_and_the_others_stay() {
        let mut cache = GraphCache::new(4, 1);
        for batch in [8, 4] {
            warm(&mut cache, &key(batch), 1);
            capture(&mut cache, &key(batch), "a");
        }
        cache.drop_graph(&key(8));
        cache.drop_graph(&key(2));
        assert_eq!(cache.graphs_alive(), 1);
        assert_eq!(cache.plan(&key(8), true), Plan::Capture);
        assert_eq!(cache.plan(&key(4), true), Plan::Replay);
    }

    #[test]
    fn rewarmed_shapes_run_their_last_warmup_step_before_capturing_again() {
        let mut cache = GraphCache::new(4, 3);
        warm(&mut cache, &key(8), 3);
        capture(&mut cache, &key(8), "a");
        warm(&mut cache, &key(4), 3);
        warm(&mut cache, &key(2), 1);
        cache.disable(&key(1), FallbackReason::RecaptureLimit);
        cache.rewarm();
        assert_eq!(cache.graphs_alive(), 0, "graphs dropped");
        for ready in [key(8), key(4)] {
            assert!(cache.last_warmup(&ready), "{ready:?}");
            warm(&mut cache, &ready, 1);
            assert_eq!(cache.plan(&ready, true), Plan::Capture);
        }
        assert!(
            !cache.last_warmup(&key(2)),
            "a warming shape keeps its count"
        );
        assert_eq!(
            cache.plan(&key(1), true),
            Plan::Eager(FallbackReason::RecaptureLimit)
        );
    }

    #[test]
    fn verifying_a_shape_whose_graph_was_dropped_keeps_its_phase() {
        let mut cache = GraphCache::new(4, 3);
        warm(&mut cache, &key(8), 3);
        capture(&mut cache, &key(8), "a");
        cache.suspect_graphs();
        assert_eq!(cache.plan(&key(8), true), Plan::Verify);
        // The verifying step's write-back dropped the graphs (the pins' layout moved).
        cache.drop_graphs();
        cache.rewarm();
        assert_eq!(cache.verified(&key(8), observed(2, &[9])), None);
        assert!(cache.last_warmup(&key(8)), "still at its last warmup step");
    }
}
