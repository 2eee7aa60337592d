//! Capturable optimizers: SGD (momentum, weight decay), Adam and AdamW.
//!
//! A CUDA graph replays the exact kernels and scalar arguments it recorded. Burn's own
//! optimizers pass the learning rate and Adam's bias corrections as host scalars that
//! change every step, so a replayed Burn optimizer would keep applying the values of the
//! captured step (burn#5779). These optimizers keep every step-varying quantity in a
//! device tensor (learning rate, step count) and derive the rest (bias corrections)
//! from them inside the step, so a replay computes what an eager step would (I3).
//!
//! All state lives in rank-1 tensors of the inner backend: per-parameter state holds a
//! flattened copy of the parameter's shape, and scalars are tensors of shape `[1]`. The
//! step API can therefore pin, copy and compare state without knowing parameter ranks.

mod adam;
mod capturable;
mod mapping;
mod record;
mod rule;
mod scalars;
mod sgd;

pub use adam::{
    AdamRule, AdamTerms, AdamWRule, AdamWTerms, CapturableAdam, CapturableAdamConfig,
    CapturableAdamW, CapturableAdamWConfig,
};
pub use capturable::Capturable;
pub use record::{CapturableRecord, CapturableRecordItem};
pub use rule::UpdateRule;
pub use scalars::{BiasCorrection, DeviceScalars, approximate_bias_correction, started};
pub use sgd::{CapturableSgd, CapturableSgdConfig, SgdRule, SgdTerms};

use burn::module::{AutodiffModule, ParamId};
use burn::optim::{GradientsParams, LearningRate};
use burn::record::Record;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

/// Which piece of optimizer state a tensor is, as seen by [`CapturableOptimizer::visit_state`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateSlot {
    /// The learning rate, shape `[1]`.
    LearningRate,
    /// The number of steps taken so far, shape `[1]`, as a float.
    StepCount,
    /// Per-parameter state (a momentum, a moment), flattened to the parameter's size.
    Param {
        /// The parameter this state belongs to.
        id: ParamId,
        /// Which of that parameter's state tensors (0, 1, ...).
        index: usize,
    },
}

/// An optimizer whose step can be recorded once and replayed.
///
/// Rules every implementation follows:
/// - [`init_state`](Self::init_state) creates all state before the first step, so every
///   step runs the same ops (warmup signatures match from the first step on);
/// - [`step`](Self::step) reads the learning rate and step count from device tensors and
///   writes the advanced step count back as a new tensor: no host scalar in it varies
///   between steps;
/// - [`visit_state`](Self::visit_state) visits every state tensor in the same order on
///   every call, and lets the caller replace a tensor by one of equal shape (the step
///   API swaps in pinned copies).
pub trait CapturableOptimizer<M, B>: Send
where
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    /// The optimizer state as a Burn record, for checkpoints.
    type Record: Record<B>;

    /// Creates the state of every float parameter of `module` that has none yet.
    fn init_state(&mut self, module: &M);

    /// Makes the state fit `module`, whose structure changed (a parameter resized under
    /// its id, added or removed; `GraphTrainer::put_model`): the state of parameters it
    /// lacks or resized is dropped, and zero state is created where it is missing, as
    /// [`init_state`](Self::init_state) does. The learning rate and step count stay.
    ///
    /// The default only creates missing state; the trainer then refuses steps with
    /// `StepError::OptimizerStateMismatch` while state of another size or of removed
    /// parameters remains.
    fn fit_state(&mut self, module: &M) {
        self.init_state(module);
    }

    /// Applies one update to every parameter that has a gradient in `grads`.
    fn step(&mut self, module: M, grads: GradientsParams) -> M;

    /// Sets the learning rate used by the following steps.
    ///
    /// This replaces the learning-rate tensor. The step API, which pins that tensor,
    /// writes into the pinned buffer instead (`GraphTrainer::set_lr`).
    fn set_lr(&mut self, lr: LearningRate);

    /// Calls `visitor` on every state tensor, in a stable order.
    fn visit_state(&mut self, visitor: &mut dyn FnMut(StateSlot, &mut Tensor<B::InnerBackend, 1>));

    /// The state as a record.
    fn to_record(&self) -> Self::Record;

    /// Restores the state from a record.
    fn load_record(self, record: Self::Record) -> Self;
}
