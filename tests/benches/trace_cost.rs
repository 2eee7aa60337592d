//! CPU benchmark: the host time of a trace, without a GPU.
//!
//! A traced replay runs the step closure, the backward pass and the update with each op
//! matched against the graph's recording instead of running (`backend::trace`). That
//! host work is the same on every stack but for how an input's allocation is named, so
//! graphs emulated on Flex (`EmulatedGraphs`) measure it here, where a profiler can see
//! it: MSE and capturable Adam on `FusedLstm` + `Linear` (`fused-lstm`, at b8/t64/h128
//! unless `B/T/H` is given), on Burn's `nn::Lstm` + `Linear` (`nn-lstm`, a few ops per
//! time step) or on a two-layer Transformer encoder (`transformer`, h wide, four heads).
//! Prints the trace's host time per step, and the same step's time run eagerly.
//!
//! `cargo bench -p integration-tests --bench trace_cost [-- MODEL [B/T/H [STEPS]]]`

use std::time::Instant;

use burn::backend::Flex;
use burn::module::AutodiffModule;
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{
    EmulatedGraphs, GraphTrainer, GraphTrainerConfig, StepMode, TrainBackend,
};
use lstm_example::model::{Forecaster, FusedLstmRegressor};
use lstm_example::train::{from_bytes, to_bytes};
use lstm_example::{Batch, LstmRegressorConfig, SineTask};

#[path = "shared/transformer.rs"]
mod transformer;

type B = TrainBackend<Flex>;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let model = args.first().map_or("fused-lstm", String::as_str);
    let size: Vec<usize> = args
        .get(1)
        .map_or("8/64/128", String::as_str)
        .split('/')
        .map(|p| p.parse().expect("B/T/H"))
        .collect();
    let [b, t, h] = size[..] else {
        panic!("size is B/T/H")
    };
    let steps: usize = args.get(2).map_or(200, |s| s.parse().expect("STEPS"));

    let _graphs = EmulatedGraphs::on();
    let device = Default::default();
    let config = LstmRegressorConfig::new(h);
    let task = SineTask::new(7, config.d_input);
    match model {
        "fused-lstm" => {
            let weights = to_bytes(config.init::<Flex>(&device));
            let model: FusedLstmRegressor<B> = from_bytes::<B>(&config, weights, &device)
                .to_fused()
                .expect("nn::Lstm converts");
            measure(model, task, [b, t, h], steps);
        }
        "nn-lstm" => {
            let model: lstm_example::LstmRegressor<B> = config.init::<B>(&device);
            measure(model, task, [b, t, h], steps);
        }
        "transformer" => {
            let model = transformer::TransformerRegressor::<B>::new(config.d_input, h, &device);
            measure(model, task, [b, t, h], steps);
        }
        other => panic!("no model {other}: fused-lstm, nn-lstm or transformer"),
    }
}

/// Warms `model` up on emulated graphs, then times `steps` traced replays, and as many
/// eager steps of a clone that never captures (the floor of a trace's host time: the
/// same closure, autodiff and update, with kernels).
fn measure<M>(model: M, mut task: SineTask, [b, t, h]: [usize; 3], steps: usize)
where
    M: AutodiffModule<B> + Forecaster<B> + Clone + 'static,
{
    let eager_model = model.clone();
    let device = Default::default();
    let batches: Vec<Batch<B>> = (0..4).map(|_| task.next_batch(b, t, &device)).collect();
    let step = |model: &M, batch: &Batch<B>| model.mse(batch.x.clone(), batch.y.clone());
    let trainer_config = GraphTrainerConfig::new().with_verify_every(0);
    let adam = CapturableAdamConfig::new().init::<B>(&device);
    let mut trainer = GraphTrainer::new(model, adam, step, trainer_config);
    let mut next = batches.iter().cycle();
    for _ in 0..8 {
        trainer
            .step(next.next().unwrap().clone())
            .expect("warmup step");
    }
    let before = trainer.report();
    let started = Instant::now();
    let mut replayed = 0;
    for _ in 0..steps {
        let outcome = trainer.step(next.next().unwrap().clone()).expect("step");
        replayed += usize::from(outcome.mode == StepMode::Replayed);
    }
    let wall = started.elapsed().as_secs_f64() * 1e3 / steps as f64;
    let after = trainer.report();
    let traces = after.traces_matched - before.traces_matched;
    let eager_config = GraphTrainerConfig::new().with_capture(false);
    let adam = CapturableAdamConfig::new().init::<B>(&device);
    let mut eager = GraphTrainer::new(eager_model, adam, step, eager_config);
    let started = Instant::now();
    for _ in 0..steps {
        eager
            .step(next.next().unwrap().clone())
            .expect("eager step");
    }
    let eager_ms = started.elapsed().as_secs_f64() * 1e3 / steps as f64;
    println!(
        "b{b}/t{t}/h{h} on emulated graphs: {replayed} of {steps} steps replayed, {traces} traces \
         matched; trace {:.3} ms of host time per step; whole step {wall:.3} ms (with the \
         emulated replay's CPU kernels); eager step {eager_ms:.3} ms (its kernels included)",
        (after.trace_ms - before.trace_ms) / steps as f64,
    );
}
