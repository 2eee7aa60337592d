//! burn-train integration (feature `train`): run a `Learner`'s training steps as graphs.
//!
//! Switching an existing burn-train setup takes three changes: the backend type
//! ([`TrainBackend`](crate::TrainBackend)), a capturable optimizer shared with the
//! strategy ([`GraphStrategy::optimizer`]), and the strategy itself
//! (`.with_training_strategy(strategy.into())`). The model's `TrainStep` and
//! `InferenceStep`, metrics, checkpoints, early stopping, renderer and interrupter stay.
//! The batch type and the `TrainStep` output list their tensors ([`StepInput`]
//! (crate::StepInput), derivable); burn-train's `RegressionOutput`,
//! `ClassificationOutput` and `MultiLabelClassificationOutput` already do.

mod items;
mod optimizer;
mod strategy;

pub use optimizer::SharedOptimizer;
pub use strategy::GraphStrategy;
