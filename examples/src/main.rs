//! Trains the example LSTM through `GraphCapture` and prints its losses.
//!
//! `cargo run --release -p lstm-example` trains on the CPU (Flex).

use burn::backend::{Autodiff, Flex};
use burn::optim::AdamConfig;
use burn_graph_capture::GraphCapture;
use lstm_example::train::train_eager;
use lstm_example::{LstmRegressorConfig, SineTask};

type Backend = Autodiff<GraphCapture<Flex>>;

const STEPS: usize = 30;
const BATCH: usize = 16;
const TIME: usize = 24;
const HIDDEN: usize = 32;
const LR: f64 = 1e-2;

fn main() {
    let device = Default::default();
    let mut model = LstmRegressorConfig::new(HIDDEN).init::<Backend>(&device);
    let mut optimizer = AdamConfig::new().init();
    let mut task = SineTask::new(7, 32);
    println!("training LSTM (batch {BATCH}, time {TIME}, hidden {HIDDEN}) on GraphCapture<Flex>");
    let losses = train_eager(
        &mut model,
        &mut optimizer,
        &mut task,
        (BATCH, TIME),
        STEPS,
        LR,
    );
    for (step, loss) in losses.iter().enumerate() {
        println!("step {:>3}  loss {loss:.6}", step + 1);
    }
}
