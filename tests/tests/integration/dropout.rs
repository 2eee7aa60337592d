//! Dropout inside trainer steps (issue 15), on the CPU: masks come from the trainer's
//! generator, so they break no capture, every step draws fresh ones, and a seeded run
//! draws the same ones again.

use burn::backend::Flex;
use burn::module::AutodiffModule;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_graph_capture::optim::CapturableSgdConfig;
use burn_graph_capture::{
    BreakerKind, FallbackReason, GraphTrainer, GraphTrainerConfig, StepMode, TrainBackend,
};
use lstm_example::model::{DropoutLstmRegressor, DropoutLstmRegressorConfig, Forecaster};
use lstm_example::train::{load_bytes, to_bytes};
use lstm_example::{Batch, SineTask, TokenBatch, TokenTask};

type B = TrainBackend<Flex>;
type Model = DropoutLstmRegressor<B>;

const D_INPUT: usize = 4;
const WARMUP: usize = 3;

/// A seeded model (the weights, and the stream of the trainer made next). Seeds and
/// streams are process-wide: every test here holds `common::rng` exclusively.
fn seeded_model(seed: u64) -> Model {
    let device = Default::default();
    B::seed(&device, seed);
    DropoutLstmRegressorConfig::new(8)
        .with_d_input(D_INPUT)
        .with_dropout(0.5)
        .init(&device)
}

fn batch() -> Batch<B> {
    SineTask::new(3, D_INPUT).next_batch(4, 5, &Default::default())
}

/// `steps` losses (bits) of SGD at `lr` on one fixed batch, and the step modes. With
/// `extra_random`, the step also draws an int tensor, which no generator serves.
fn run(model: Model, lr: f64, steps: usize, extra_random: bool) -> (Vec<u32>, Vec<StepMode>) {
    let sgd = CapturableSgdConfig::new().init::<B>(&Default::default());
    let loss = move |m: &Model, b: &Batch<B>| {
        let loss = m.mse(b.x.clone(), b.y.clone());
        if extra_random {
            let ints = Tensor::<B, 1, Int>::random([2], Distribution::Default, &loss.device());
            return loss + ints.float().sum() * 0.0;
        }
        loss
    };
    let mut trainer = GraphTrainer::new(model, sgd, loss, GraphTrainerConfig::new());
    trainer.set_lr(lr);
    let (mut losses, mut modes) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let outcome = trainer.step(batch()).expect("step");
        losses.push(outcome.output.into_scalar().to_bits());
        modes.push(outcome.mode);
    }
    (losses, modes)
}

#[test]
fn dropout_breaks_no_capture_but_other_random_ops_do() {
    let _rng = crate::common::rng::exclusive();
    let (_, modes) = run(seeded_model(1), 1e-2, WARMUP + 2, false);
    // After warmup only the missing hardware graphs keep the steps eager.
    for mode in &modes[WARMUP..] {
        assert_eq!(*mode, StepMode::Eager(FallbackReason::NoHardwareGraphs));
    }
    let (_, modes) = run(seeded_model(1), 1e-2, WARMUP + 1, true);
    match &modes[WARMUP] {
        StepMode::Eager(FallbackReason::CaptureBreaker(breaker)) => {
            assert_eq!(breaker.kind, BreakerKind::Rng);
            assert_eq!(breaker.op, "int_random");
        }
        other => panic!("expected the int draw's breaker, got {other:?}"),
    }
}

#[test]
fn every_step_draws_fresh_masks() {
    let _rng = crate::common::rng::exclusive();
    // With a zero learning rate the weights stay: only the masks change the loss.
    let (losses, _) = run(seeded_model(2), 0.0, 6, false);
    for (i, a) in losses.iter().enumerate() {
        for b in &losses[i + 1..] {
            assert_ne!(a, b, "two steps drew the same masks: {losses:?}");
        }
    }
}

#[test]
fn a_seed_draws_the_same_masks_again_and_another_seed_does_not() {
    let _rng = crate::common::rng::exclusive();
    let (first, _) = run(seeded_model(5), 1e-2, 6, false);
    let (again, _) = run(seeded_model(5), 1e-2, 6, false);
    assert_eq!(first, again);
    let (other, _) = run(seeded_model(6), 1e-2, 6, false);
    assert_ne!(first, other);
}

#[test]
fn reseeding_between_steps_starts_the_stream_over() {
    let _rng = crate::common::rng::exclusive();
    let model = seeded_model(9);
    let sgd = CapturableSgdConfig::new().init::<B>(&Default::default());
    let loss = |m: &Model, b: &Batch<B>| m.mse(b.x.clone(), b.y.clone());
    let mut trainer = GraphTrainer::new(model, sgd, loss, GraphTrainerConfig::new());
    trainer.set_lr(0.0);
    let mut step = || {
        trainer
            .step(batch())
            .unwrap()
            .output
            .into_scalar()
            .to_bits()
    };
    let (a, b) = (step(), step());
    assert_ne!(a, b);
    // The trainer was the first stream taken after seeding 9: so it is again.
    B::seed(&Default::default(), 9);
    assert_eq!(step(), a);
    assert_eq!(step(), b);
}

/// A token model with dropout after its embedding, as a new user would write one.
#[derive(Module, Debug)]
struct TokenNet<B: Backend> {
    embedding: burn::nn::Embedding<B>,
    dropout: burn::nn::Dropout,
    head: burn::nn::Linear<B>,
}

impl<B: Backend> TokenNet<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            embedding: burn::nn::EmbeddingConfig::new(12, 8).init(device),
            dropout: burn::nn::DropoutConfig::new(0.3).init(),
            head: burn::nn::LinearConfig::new(8, 12).init(device),
        }
    }

    fn loss(&self, batch: &TokenBatch<B>) -> Tensor<B, 1> {
        let hidden = self
            .dropout
            .forward(self.embedding.forward(batch.tokens.clone()));
        let logits = self.head.forward(hidden);
        let [b, t, v] = logits.dims();
        burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(
                logits.reshape([b * t, v]),
                batch.targets.clone().reshape([b * t]),
            )
    }
}

/// Losses of 8 steps with evaluation (on the inner backend), a clone and a checkpoint
/// reload (`put_model`) between steps, and the modes of the steps.
fn token_run(capture: bool) -> (Vec<u32>, Vec<StepMode>) {
    let device = Default::default();
    B::seed(&device, 3);
    let model = TokenNet::<B>::new(&device);
    let adam = burn_graph_capture::optim::CapturableAdamConfig::new()
        .with_learning_rate(1e-2)
        .init::<B>(&device);
    let loss = |m: &TokenNet<B>, b: &TokenBatch<B>| m.loss(b);
    let config = GraphTrainerConfig::new().with_capture(capture);
    let mut trainer = GraphTrainer::new(model, adam, loss, config);
    let mut task = TokenTask::new(1, 12);
    let (mut losses, mut modes) = (Vec::new(), Vec::new());
    for step in 0..8 {
        let outcome = trainer.step(task.next_batch(4, 6, &device)).expect("step");
        losses.push(outcome.output.into_scalar().to_bits());
        modes.push(outcome.mode);
        let model = trainer.model().expect("model").clone();
        // Evaluation: no dropout on the inner backend, and nothing drawn.
        let _eval = model.valid().loss(&task.next_batch(2, 6, &device));
        if step == 4 {
            let bytes = to_bytes(model.clone());
            trainer.put_model(load_bytes(model, bytes, &device));
        }
    }
    (losses, modes)
}

#[test]
fn a_token_model_with_dropout_trains_as_with_capture_off_through_reloads_and_evaluation() {
    let _rng = crate::common::rng::exclusive();
    let (graphed, modes) = token_run(true);
    let (eager, _) = token_run(false);
    assert_eq!(graphed, eager);
    for mode in &modes {
        assert!(
            !matches!(mode, StepMode::Eager(FallbackReason::CaptureBreaker(_))),
            "{modes:?}"
        );
    }
}
