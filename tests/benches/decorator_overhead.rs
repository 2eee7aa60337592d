//! CPU micro-benchmark: the decorator's cost outside a capture session.
//!
//! Runs the same LSTM training steps (Adam, MSE) on `Autodiff<Flex>` and on
//! `Autodiff<GraphCapture<Flex>>`, interleaved round by round so that both see the same
//! machine state, and reports the ratio of median step times. A second case times a
//! chain of tiny ops, where per-op overhead is largest relative to the work.
//!
//! `cargo bench -p integration-tests --bench decorator_overhead [-- --out FILE]` (cargo runs
//! benches from `tests/`, so give FILE as an absolute path).

use std::hint::black_box;
use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_graph_capture::GraphCapture;
use lstm_example::train::{from_bytes, to_bytes, train_eager};
use lstm_example::{LstmRegressorConfig, SineTask};

const ROUNDS: usize = 11;
const STEPS_PER_ROUND: usize = 10;
const SHAPE: (usize, usize) = (8, 16);
const HIDDEN: usize = 32;
const TINY_OPS: usize = 200_000;

/// Times `STEPS_PER_ROUND` training steps; returns seconds per step.
fn lstm_round<B: AutodiffBackend>(bytes: &[u8], seed: u64) -> f64 {
    let device = Default::default();
    let config = LstmRegressorConfig::new(HIDDEN);
    let mut model = from_bytes::<B>(&config, bytes.to_vec(), &device);
    let mut optimizer = AdamConfig::new().init();
    let mut task = SineTask::new(seed, 32);
    // One untimed step so that first-use costs stay out of the numbers.
    train_eager(&mut model, &mut optimizer, &mut task, SHAPE, 1, 1e-3);
    let start = Instant::now();
    black_box(train_eager(
        &mut model,
        &mut optimizer,
        &mut task,
        SHAPE,
        STEPS_PER_ROUND,
        1e-3,
    ));
    start.elapsed().as_secs_f64() / STEPS_PER_ROUND as f64
}

/// Times a chain of ops on a 4-element tensor; returns seconds per op.
fn tiny_ops_round<B: Backend>() -> f64 {
    let device = Default::default();
    let mut x = Tensor::<B, 1>::ones([4], &device);
    let start = Instant::now();
    for _ in 0..TINY_OPS {
        x = black_box(x.mul_scalar(1.0));
    }
    let elapsed = start.elapsed();
    black_box(x.into_data());
    elapsed.as_secs_f64() / TINY_OPS as f64
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

struct Case {
    name: &'static str,
    plain: f64,
    decorated: f64,
}

impl Case {
    fn measure(name: &'static str, mut round: impl FnMut(bool) -> f64) -> Self {
        let (mut plain, mut decorated) = (Vec::new(), Vec::new());
        for i in 0..ROUNDS {
            // Alternate which backend goes first in each round.
            if i % 2 == 0 {
                plain.push(round(false));
                decorated.push(round(true));
            } else {
                decorated.push(round(true));
                plain.push(round(false));
            }
        }
        Self {
            name,
            plain: median(plain),
            decorated: median(decorated),
        }
    }

    fn ratio(&self) -> f64 {
        self.decorated / self.plain
    }
}

fn main() {
    let out = std::env::args()
        .skip_while(|a| a != "--out")
        .nth(1)
        .map(std::path::PathBuf::from);

    let bytes = to_bytes(LstmRegressorConfig::new(HIDDEN).init::<Flex>(&Default::default()));
    let lstm = Case::measure("LSTM training step", |decorated| {
        if decorated {
            lstm_round::<Autodiff<GraphCapture<Flex>>>(&bytes, 1)
        } else {
            lstm_round::<Autodiff<Flex>>(&bytes, 1)
        }
    });
    // The same backend on both sides: the spread this benchmark cannot resolve.
    let noise = Case::measure("LSTM training step, Flex vs Flex (noise floor)", |_| {
        lstm_round::<Autodiff<Flex>>(&bytes, 1)
    });
    let tiny = Case::measure("tiny op (mul_scalar on 4 elements)", |decorated| {
        if decorated {
            tiny_ops_round::<GraphCapture<Flex>>()
        } else {
            tiny_ops_round::<Flex>()
        }
    });

    let (b, t) = SHAPE;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut report = format!(
        "# Decorator overhead outside a capture session (CPU)\n\n\
         `cargo bench -p integration-tests --bench decorator_overhead`, release build, \
         {ROUNDS} interleaved rounds, medians. LSTM: batch {b}, time {t}, hidden {HIDDEN}, \
         input 32, Adam, {STEPS_PER_ROUND} steps per round. Tiny op: {TINY_OPS} ops per round. \
         CPU machine with {cores} cores.\n\n\
         | case | Flex | GraphCapture<Flex> | ratio |\n|---|---|---|---|\n"
    );
    for case in [&lstm, &noise, &tiny] {
        report.push_str(&format!(
            "| {} | {:.3} µs | {:.3} µs | {:.3} |\n",
            case.name,
            case.plain * 1e6,
            case.decorated * 1e6,
            case.ratio()
        ));
    }
    print!("{report}");
    if let Some(path) = out {
        std::fs::write(&path, &report).expect("writing the report");
        println!("wrote {}", path.display());
    }
}
