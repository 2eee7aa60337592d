//! Module state beyond parameters, on the CPU: BatchNorm's running statistics and a
//! parameter tied through two fields both pass warmup (they would graph on a GPU),
//! and train exactly as eager Burn code does.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::optim::{CapturableAdam, CapturableAdamConfig};
use burn_graph_capture::{FallbackReason, GraphTrainer, GraphTrainerConfig, StepMode};
use lstm_example::train::parameter_bits;

use crate::common::B;
use crate::common::models::{BnMlp, Regression, TiedMlp};

const STEPS: usize = 8;

fn batch(step: usize) -> Regression<B> {
    Regression::new(step, 6, &Default::default())
}

fn adam() -> CapturableAdam<B> {
    CapturableAdamConfig::new()
        .with_learning_rate(1e-2)
        .init::<B>(&Default::default())
}

/// A model trained on regression batches.
trait Regressor: AutodiffModule<B> {
    fn loss(&self, batch: &Regression<B>) -> Tensor<B, 1>;
}

impl Regressor for BnMlp<B> {
    fn loss(&self, batch: &Regression<B>) -> Tensor<B, 1> {
        BnMlp::loss(self, batch)
    }
}

impl Regressor for TiedMlp<B> {
    fn loss(&self, batch: &Regression<B>) -> Tensor<B, 1> {
        TiedMlp::loss(self, batch)
    }
}

type LossFn<M> = fn(&M, &Regression<B>) -> Tensor<B, 1>;
type Trainer<M> = GraphTrainer<burn::backend::Flex, M, CapturableAdam<B>, Regression<B>, LossFn<M>>;

/// `STEPS` trainer steps: each loss's bits, and the trainer. Every step after warmup
/// would have graphed on a GPU. `each` sees the model after every step.
fn with_trainer<M: Regressor>(model: M, mut each: impl FnMut(usize, &M)) -> (Vec<u32>, Trainer<M>) {
    let mut trainer = GraphTrainer::new(
        model,
        adam(),
        M::loss as LossFn<M>,
        GraphTrainerConfig::new(),
    );
    let mut losses = Vec::new();
    let mut modes = Vec::new();
    for step in 0..STEPS {
        let outcome = trainer.step(batch(step)).unwrap();
        losses.push(outcome.output.into_scalar().to_bits());
        modes.push(outcome.mode);
        each(step, trainer.model().unwrap());
    }
    for mode in &modes[GraphTrainerConfig::new().warmup_steps..] {
        assert_eq!(
            *mode,
            StepMode::Eager(FallbackReason::NoHardwareGraphs),
            "{modes:?}"
        );
    }
    (losses, trainer)
}

/// The same steps as plain Burn code; `after` runs after each optimizer step.
fn plain<M: Regressor>(mut model: M, mut after: impl FnMut(M) -> M) -> (Vec<u32>, M) {
    let mut optimizer = adam();
    optimizer.init_state(&model);
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let loss = model.loss(&batch(step));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = after(optimizer.step(model, grads));
        losses.push(loss.into_scalar().to_bits());
    }
    (losses, model)
}

#[test]
fn batch_norm_passes_warmup_and_its_running_stats_follow_eager_training() {
    let _rng = crate::common::rng::shared();
    let model = BnMlp::<B>::new(5, &Default::default());
    // Burn shares a `RunningState` between clones: the trainer takes a state of its own
    // when it is made, so it trains first and the clone starts from the same values.
    let reference = model.clone();
    let (losses, trainer) = with_trainer(model, |_, _| {});
    let (plain_losses, plain_model) = plain(reference, |m| m);
    assert_eq!(losses, plain_losses);
    let trained = trainer.model().unwrap();
    assert_eq!(
        parameter_bits(trained),
        parameter_bits(&plain_model.valid())
    );
    assert_eq!(trained.running_stats(), plain_model.running_stats());
    let (mean, _) = trained.running_stats();
    assert!(
        mean.iter().any(|m| *m != 0.0),
        "the running mean moved: {mean:?}"
    );
}

#[test]
fn a_snapshot_keeps_its_running_stats_while_training_goes_on() {
    let _rng = crate::common::rng::shared();
    let loss = |model: &BnMlp<B>, batch: &Regression<B>| model.loss(batch);
    let model = BnMlp::<B>::new(5, &Default::default());
    let mut trainer = GraphTrainer::new(model, adam(), loss, GraphTrainerConfig::new());
    trainer.step(batch(0)).unwrap();
    let clone = trainer.model().unwrap().clone();
    let valid = trainer.model().unwrap().valid();
    let before = clone.running_stats();
    for step in 1..STEPS {
        trainer.step(batch(step)).unwrap();
    }
    assert_ne!(
        trainer.model().unwrap().running_stats(),
        before,
        "training moved them"
    );
    assert_eq!(clone.running_stats(), before, "a clone is a snapshot");
    let read = |t: Tensor<burn_graph_capture::GraphCapture<burn::backend::Flex>, 1>| {
        t.into_data().to_vec::<f32>().unwrap()
    };
    assert_eq!(read(valid.norm_mean()), before.0, "so is a valid() copy");
}

#[test]
fn a_tied_parameter_passes_warmup_and_stays_tied() {
    let _rng = crate::common::rng::shared();
    let model = TiedMlp::<B>::new(&Default::default());
    assert!(model.tied());
    // Plain Burn code keeps the tie only by hand: its optimizers update the first field.
    let (plain_losses, plain_model) = plain(model.clone(), |mut m| {
        m.retie();
        m
    });
    let (losses, trainer) =
        with_trainer(model, |step, m| assert!(m.tied(), "tied after step {step}"));
    assert_eq!(losses, plain_losses);
    assert_eq!(
        parameter_bits(trainer.model().unwrap()),
        parameter_bits(&plain_model)
    );
}
