//! `GraphTrainer`: the user-facing training step.

use std::marker::PhantomData;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, LearningRate};
use burn::tensor::Tensor;
use burn_backend::tensor::FloatTensor;

use super::cache::{GraphCache, Plan};
use super::config::GraphTrainerConfig;
use super::error::StepError;
use super::graphed::{CapturedStep, Fallback};
use super::input::{InputKey, StepInput, check_batch};
use super::mode::{FallbackReason, StepMode};
use super::pinning::{Pinned, buffers};
use super::registry::{self, Registration, TrainerId};
use super::report::TrainerReport;
use crate::backend::{CaptureSession, GraphBackend, GraphCapture, Recording};
use crate::optim::CapturableOptimizer;

/// The backend a trainer runs its steps on: autodiff over the decorator over `G`.
///
/// The decorator is not optional: without it the trainer could not see the step's op
/// signature or its capture breakers, and could not tell a static step from one that
/// would replay wrongly.
pub type TrainBackend<G> = Autodiff<GraphCapture<G>>;

/// The result of one step.
#[derive(Debug)]
pub struct StepOutcome<G: GraphBackend> {
    /// The step's loss, detached from the autodiff graph.
    pub loss: Tensor<TrainBackend<G>, 1>,
    /// How the step ran.
    pub mode: StepMode,
}

/// Trains a model with one optimizer step per call, as a CUDA graph where that is safe.
///
/// Each input shape goes through eager warmup steps whose op signatures must match,
/// then (on backends with hardware graphs) is captured once and replayed. Every step is
/// guarded: a batch of a new shape, a parameter shared with another trainer, or a step
/// with capture breakers runs eagerly, and [`StepMode::Eager`] says why.
///
/// # Panics in the step closure
/// The closure borrows the model, and the update is applied only after it returns. A
/// panic in the closure therefore propagates to the caller with the model and the
/// optimizer state as they were before the step; the trainer remains usable and the
/// step is not counted.
pub struct GraphTrainer<G, M, O, I, F>
where
    G: GraphBackend,
{
    pub(super) id: TrainerId,
    pub(super) config: GraphTrainerConfig,
    pub(super) device: G::Device,
    pub(super) model: Option<M>,
    pub(super) optimizer: O,
    pub(super) step_fn: F,
    pub(super) cache: GraphCache<CapturedStep<G>>,
    /// Parameters and optimizer state at fixed addresses, once a graph needs them.
    pub(super) pinned: Option<Pinned<G>>,
    /// Whether the model has been checked to sit on the pinned buffers since it last
    /// entered the trainer. Only `put_model` can change the buffers the trainer's model
    /// and optimizer use (the trainer never lends them out mutably), so replays skip the
    /// check (one identity query per parameter and state tensor) while this holds.
    pub(super) pins_verified: bool,
    /// Registered buffers, kept alive so that their identities stay unique.
    registration: Registration<FloatTensor<G>>,
    shared_with: Option<TrainerId>,
    pub(super) report: TrainerReport,
    last_mode: Option<StepMode>,
    _input: PhantomData<fn(&I)>,
}

impl<G, M, O, I, F> GraphTrainer<G, M, O, I, F>
where
    G: GraphBackend,
    M: AutodiffModule<TrainBackend<G>>,
    O: CapturableOptimizer<M, TrainBackend<G>>,
    I: StepInput<TrainBackend<G>>,
    F: FnMut(&M, &I) -> Tensor<TrainBackend<G>, 1>,
{
    /// A trainer for `model`, updated by `optimizer`, with `step_fn` computing the loss
    /// of one batch. The optimizer's state is created now, so every step runs the same
    /// ops, and the model's buffers are registered (a share with another trainer is
    /// detected here).
    pub fn new(model: M, mut optimizer: O, step_fn: F, config: GraphTrainerConfig) -> Self {
        let device = model.devices().into_iter().next().unwrap_or_default();
        optimizer.init_state(&model);
        let id = TrainerId::next();
        let mut trainer = Self {
            id,
            cache: GraphCache::new(config.max_graphs, config.effective_warmup()),
            config,
            device,
            model: Some(model),
            optimizer,
            step_fn,
            registration: Registration::new(id),
            pinned: None,
            pins_verified: false,
            shared_with: None,
            report: TrainerReport {
                trainer: Some(id),
                ..TrainerReport::default()
            },
            last_mode: None,
            _input: PhantomData,
        };
        trainer.register_buffers();
        trainer
    }

    /// Runs one training step on `batch`.
    pub fn step(&mut self, batch: I) -> Result<StepOutcome<G>, StepError> {
        if self.model.is_none() {
            return Err(StepError::ModelTakenOut);
        }
        let key = check_batch::<G>(&batch.float_tensors(), &self.device)?;
        self.shared_with = registry::shared_with(self.id);
        let plan = match self.shared_with {
            Some(other) => {
                // The other trainer may sit on this one's pinned buffers (a model cloned
                // from this trainer's): writing back into them would change its values.
                self.unpin();
                Plan::Eager(FallbackReason::SharedWithTrainer(other))
            }
            None => self
                .cache
                .plan(&key, G::supports_hardware_graphs(&self.device)),
        };
        let (loss, mode) = match plan {
            Plan::Warmup => self.warmup_step(&key, &batch)?,
            Plan::Eager(reason) => (self.eager_step(&batch, false)?.0, StepMode::Eager(reason)),
            Plan::Capture => self.graph_or_eager(&key, &batch, Self::capture_step)?,
            Plan::Replay => self.graph_or_eager(&key, &batch, Self::replay_step)?,
        };
        self.finish_step(&mode);
        Ok(StepOutcome { loss, mode })
    }

    /// Sets the learning rate of the following steps, without re-capturing: once the
    /// optimizer state is pinned, the value is written into the pinned buffer.
    pub fn set_lr(&mut self, lr: LearningRate) {
        if !self.write_lr(lr) {
            // A new lr tensor: if pins exist (the write into them failed), the next graph
            // step must see that the optimizer left them.
            self.optimizer.set_lr(lr);
            self.pins_verified = false;
        }
    }

    /// The model, for evaluation.
    ///
    /// Once the trainer has pinned (on GPUs, at the first capture), the model's
    /// parameters are the pinned buffers, and every later step overwrites them in place,
    /// as a replayed graph must. A clone of this model shares those buffers, so it is not
    /// a snapshot: to keep the current weights, save them (`into_record`, or read them to
    /// the host) before the next step. A clone handed to another trainer is detected as a
    /// shared buffer, and both trainers then run eagerly.
    pub fn model(&self) -> Option<&M> {
        self.model.as_ref()
    }

    /// Takes the model out (to save it, say). Steps fail with
    /// [`StepError::ModelTakenOut`] until it is put back. While it is out no step runs,
    /// so its values stay as they are.
    pub fn take_model(&mut self) -> Option<M> {
        self.model.take()
    }

    /// Puts a model back. Its buffers are registered again, so a model that now shares
    /// a buffer with another trainer is detected.
    pub fn put_model(&mut self, model: M) {
        self.optimizer.init_state(&model);
        self.model = Some(model);
        self.pins_verified = false;
        self.register_buffers();
    }

    /// The optimizer, for saving its record.
    pub fn optimizer(&self) -> &O {
        &self.optimizer
    }

    /// The configuration the trainer was made with.
    pub fn config(&self) -> &GraphTrainerConfig {
        &self.config
    }

    /// This trainer's identity in the share registry and in logs.
    pub fn id(&self) -> TrainerId {
        self.id
    }

    /// What the trainer did so far.
    pub fn report(&self) -> TrainerReport {
        TrainerReport {
            graphs_alive: self.cache.graphs_alive(),
            shared_with: self.shared_with,
            ..self.report.clone()
        }
    }

    /// Gives back the model and the optimizer; the trainer's buffers are unregistered.
    pub fn into_parts(self) -> (Option<M>, O) {
        (self.model, self.optimizer)
    }

    fn warmup_step(&mut self, key: &InputKey, batch: &I) -> Result<(Loss<G>, StepMode), StepError> {
        let device = self.device.clone();
        let (loss, recording) = G::rehearse(&device, || self.eager_step(batch, true))?;
        let recording = recording.unwrap_or_default();
        let mode = match self.cache.warmed(key, recording) {
            Some(reason) => StepMode::Eager(reason),
            None => StepMode::Eager(FallbackReason::Warmup),
        };
        Ok((loss, mode))
    }

    /// Runs a graph step, or the step eagerly with the reason the graph step failed.
    fn graph_or_eager(
        &mut self,
        key: &InputKey,
        batch: &I,
        graph_step: GraphStep<Self, I, G>,
    ) -> Result<(Loss<G>, StepMode), StepError> {
        let reason = match graph_step(self, key, batch) {
            Ok(done) => return Ok(done),
            Err(Fallback::Shape(reason)) => {
                self.cache.disable(key, reason.clone());
                reason
            }
            Err(Fallback::Trainer(reason)) => {
                self.unpin();
                self.cache.disable_all(reason.clone());
                reason
            }
            Err(Fallback::Repin) => FallbackReason::PinnedBuffersChanged,
        };
        let (loss, _) = self.eager_step(batch, false)?;
        Ok((loss, StepMode::Eager(reason)))
    }

    /// One eager optimizer step, optionally recorded.
    fn eager_step(
        &mut self,
        batch: &I,
        record: bool,
    ) -> Result<(Loss<G>, Option<Recording>), StepError> {
        let session = record.then(CaptureSession::begin);
        let model = self.model.as_ref().ok_or(StepError::ModelTakenOut)?;
        let loss = (self.step_fn)(model, batch);
        let [elements] = loss.dims();
        if elements != 1 {
            return Err(StepError::NonScalarLoss {
                shape: vec![elements],
            });
        }
        let grads = GradientsParams::from_grads(loss.backward(), model);
        let model = self.model.take().ok_or(StepError::ModelTakenOut)?;
        self.model = Some(self.optimizer.step(model, grads));
        self.write_back_eager();
        let recording = session.map(CaptureSession::finish);
        self.register_buffers();
        Ok((loss.detach(), recording))
    }

    fn finish_step(&mut self, mode: &StepMode) {
        self.report.count(mode);
        let changed = self.last_mode.as_ref() != Some(mode);
        if changed {
            tracing::info!(trainer = self.id.0, mode = mode.kind(), detail = ?mode, "graph trainer mode change");
            self.last_mode = Some(mode.clone());
        }
        tracing::debug!(trainer = self.id.0, step = self.report.steps, mode = ?mode, "graph trainer step");
    }

    /// Registers the current parameter and optimizer-state buffers, releasing the
    /// previous ones.
    pub(super) fn register_buffers(&mut self) {
        let buffers = buffers::<G, M, O>(self.model.as_ref(), &mut self.optimizer)
            .into_iter()
            .filter_map(|tensor| G::buffer_id(&tensor).map(|id| (id, tensor)))
            .collect();
        let shared = self.registration.replace(buffers);
        if shared.is_some() && self.shared_with.is_none() {
            tracing::info!(trainer = self.id.0, shared_with = ?shared, "trainer shares a buffer; running eagerly");
        }
        self.shared_with = shared;
    }
}

/// A capture or replay step of a trainer `T`.
type GraphStep<T, I, G> = fn(&mut T, &InputKey, &I) -> Result<(Loss<G>, StepMode), Fallback>;

/// A step's loss.
pub(crate) type Loss<G> = Tensor<TrainBackend<G>, 1>;
