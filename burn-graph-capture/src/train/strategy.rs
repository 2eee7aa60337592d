//! [`GraphStrategy`]: burn-train's single-device loop, each step run by a
//! [`GraphTrainer`].
//!
//! The loop is the one burn-train 0.21 runs on one device (its own strategy is private
//! to burn-train): per batch, the scheduler's learning rate, one step, a metrics event,
//! the interrupter; per epoch, validation with the model's `InferenceStep`, the
//! checkpointer, early stopping. Only the step differs: warmup, capture and replays with
//! every guard, through the user's own `TrainStep`.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use burn::data::dataloader::Progress;
use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsAccumulator, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, LearningComponentsTypes,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainOutput,
    TrainStep, TrainingComponents, TrainingItem, TrainingModel, TrainingStrategy, ValidLoader,
};

use super::optimizer::SharedOptimizer;
use crate::backend::{GraphBackend, TrainBackend};
use crate::optim::CapturableOptimizer;
use crate::step::{
    FallbackReason, GraphTrainer, GraphTrainerConfig, StepError, StepInput, StepMode, TrainerReport,
};

/// A burn-train training strategy that runs each step as a CUDA graph where that is safe.
///
/// Build it with the capturable optimizer, hand [`optimizer`](Self::optimizer) to
/// `Learner::new`, and the strategy to `with_training_strategy` (it converts into
/// `TrainingStrategy::Custom`); `report` then tells what the steps did. The repository's
/// `examples/src/learner.rs` is a complete program, and `tests/tests/learner_strategy.rs`
/// checks it against burn-train's own loop.
///
/// # What holds, and what differs from burn-train's own loop
/// - Metrics, validation, checkpoints, early stopping, renderers and interruption work
///   as in burn-train's single-device strategy. The items the metrics read are copies
///   the strategy owns, never a graph's buffers.
/// - The model and optimizer state are written into the `Learner` after every epoch,
///   before it checkpoints; resuming from a checkpoint trains from the restored state.
/// - Gradient accumulation (`grads_accumulation`) cannot be captured (an update every
///   n steps): every step then runs burn-train's own loop eagerly, reported as
///   [`FallbackReason::GradientAccumulation`].
/// - A step the trainer refuses (an empty batch, a batch on another device) stops the
///   training through the interrupter, with the error as its message; the model keeps
///   its last values.
/// - It trains on the device the model sits on.
/// - burn-train's metrics thread reads each step's item while the next step runs. A read
///   that lands inside a capture window is held by the runtime until the window closes
///   (ARCHITECTURE.md, "Window rules"); before that fix the graphed and eager Learner
///   runs differed on the H200. The fix is not yet measured on a GPU.
pub struct GraphStrategy<G, O> {
    optimizer: SharedOptimizer<O>,
    config: GraphTrainerConfig,
    report: Arc<Mutex<Option<TrainerReport>>>,
    _backend: PhantomData<fn() -> G>,
}

impl<G, O> Clone for GraphStrategy<G, O> {
    fn clone(&self) -> Self {
        Self {
            optimizer: self.optimizer.clone(),
            config: self.config.clone(),
            report: Arc::clone(&self.report),
            _backend: PhantomData,
        }
    }
}

impl<G: GraphBackend, O> GraphStrategy<G, O> {
    /// A strategy training with `optimizer` (a capturable optimizer, such as
    /// `CapturableAdamConfig::new().init(&device)`), with the default trainer config.
    pub fn new(optimizer: O) -> Self {
        Self {
            optimizer: SharedOptimizer::new(optimizer),
            config: GraphTrainerConfig::new(),
            report: Arc::default(),
            _backend: PhantomData,
        }
    }

    /// Uses `config` for the trainer (warmup steps, graph cache, `capture = false` for
    /// an eager reference run).
    pub fn with_config(mut self, config: GraphTrainerConfig) -> Self {
        self.config = config;
        self
    }

    /// The optimizer to build the `Learner` with: it shares its state with this
    /// strategy, so checkpoints save and restore what the strategy trains.
    pub fn optimizer(&self) -> SharedOptimizer<O> {
        self.optimizer.clone()
    }

    /// What the trainer did in the latest training (updated every epoch); `None` before
    /// the first epoch ends.
    pub fn report(&self) -> Option<TrainerReport> {
        self.report
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn publish(&self, report: TrainerReport) {
        *self.report.lock().unwrap_or_else(PoisonError::into_inner) = Some(report);
    }
}

impl<G, O, LC> From<GraphStrategy<G, O>> for TrainingStrategy<LC>
where
    G: 'static,
    O: 'static,
    LC: LearningComponentsTypes,
    GraphStrategy<G, O>: SupervisedLearningStrategy<LC>,
{
    fn from(strategy: GraphStrategy<G, O>) -> Self {
        TrainingStrategy::Custom(Arc::new(strategy))
    }
}

type Model<LC> = <LC as LearningComponentsTypes>::TrainingModel;
type Input<LC> = <Model<LC> as TrainStep>::Input;
type Output<LC> = <Model<LC> as TrainStep>::Output;

impl<G, O, LC> SupervisedLearningStrategy<LC> for GraphStrategy<G, O>
where
    G: GraphBackend,
    O: CapturableOptimizer<Model<LC>, TrainBackend<G>>
        + Optimizer<Model<LC>, TrainBackend<G>>
        + Clone,
    LC: LearningComponentsTypes<Backend = TrainBackend<G>, Optimizer = SharedOptimizer<O>>,
    Input<LC>: StepInput<TrainBackend<G>>,
    Output<LC>: StepInput<TrainBackend<G>>,
{
    fn fit(
        &self,
        components: TrainingComponents<LC>,
        learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        starting_epoch: usize,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>) {
        let model = learner.model();
        let device = model.devices().into_iter().next().unwrap_or_default();
        let loaders = (
            dataloader_train.to_device(&device),
            dataloader_valid.to_device(&device),
        );
        let epochs = starting_epoch..=components.num_epochs;
        match components.grad_accumulation {
            Some(every) => {
                let steps = Accumulating {
                    accumulator: GradientsAccumulator::new(),
                    every: every.max(1),
                    pending: 0,
                    report: TrainerReport::default(),
                };
                self.run(steps, components, learner, loaders, epochs)
            }
            None => {
                let trainer = GraphTrainer::new(
                    model,
                    self.optimizer.get(),
                    |model: &Model<LC>, batch: &Input<LC>| model.step(rebuilt(batch)),
                    self.config.clone(),
                );
                let steps = Graphed { trainer, lr: None };
                self.run(steps, components, learner, loaders, epochs)
            }
        }
    }
}

impl<G: GraphBackend, O> GraphStrategy<G, O> {
    /// burn-train's single-device epochs, with `steps` running each training step.
    fn run<LC, S>(
        &self,
        mut steps: S,
        components: TrainingComponents<LC>,
        mut learner: Learner<LC>,
        (dataloader_train, dataloader_valid): (TrainLoader<LC>, ValidLoader<LC>),
        epochs: std::ops::RangeInclusive<usize>,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>)
    where
        LC: LearningComponentsTypes<Optimizer = SharedOptimizer<O>>,
        S: Stepper<LC>,
    {
        let mut processor = components.event_processor;
        let mut checkpointer = components.checkpointer;
        let mut early_stopping = components.early_stopping;
        let interrupter = components.interrupter;
        for epoch in epochs {
            let global = Progress::new(epoch, components.num_epochs);
            let mut iterator = dataloader_train.iter();
            let mut iteration = 0;
            while let Some(batch) = iterator.next() {
                iteration += 1;
                learner.lr_step();
                let lr = learner.lr_current();
                let progress = iterator.progress();
                let output = match steps.step(&mut learner, batch, lr) {
                    Ok(output) => output,
                    Err(error) => {
                        tracing::error!(%error, epoch, iteration, "graph strategy: step refused");
                        interrupter.stop(Some(&format!("graph strategy: step refused: {error}")));
                        break;
                    }
                };
                let item =
                    TrainingItem::new(output, progress, global.clone(), Some(iteration), Some(lr));
                processor.process_train(LearnerEvent::ProcessedItem(item));
                if interrupter.should_stop() {
                    break;
                }
            }
            processor.process_train(LearnerEvent::EndEpoch(epoch));
            self.publish(steps.sync(&mut learner, &self.optimizer));
            if interrupter.should_stop() {
                tracing::info!(reason = ?interrupter.get_message(), "training interrupted");
                break;
            }

            validate::<LC>(
                &learner,
                &dataloader_valid,
                &global,
                &mut processor,
                &interrupter,
            );
            if let Some(checkpointer) = &mut checkpointer {
                checkpointer.checkpoint(&learner, epoch, &components.event_store);
            }
            if let Some(early_stopping) = &mut early_stopping
                && early_stopping.should_stop(epoch, &components.event_store)
            {
                break;
            }
        }
        let report = steps.sync(&mut learner, &self.optimizer);
        tracing::info!(?report, "graph strategy finished");
        self.publish(report);
        (learner.model(), processor)
    }
}

/// One validation epoch, as burn-train runs it.
fn validate<LC: LearningComponentsTypes>(
    learner: &Learner<LC>,
    dataloader: &ValidLoader<LC>,
    global: &Progress,
    processor: &mut SupervisedTrainingEventProcessor<LC>,
    interrupter: &burn::train::Interrupter,
) {
    let model = learner.model().valid();
    let mut iterator = dataloader.iter();
    let mut iteration = 0;
    while let Some(batch) = iterator.next() {
        iteration += 1;
        let progress = iterator.progress();
        let item = TrainingItem::new(
            model.step(batch),
            progress,
            global.clone(),
            Some(iteration),
            None,
        );
        processor.process_valid(LearnerEvent::ProcessedItem(item));
        if interrupter.should_stop() {
            break;
        }
    }
    processor.process_valid(LearnerEvent::EndEpoch(global.items_processed));
}

/// The batch, as a value the user's `TrainStep` can take: the same tensors.
fn rebuilt<B: AutodiffBackend, I: StepInput<B>>(batch: &I) -> I {
    batch.with_tensors(&mut batch.tensors().into_iter())
}

/// How the strategy runs one training step.
trait Stepper<LC: LearningComponentsTypes> {
    /// One step on `batch` at learning rate `lr`; the item for the metrics.
    fn step(
        &mut self,
        learner: &mut Learner<LC>,
        batch: Input<LC>,
        lr: f64,
    ) -> Result<Output<LC>, StepError>;

    /// Writes the model and the optimizer state into `learner` and `optimizer` (before
    /// a checkpoint, say); returns what the steps did so far.
    fn sync(&mut self, learner: &mut Learner<LC>, optimizer: &LC::Optimizer) -> TrainerReport;
}

/// Steps through a [`GraphTrainer`]; `lr` is the last learning rate set.
struct Graphed<T> {
    trainer: T,
    lr: Option<f64>,
}

impl<LC, G, O, F> Stepper<LC>
    for Graphed<GraphTrainer<G, Model<LC>, O, Input<LC>, F, TrainOutput<Output<LC>>>>
where
    G: GraphBackend,
    O: CapturableOptimizer<Model<LC>, TrainBackend<G>> + Clone,
    LC: LearningComponentsTypes<Backend = TrainBackend<G>, Optimizer = SharedOptimizer<O>>,
    Input<LC>: StepInput<TrainBackend<G>>,
    Output<LC>: StepInput<TrainBackend<G>>,
    F: FnMut(&Model<LC>, &Input<LC>) -> TrainOutput<Output<LC>> + Clone,
{
    fn step(
        &mut self,
        _learner: &mut Learner<LC>,
        batch: Input<LC>,
        lr: f64,
    ) -> Result<Output<LC>, StepError> {
        if self.lr != Some(lr) {
            self.trainer.set_lr(lr);
            self.lr = Some(lr);
        }
        Ok(self.trainer.step(batch)?.output)
    }

    fn sync(&mut self, learner: &mut Learner<LC>, optimizer: &SharedOptimizer<O>) -> TrainerReport {
        if let Some(model) = self.trainer.model() {
            learner.load_model(model.clone().into_record());
        }
        optimizer.set(self.trainer.optimizer().clone());
        self.trainer.report()
    }
}

/// burn-train's eager loop with gradient accumulation: an update every `every` steps.
struct Accumulating<M> {
    accumulator: GradientsAccumulator<M>,
    every: usize,
    pending: usize,
    report: TrainerReport,
}

impl<LC: LearningComponentsTypes> Stepper<LC> for Accumulating<Model<LC>> {
    fn step(
        &mut self,
        learner: &mut Learner<LC>,
        batch: Input<LC>,
        _lr: f64,
    ) -> Result<Output<LC>, StepError> {
        let output = learner.train_step(batch);
        self.accumulator.accumulate(&learner.model(), output.grads);
        self.pending += 1;
        if self.pending >= self.every {
            learner.optimizer_step(self.accumulator.grads());
            self.pending = 0;
        }
        self.report
            .count(&StepMode::Eager(FallbackReason::GradientAccumulation));
        Ok(output.item)
    }

    /// The learner trained its own model and the shared optimizer: nothing to write.
    fn sync(&mut self, _learner: &mut Learner<LC>, _optimizer: &LC::Optimizer) -> TrainerReport {
        self.report.clone()
    }
}
