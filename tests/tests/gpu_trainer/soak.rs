//! Soak (issue 14, part 5): 10,000 replays of the reference step (b32/t64/h256, Adam).
//!
//! - Device memory in use is the same at replay 1,000 and at the end, and host RSS grows
//!   by less than 16 MiB between them (allocator noise; a per-step leak of even a few
//!   hundred bytes would exceed it).
//! - Every 100th step is checked against eager training from the same state: the
//!   trainer's model and optimizer are copied (values stay values), the copy takes the
//!   step eagerly, and its loss and new parameters must equal the replay's bit for bit.
//!
//! With `GPU_TRAINER_SHORT`: 1,000 replays, measured at 100 and at the end.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::StepMode;
use lstm_example::SineTask;
use lstm_example::train::parameter_values;

use crate::common::{
    D_INPUT, Sizes, Stack, WARMUP, adam_trainer, batch, device, loss, lr_at, model_bytes,
    pool_usage, run_length,
};

/// The benchmarks' reference step.
const REFERENCE: Sizes = Sizes {
    batch: 32,
    time: 64,
    hidden: 256,
};

/// Replays per soak (before `run_length`).
const REPLAYS: usize = 10_000;

/// Every how many steps a replay is checked against an eager step from the same state.
const CHECK_EVERY: usize = 100;

/// Host resident memory, from `/proc/self/statm`.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("resident pages");
    pages * 4096
}

fn ten_thousand_replays_stay_flat_and_equal_eager<G: Stack>() {
    let total = run_length(REPLAYS);
    let measure_at = [total / 10, total];
    let bytes = model_bytes(REFERENCE);
    let mut trainer = adam_trainer::<G>(REFERENCE, &bytes);
    let mut task = SineTask::new(71, D_INPUT);
    let (mut replays, mut step, mut checked) = (0, 0, 0);
    let mut usage = Vec::new();
    while replays < total {
        let lr = lr_at(1e-3, step);
        trainer.set_lr(lr);
        let batch = batch::<G>(&mut task, REFERENCE);
        // The eager twin of this step, from copies of the trainer's state.
        let twin = (step % CHECK_EVERY == 0 && step > WARMUP).then(|| {
            let model = trainer.model().expect("model").clone();
            let mut optimizer = trainer.optimizer().clone();
            optimizer.set_lr(lr);
            let l = loss::<G>(&model, &batch);
            let grads = GradientsParams::from_grads(l.backward(), &model);
            let model = optimizer.step(model, grads);
            let l: f32 = l.into_scalar().elem();
            (l, parameter_values(&model.valid()))
        });
        let outcome = trainer.step(batch).expect("step");
        match outcome.mode {
            StepMode::Replayed => replays += 1,
            // Every `verify_every` replays one step checks the graph eagerly.
            StepMode::Eager(burn_graph_capture::FallbackReason::ReplayCheck) => {}
            ref mode => assert!(step <= WARMUP, "step {step} not replayed: {mode:?}"),
        }
        let graphed: f32 = outcome.output.into_scalar().elem();
        if let Some((eager, params)) = twin {
            assert_eq!(
                graphed.to_bits(),
                eager.to_bits(),
                "step {step}: replay loss {graphed}, eager step from the same state {eager}"
            );
            let replayed = parameter_values(&trainer.model().expect("model").valid());
            assert!(
                replayed == params,
                "step {step}: parameters differ from the eager step"
            );
            checked += 1;
        }
        if measure_at.contains(&replays) && outcome.mode == StepMode::Replayed {
            G::sync(&device()).expect("sync");
            let (in_use, reserved) = pool_usage();
            let rss = rss_bytes();
            println!(
                "replay {replays}: {in_use} bytes in use, {reserved} reserved, RSS {rss}; loss {graphed}"
            );
            usage.push((in_use, rss));
        }
        step += 1;
    }
    let [(in_use_first, rss_first), (in_use_last, rss_last)] = usage[..] else {
        panic!("measured {} times, not twice", usage.len());
    };
    println!(
        "{checked} replays checked against eager steps; report {:?}",
        trainer.report()
    );
    assert!(
        checked >= total / CHECK_EVERY - 1,
        "checked {checked} steps"
    );
    assert_eq!(in_use_first, in_use_last, "device bytes in use grew");
    assert!(
        rss_last < rss_first + 16 * 1024 * 1024,
        "host RSS grew from {rss_first} to {rss_last}"
    );
}

stack_tests!(ten_thousand_replays_stay_flat_and_equal_eager);
