//! How a `GraphTrainer` warms up, caches graphs and checks replays.

use burn::config::Config;

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
    /// Most input shapes that get a graph; further shapes run eagerly.
    #[config(default = 4)]
    pub max_graphs: usize,
    /// Most times graphs are dropped and captured again after pinned buffers changed;
    /// after that the trainer stays eager.
    #[config(default = 2)]
    pub max_recaptures: usize,
}

impl GraphTrainerConfig {
    /// The warmup length actually used: never less than one eager step.
    pub(crate) fn effective_warmup(&self) -> usize {
        self.warmup_steps.max(1)
    }
}
