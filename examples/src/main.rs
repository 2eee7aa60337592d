//! Trains the example LSTM with `GraphTrainer` and prints its losses and report.
//!
//! `cargo run --release -p lstm-example` trains on the CPU (Flex): every step runs
//! eagerly, and the report says why (`NoHardwareGraphs` after warmup).
//! `cargo run --release -p lstm-example --features cuda` trains on an NVIDIA GPU through
//! this crate's runtime with Burn's fusion on top (`CudaFused`): warmup, one captured
//! step, then replays.

use burn::backend::Flex;
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{GraphTrainer, GraphTrainerConfig, StepMode, TrainBackend};
use lstm_example::train::{from_bytes, to_bytes};
use lstm_example::{Batch, LstmRegressor, LstmRegressorConfig, SineTask};

/// The inner backend: the CPU by default, `Fusion<CubeBackend<CudaGraphRuntime>>` with
/// `--features cuda`.
#[cfg(not(feature = "cuda"))]
type Inner = Flex;
#[cfg(feature = "cuda")]
type Inner = burn_graph_capture::CudaFused;

type B = TrainBackend<Inner>;

const STEPS: usize = 30;
const BATCH: usize = 16;
const TIME: usize = 24;
const HIDDEN: usize = 32;
const LR: f64 = 1e-2;

fn main() {
    let device = Default::default();
    let config = LstmRegressorConfig::new(HIDDEN);
    // Materialize the lazily initialized weights (on the CPU) before handing them over.
    let weights = to_bytes(config.init::<Flex>(&Default::default()));
    let model = from_bytes::<B>(&config, weights, &device);
    let optimizer = CapturableAdamConfig::new()
        .with_learning_rate(LR)
        .init::<B>(&device);
    let loss =
        |model: &LstmRegressor<B>, batch: &Batch<B>| model.loss(batch.x.clone(), batch.y.clone());
    let mut trainer = GraphTrainer::new(model, optimizer, loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(7, 32);

    let stack = std::any::type_name::<Inner>();
    println!(
        "training LSTM (batch {BATCH}, time {TIME}, hidden {HIDDEN}) with GraphTrainer on {stack}"
    );
    for step in 1..=STEPS {
        let batch = task.next_batch::<B>(BATCH, TIME, &device);
        let outcome = trainer.step(batch).expect("a well-formed batch");
        let loss: f32 = outcome.loss.into_scalar();
        let mode = match &outcome.mode {
            StepMode::Eager(reason) => format!("eager ({reason})"),
            other => other.kind().to_lowercase(),
        };
        println!("step {step:>3}  loss {loss:.6}  {mode}");
    }
    let report = serde_json::to_string_pretty(&trainer.report()).expect("reports serialize");
    println!("report: {report}");
}
