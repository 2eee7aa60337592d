//! The graphed training step: warmup, guards, per-shape graphs, eager fallbacks.
//!
//! [`GraphTrainer`] is what a Burn user holds: hand it a model, a capturable optimizer
//! and a closure computing the loss of a batch, then call [`GraphTrainer::step`] in an
//! ordinary loop. Each step reports the mode it ran in, and every eager fallback its
//! typed reason.

mod cache;
mod config;
mod constant_pins;
mod error;
mod fit;
mod graphed;
mod guard;
mod input;
mod learner;
mod mode;
mod output;
mod parallel;
mod paths;
mod pinning;
mod random;
mod registry;
mod report;
mod trainer;
mod views;

pub use config::GraphTrainerConfig;
pub use error::{EmptyBatch, StepError};
pub use input::{InputKey, StepInput, hash_key_value};
pub use mode::{FallbackReason, StepChange, StepMode};
pub use output::StepOutput;
pub use registry::TrainerId;
pub use report::{ModeCounts, TrainerReport};
pub use trainer::{GraphTrainer, StepOutcome};
