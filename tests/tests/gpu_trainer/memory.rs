//! Device memory is flat over 1,000 replays (issue 5, acceptance 6), and over trainers
//! that capture and are dropped, one after another.
//!
//! Tolerance: bytes in use must be exactly equal at replay 100 and replay 1,000. Each
//! step allocates the same transient tensors (the uploaded batch, the learning-rate
//! value, the loss copy), all dropped and drained before measuring, and a replay itself
//! allocates nothing (I5), so any difference is a leak. Reserved bytes may shrink (the
//! pools may release empty pages) but must not grow. With `GPU_TRAINER_SHORT` (under
//! the sanitizer) the run is 100 replays, measured at 10 and 100.

use burn::prelude::*;
use burn_graph_capture::{FallbackReason, StepMode};
use lstm_example::SineTask;

use crate::common::{
    D_INPUT, MEDIUM, Plan, Stack, WARMUP, adam, adam_trainer, batch, device, device_bytes,
    graphed_run, lr_at, model_bytes, nothing, pool_usage, run_length,
};
use burn_graph_capture::GraphTrainerConfig;

/// Replays per run (before `run_length`); memory is measured at a tenth and at the end.
const REPLAYS: usize = 1000;

fn memory_is_flat_over_1000_replays<G: Stack>() {
    let replays_total = run_length(REPLAYS);
    let measure_at = [replays_total / 10, replays_total];
    let bytes = model_bytes(MEDIUM);
    let mut trainer = adam_trainer::<G>(MEDIUM, &bytes);
    let mut task = SineTask::new(51, D_INPUT);
    let mut replays = 0;
    let mut usage = Vec::new();
    let mut step = 0;
    while replays < replays_total {
        trainer.set_lr(lr_at(1e-2, step));
        let outcome = trainer.step(batch(&mut task, MEDIUM)).expect("step");
        match outcome.mode {
            StepMode::Replayed => replays += 1,
            // Every `verify_every` replays one step checks the graph eagerly.
            StepMode::Eager(FallbackReason::ReplayCheck) => {}
            ref mode => assert!(step <= WARMUP, "step {step} not replayed: {mode:?}"),
        }
        if measure_at.contains(&replays) && outcome.mode == StepMode::Replayed {
            let loss: f32 = outcome.output.into_scalar().elem();
            assert!(loss.is_finite(), "replay {replays}: loss {loss}");
            G::sync(&device()).expect("sync");
            let (in_use, reserved) = pool_usage();
            println!(
                "memory at replay {replays}: {in_use} bytes in use, {reserved} reserved; loss {loss}; report {}",
                serde_json::to_string(&trainer.report()).unwrap()
            );
            usage.push((in_use, reserved));
        }
        step += 1;
    }
    let [(in_use_first, reserved_first), (in_use_last, reserved_last)] = usage[..] else {
        panic!("measured {} times, not twice", usage.len());
    };
    assert_eq!(in_use_first, in_use_last, "bytes in use grew over replays");
    assert!(
        reserved_last <= reserved_first,
        "reserved bytes grew: {reserved_first} -> {reserved_last}"
    );
}

/// Trainers that capture, replay and are dropped leave nothing behind: after the 20th,
/// the runtime holds the device bytes it held after the first (each graph's private pool
/// goes with its graph). The fault-injection suite found a pool kept per trainer on the
/// fused stack after a failed replay (`bench/results/reliability-2026-12-01.md`); this
/// tells whether a plain drop keeps one too.
fn dropped_trainers_release_their_graph_pools<G: Stack>() {
    let bytes = model_bytes(MEDIUM);
    let plan = Plan {
        sizes: MEDIUM,
        seed: 52,
        steps: WARMUP + 4,
        base_lr: 1e-2,
    };
    let rounds = run_length(20).max(2);
    let mut usage = Vec::new();
    for round in 0..rounds {
        let run = graphed_run::<G, _>(
            plan,
            &bytes,
            adam::<G>(),
            GraphTrainerConfig::new(),
            &mut nothing::<G>,
        );
        assert!(
            run.modes.contains(&StepMode::Replayed),
            "round {round}: no replay: {:?}",
            run.modes
        );
        if round == 0 || round + 1 == rounds {
            G::sync(&device()).expect("sync");
            usage.push(device_bytes());
        }
    }
    println!("(pools, arena, graph pools) bytes after trainer 1 and {rounds}: {usage:?}");
    assert_eq!(
        usage[0], usage[1],
        "device bytes grew over dropped trainers"
    );
}

// On the stack (Fusion over CubeCL on this runtime) and on plain CubeCL.
stack_tests!(
    memory_is_flat_over_1000_replays,
    dropped_trainers_release_their_graph_pools
);
