//! How a `GraphTrainer` warms up, caches graphs and checks replays.

use burn::config::Config;

use super::cache::CacheLimits;

/// Configuration of a [`GraphTrainer`](super::GraphTrainer).
#[derive(Config, Debug, PartialEq, Eq)]
pub struct GraphTrainerConfig {
    /// Whether steps may be captured and replayed at all. `false` runs every step
    /// eagerly (`CaptureDisabled`) through the same optimizer and kernels: the
    /// reference a graphed run is compared with.
    #[config(default = true)]
    pub capture: bool,
    /// Eager steps per input shape before capturing; their op signatures must all be
    /// equal. At least one eager step always runs first (burn#5772: a cold capture can
    /// make other in-place decisions than warmup).
    #[config(default = 3)]
    pub warmup_steps: usize,
    /// Most graphs alive at once. A shape ready for a graph when all are taken drops
    /// the least recently used one (counted in the report's `evictions`); shapes
    /// without a graph hold none.
    #[config(default = 4)]
    pub max_graphs: usize,
    /// Times a shape's warmup starts over when a step does not do what the ones before
    /// it did (a constant built lazily on first use, an anchor model that parts from
    /// the trainer's buffers after the first update) before the shape stays eager.
    #[config(default = 3)]
    pub max_warmup_restarts: usize,
    /// A graph captured or last checked more than this many trainer steps ago (all
    /// shapes counted) runs its shape's next step eagerly instead, compared with what
    /// the graph recorded (`ReplayCheck`); a difference drops the graph (`GraphStale`)
    /// and the shape warms up again. `0` never checks.
    ///
    /// Where replays are traced (`CudaCube`, emulated graphs), every replay already
    /// matched the step closure's ops, host values and tensors read: the check adds
    /// only what a trace cannot see, the step's values computed eagerly beside the
    /// graph's. Where they are not (`CudaFused`), a replay does not call the closure,
    /// and this check is what finds a host value, branch or tensor the closure reads
    /// that changed since the capture, within about this many steps (a shape seen once
    /// an epoch included).
    #[config(default = 100)]
    pub verify_every: usize,
    /// Most times graphs are dropped and captured again after pinned buffers changed;
    /// after that the trainer runs eagerly (`RecaptureLimit`), until its shapes warm
    /// up again (`rewarm_after`).
    #[config(default = 2)]
    pub max_recaptures: usize,
    /// Eager steps of a shape that was made eager for a reason (its warmup kept
    /// changing, a breaker, a failed capture, `RecaptureLimit`) before it warms up and
    /// tries for a graph again: a schedule that settles, or a failure that passed,
    /// graphs then. The wait doubles each time the same shape is made eager again
    /// before it got a graph, up to 32 times this; each try is counted in the report's
    /// `rewarms`. `0` keeps such a shape eager for good.
    #[config(default = 50)]
    pub rewarm_after: usize,
}

impl GraphTrainerConfig {
    /// How the graph cache decides (warmup never shorter than one eager step).
    pub(crate) fn cache_limits(&self) -> CacheLimits {
        CacheLimits {
            max_graphs: self.max_graphs,
            warmup_steps: self.warmup_steps.max(1),
            max_restarts: self.max_warmup_restarts,
            verify_every: self.verify_every,
            rewarm_after: self.rewarm_after,
        }
    }
}
