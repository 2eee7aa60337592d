//! `GraphTrainer` on the GPU: capture, replay, and parity with eager training (issue 5).
//!
//! Every test is `#[ignore]`d: it needs an NVIDIA GPU and fails without one. Run on the
//! GPU machine through `scripts/gpu-check.sh`.
#![cfg(feature = "cuda")]

use burn::backend::Flex;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::optim::{CapturableAdam, CapturableAdamConfig};
use burn_graph_capture::runtime::CudaGraphDevice;
use burn_graph_capture::{
    CudaCube, FallbackReason, GraphTrainer, GraphTrainerConfig, StepMode, TrainBackend,
};
use lstm_example::train::{from_bytes, parameter_values, to_bytes};
use lstm_example::{Batch, LstmRegressor, LstmRegressorConfig, SineTask};

type B = TrainBackend<CudaCube>;
type Model = LstmRegressor<B>;

const STEPS: usize = 60;
const SHAPE: (usize, usize) = (8, 16);

fn device() -> CudaGraphDevice {
    CudaGraphDevice::new(0)
}

fn config() -> LstmRegressorConfig {
    LstmRegressorConfig::new(32)
}

fn model(bytes: &[u8]) -> Model {
    from_bytes(&config(), bytes.to_vec(), &device())
}

fn adam() -> CapturableAdam<B> {
    CapturableAdamConfig::new()
        .with_learning_rate(1e-2)
        .init::<B>(&device())
}

fn loss(model: &Model, batch: &Batch<B>) -> Tensor<B, 1> {
    model.loss(batch.x.clone(), batch.y.clone())
}

/// Largest relative difference between two parameter sets.
fn max_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y))
        .map(|(x, y)| ((x - y).abs() / y.abs().max(1e-6)) as f64)
        .fold(0.0, f64::max)
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn replayed_training_equals_eager_training() {
    let bytes = to_bytes(config().init::<Flex>(&Default::default()));
    let (b, t) = SHAPE;

    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(11, 32);
    let mut graphed = Vec::new();
    let mut modes = Vec::new();
    for step in 0..STEPS {
        trainer.set_lr(1e-2 / (1.0 + step as f64 * 0.1));
        let outcome = trainer.step(task.next_batch(b, t, &device())).unwrap();
        modes.push(outcome.mode);
        graphed.push(outcome.loss.into_scalar());
    }
    let report = trainer.report();
    println!(
        "trainer report: {}",
        serde_json::to_string(&report).unwrap()
    );
    assert_eq!(modes[0], StepMode::Eager(FallbackReason::Warmup));
    assert_eq!(modes[3], StepMode::Captured, "{modes:?}");
    assert!(
        modes[4..].iter().all(|m| *m == StepMode::Replayed),
        "{modes:?}"
    );

    let mut eager_model = model(&bytes);
    let mut optimizer = adam();
    optimizer.init_state(&eager_model);
    let mut task = SineTask::new(11, 32);
    let mut eager = Vec::new();
    for step in 0..STEPS {
        optimizer.set_lr(1e-2 / (1.0 + step as f64 * 0.1));
        let batch = task.next_batch::<B>(b, t, &device());
        let loss = loss(&eager_model, &batch);
        let grads = GradientsParams::from_grads(loss.backward(), &eager_model);
        eager_model = optimizer.step(eager_model.clone(), grads);
        eager.push(loss.into_scalar());
    }

    let loss_diff = graphed
        .iter()
        .zip(&eager)
        .map(|(g, e)| ((g - e).abs() / e.abs()) as f64)
        .fold(0.0, f64::max);
    let params = max_rel(
        &parameter_values(trainer.model().unwrap()),
        &parameter_values(&eager_model),
    );
    println!("graphed vs eager: max loss rel diff {loss_diff:e}, max param rel diff {params:e}");
    println!("losses: first {} last {}", graphed[0], graphed[STEPS - 1]);
    assert!(loss_diff <= 1e-6, "losses diverge: {loss_diff:e}");
    assert!(params <= 1e-6, "parameters diverge: {params:e}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_smaller_last_batch_gets_its_own_graph_or_runs_eagerly() {
    let bytes = to_bytes(config().init::<Flex>(&Default::default()));
    let trainer_config = GraphTrainerConfig::new().with_max_graphs(1);
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, trainer_config);
    let mut task = SineTask::new(12, 32);
    for _ in 0..6 {
        trainer.step(task.next_batch(8, 16, &device())).unwrap();
    }
    let smaller = trainer.step(task.next_batch(5, 16, &device())).unwrap();
    assert_eq!(
        smaller.mode,
        StepMode::Eager(FallbackReason::GraphCacheFull)
    );
    let back = trainer.step(task.next_batch(8, 16, &device())).unwrap();
    assert_eq!(
        back.mode,
        StepMode::Replayed,
        "the eager step kept the pins"
    );
    let loss: f32 = back.loss.into_scalar();
    assert!(loss.is_finite());
}
