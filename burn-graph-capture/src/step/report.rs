//! What a trainer did, as a serializable report.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::mode::StepMode;
use super::registry::TrainerId;

/// Counts of steps per mode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModeCounts {
    /// Steps recorded into a new graph.
    pub captured: u64,
    /// Steps replayed from a graph.
    pub replayed: u64,
    /// Steps run eagerly, whatever the reason.
    pub eager: u64,
}

/// A trainer's report; `serde_json::to_string(&trainer.report())` writes it as JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerReport {
    /// The trainer.
    pub trainer: Option<TrainerId>,
    /// Steps run.
    pub steps: u64,
    /// Steps per mode.
    pub modes: ModeCounts,
    /// Eager steps per fallback reason (`FallbackReason::kind`).
    pub fallbacks: BTreeMap<String, u64>,
    /// The reason of the latest eager step, in full.
    pub last_fallback: Option<String>,
    /// Wall time spent capturing graphs, in milliseconds.
    pub capture_ms: f64,
    /// Host time spent on each step's checks before its work began (listing, checking
    /// and keying the batch, the share registry, the plan; in data-parallel training
    /// also the ranks' agreement, and a replay's copy of the batch, made before it), in
    /// milliseconds, summed.
    pub check_ms: f64,
    /// Replays whose step was traced and matched its graph op by op
    /// (`backend::trace`; graphs with stand-ins only). (Absent from reports written
    /// before traces existed: read as 0.)
    #[serde(default)]
    pub traces_matched: u64,
    /// Traced steps that differed from every graph of their shape on a stack whose
    /// traces stop there (`GraphBackend::traces_run_again`: the fusion stack): each ran
    /// again eagerly from its start, with a clone of the step closure taken before the
    /// trace. (Absent from reports written before it existed: read as 0.)
    #[serde(default)]
    pub traces_run_again: u64,
    /// Host time spent tracing steps against their graphs, in milliseconds.
    #[serde(default)]
    pub trace_ms: f64,
    /// Host time spent launching replays, in milliseconds: copying the batch into its
    /// pins, checking the pins, the launch and the copy of the step's outputs (a trace
    /// before the launch is `trace_ms`). (Absent from reports written before it existed:
    /// read as 0.)
    #[serde(default)]
    pub launch_ms: f64,
    /// Bytes pinned in the arena for parameters and optimizer state.
    pub pinned_bytes: u64,
    /// Graphs currently alive.
    pub graphs_alive: usize,
    /// Times graphs were dropped and captured again.
    pub recaptures: usize,
    /// Graphs dropped to make room for another shape's (`max_graphs`). (Absent from
    /// reports written before it existed: read as 0.)
    #[serde(default)]
    pub evictions: usize,
    /// Times a shape that ran eagerly for a reason warmed up again to try for a graph
    /// (`GraphTrainerConfig::rewarm_after`). (Absent from reports written before it
    /// existed: read as 0.)
    #[serde(default)]
    pub rewarms: usize,
    /// The trainer this one shares a buffer with, if any.
    pub shared_with: Option<TrainerId>,
    /// Copies of the model or optimizer made for `model()`, `optimizer()` and
    /// `take_model()` while steps wrote into pinned buffers (at most one of each per
    /// step).
    pub snapshot_copies: u64,
    /// Host time spent making those copies, in milliseconds.
    pub snapshot_ms: f64,
    /// The random ops drawn inside graphs, from the trainer's device generator (op,
    /// distribution and shape; sorted). Random ops it does not serve break captures and
    /// appear as `Rng` breakers among the fallbacks. (Absent from reports written before
    /// the generator existed: read as empty.)
    #[serde(default)]
    pub graphed_random_ops: Vec<String>,
}

impl TrainerReport {
    /// Notes the random ops a captured step drew.
    pub(crate) fn graphed_random(&mut self, served: &[String]) {
        for op in served {
            if let Err(at) = self.graphed_random_ops.binary_search(op) {
                self.graphed_random_ops.insert(at, op.clone());
            }
        }
    }

    pub(crate) fn count(&mut self, mode: &StepMode) {
        self.steps += 1;
        match mode {
            StepMode::Captured => self.modes.captured += 1,
            StepMode::Replayed => self.modes.replayed += 1,
            StepMode::Eager(reason) => {
                self.modes.eager += 1;
                *self.fallbacks.entry(reason.kind().to_string()).or_default() += 1;
                self.last_fallback = Some(reason.to_string());
            }
        }
    }
}
