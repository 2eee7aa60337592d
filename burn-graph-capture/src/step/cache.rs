//! Per-input-shape lifecycle: warmup, then a graph, or eager with a reason.
//!
//! This is the trainer's decision logic with no backend calls in it, so every path,
//! including the ones only GPUs reach, is unit-tested on the CPU.

use std::collections::HashMap;

use super::input::InputKey;
use super::mode::FallbackReason;
use crate::backend::{OpSignature, Recording};

/// Where one input shape stands.
#[derive(Debug)]
pub(crate) enum Phase<G> {
    /// Eager warmup steps so far, and the signature they all had.
    Warming {
        done: usize,
        signature: Option<OpSignature>,
    },
    /// Warmup verified a static step; the next step may be captured.
    Ready,
    /// A graph recorded for this shape.
    Captured(G),
    /// This shape runs eagerly for good.
    Disabled(FallbackReason),
}

/// What the trainer should do for one step.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Run eagerly inside a capture session and report the recording.
    Warmup,
    /// Run eagerly, for this reason.
    Eager(FallbackReason),
    /// Capture this step into a graph.
    Capture,
    /// Replay this shape's graph.
    Replay,
}

/// The graphs of one trainer, keyed by input shape, bounded in number.
#[derive(Debug)]
pub(crate) struct GraphCache<G> {
    entries: HashMap<InputKey, Phase<G>>,
    max_entries: usize,
    warmup_steps: usize,
}

impl<G> GraphCache<G> {
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
                    signature: None,
                },
            );
        }
        match &self.entries[key] {
            Phase::Warming { .. } => Plan::Warmup,
            Phase::Ready if hardware => Plan::Capture,
            Phase::Ready => Plan::Eager(FallbackReason::NoHardwareGraphs),
            Phase::Captured(_) => Plan::Replay,
            Phase::Disabled(reason) => Plan::Eager(reason.clone()),
        }
    }

    /// Records a warmup step. Returns the reason if it disabled the shape.
    pub(crate) fn warmed(
        &mut self,
        key: &InputKey,
        recording: Recording,
    ) -> Option<FallbackReason> {
        let entry = self.entries.get_mut(key)?;
        let Phase::Warming { done, signature } = entry else {
            return None;
        };
        let verdict = if let Some(breaker) = recording.breakers.into_iter().next() {
            Some(FallbackReason::CaptureBreaker(breaker))
        } else {
            signature
                .as_ref()
                .and_then(|previous| previous.first_difference(&recording.signature))
                .map(|first_difference| FallbackReason::NonStaticControlFlow { first_difference })
        };
        *entry = match verdict.clone() {
            Some(reason) => Phase::Disabled(reason),
            None if *done + 1 >= self.warmup_steps => Phase::Ready,
            None => Phase::Warming {
                done: *done + 1,
                signature: Some(recording.signature),
            },
        };
        verdict
    }

    /// Stores the graph captured for `key`.
    pub(crate) fn captured(&mut self, key: &InputKey, graph: G) {
        self.entries.insert(key.clone(), Phase::Captured(graph));
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

    /// Drops every graph; their shapes get captured again at their next step.
    pub(crate) fn drop_graphs(&mut self) {
        for phase in self.entries.values_mut() {
            if matches!(phase, Phase::Captured(_)) {
                *phase = Phase::Ready;
            }
        }
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
            .filter(|p| matches!(p, Phase::Captured(_)))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Shape};

    use super::*;
    use crate::backend::{BreakerKind, CaptureBreaker, CaptureSession};

    fn key(batch: usize) -> InputKey {
        InputKey(vec![(Shape::new([batch, 3]), DType::F32)])
    }

    /// A recording of `ops` dummy ops (a signature of that length).
    fn recording(ops: usize) -> Recording {
        let (_, recording) = CaptureSession::record(|| {
            for _ in 0..ops {
                crate::backend::session::record_op("op", None, |_| {});
            }
        });
        recording
    }

    fn warm(cache: &mut GraphCache<&'static str>, key: &InputKey, steps: usize) {
        for _ in 0..steps {
            assert_eq!(cache.plan(key, true), Plan::Warmup);
            assert_eq!(cache.warmed(key, recording(2)), None);
        }
    }

    #[test]
    fn warmup_then_capture_then_replay() {
        let mut cache = GraphCache::new(4, 3);
        warm(&mut cache, &key(8), 3);
        assert_eq!(cache.plan(&key(8), true), Plan::Capture);
        cache.captured(&key(8), "graph");
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);
        assert_eq!(cache.graph(&key(8)), Some(&"graph"));
        assert_eq!(cache.graphs_alive(), 1);
    }

    #[test]
    fn without_hardware_a_ready_shape_says_so() {
        let mut cache = GraphCache::<()>::new(4, 1);
        assert_eq!(cache.plan(&key(8), false), Plan::Warmup);
        cache.warmed(&key(8), recording(1));
        assert_eq!(
            cache.plan(&key(8), false),
            Plan::Eager(FallbackReason::NoHardwareGraphs)
        );
    }

    #[test]
    fn a_new_shape_gets_its_own_warmup_and_graph_within_the_bound() {
        let mut cache = GraphCache::new(2, 1);
        warm(&mut cache, &key(8), 1);
        cache.plan(&key(8), true);
        cache.captured(&key(8), "a");
        warm(&mut cache, &key(4), 1);
        assert_eq!(cache.plan(&key(4), true), Plan::Capture);
        cache.captured(&key(4), "b");
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
        let mut cache = GraphCache::<()>::new(4, 3);
        cache.plan(&key(8), true);
        assert_eq!(cache.warmed(&key(8), recording(2)), None);
        cache.plan(&key(8), true);
        let reason = FallbackReason::NonStaticControlFlow {
            first_difference: 2,
        };
        assert_eq!(cache.warmed(&key(8), recording(3)), Some(reason.clone()));
        assert_eq!(cache.plan(&key(8), true), Plan::Eager(reason));
    }

    #[test]
    fn a_breaker_in_warmup_disables_the_shape() {
        let mut cache = GraphCache::<()>::new(4, 3);
        cache.plan(&key(8), true);
        let mut with_breaker = recording(1);
        let breaker = CaptureBreaker::new(BreakerKind::HostRead, "float_into_data");
        with_breaker.breakers.push(breaker.clone());
        let reason = FallbackReason::CaptureBreaker(breaker);
        assert_eq!(cache.warmed(&key(8), with_breaker), Some(reason.clone()));
        assert_eq!(cache.plan(&key(8), true), Plan::Eager(reason));
    }

    #[test]
    fn dropped_graphs_are_captured_again_and_disabled_shapes_stay_eager() {
        let mut cache = GraphCache::new(4, 1);
        warm(&mut cache, &key(8), 1);
        cache.plan(&key(8), true);
        cache.captured(&key(8), "a");
        cache.drop_graphs();
        assert_eq!(cache.graphs_alive(), 0);
        assert_eq!(cache.plan(&key(8), true), Plan::Capture);
        cache.disable_all(FallbackReason::RecaptureLimit);
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Eager(FallbackReason::RecaptureLimit)
        );
    }
}
