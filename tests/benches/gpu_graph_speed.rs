//! GPU benchmark: one LSTM training step as a replayed CUDA graph vs eagerly, on this
//! crate's runtime (`CubeBackend<CudaGraphRuntime>`, no fusion), measured side by side.
//!
//! Built by `scripts/gpu-check.sh pack`; run on the GPU machine. Prints a table.

use std::time::Instant;

use burn::backend::Flex;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::optim::{CapturableAdam, CapturableAdamConfig};
use burn_graph_capture::runtime::CudaGraphDevice;
use burn_graph_capture::{CudaCube, GraphTrainer, GraphTrainerConfig, StepMode, TrainBackend};
use lstm_example::train::{from_bytes, to_bytes};
use lstm_example::{Batch, LstmRegressor, LstmRegressorConfig, SineTask};

type B = TrainBackend<CudaCube>;
type Model = LstmRegressor<B>;

const WARMUP: usize = 5;
const TIMED: usize = 20;

fn adam(device: &CudaGraphDevice) -> CapturableAdam<B> {
    CapturableAdamConfig::new().init::<B>(device)
}

fn loss(model: &Model, batch: &Batch<B>) -> Tensor<B, 1> {
    model.loss(batch.x.clone(), batch.y.clone())
}

/// Median of `samples` milliseconds.
fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let configs: Vec<(usize, usize, usize)> = match std::env::args().nth(1).as_deref() {
        Some("all") => vec![(32, 64, 256), (8, 64, 128), (128, 32, 512)],
        _ => vec![(32, 64, 256)],
    };
    let device = CudaGraphDevice::new(0);
    let mut rows = Vec::new();
    for (b, t, h) in configs {
        let config = LstmRegressorConfig::new(h);
        let bytes = to_bytes(config.init::<Flex>(&Default::default()));
        let batches: Vec<Batch<B>> = {
            let mut task = SineTask::new(1, 32);
            (0..WARMUP + TIMED)
                .map(|_| task.next_batch(b, t, &device))
                .collect()
        };

        // Graphed: warmup and capture untimed, then each replay timed to a host read.
        let model = from_bytes::<B>(&config, bytes.clone(), &device);
        let mut trainer = GraphTrainer::new(model, adam(&device), loss, GraphTrainerConfig::new());
        for batch in &batches[..WARMUP] {
            trainer.step(batch.clone()).unwrap().loss.into_scalar();
        }
        let mut graphed = Vec::new();
        for batch in &batches[WARMUP..] {
            let start = Instant::now();
            let outcome = trainer.step(batch.clone()).unwrap();
            let _: f32 = outcome.loss.into_scalar();
            graphed.push(start.elapsed().as_secs_f64() * 1e3);
            assert_eq!(
                outcome.mode,
                StepMode::Replayed,
                "every timed step is a replay"
            );
        }
        let report = trainer.report();

        // Eager: the same step with the same optimizer, each timed to a host read.
        let mut model = from_bytes::<B>(&config, bytes, &device);
        let mut optimizer = adam(&device);
        optimizer.init_state(&model);
        let mut eager = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            let start = Instant::now();
            let l = loss(&model, batch);
            let grads = GradientsParams::from_grads(l.backward(), &model);
            model = optimizer.step(model, grads);
            let _: f32 = l.into_scalar();
            if i >= WARMUP {
                eager.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        rows.push((b, t, h, median(graphed), median(eager), report.capture_ms));
    }
    println!("| b/t/h | graphed ms/step | eager ms/step | eager / graphed | capture ms |");
    println!("|---|---|---|---|---|");
    for (b, t, h, g, e, c) in rows {
        println!("| {b}/{t}/{h} | {g:.2} | {e:.2} | {:.1}x | {c:.0} |", e / g);
    }
}
