//! Injected failures at each stage of a graph's life (issue 14, fault injection; feature
//! `fault-injection`). For every stage: the step that meets the failure completes eagerly
//! with a typed reason, losses and final parameters equal eager training bit for bit,
//! the next steps run (the stream stays healthy), and device memory in use is the same
//! after 100 injected failures as after the first.

use burn_graph_capture::runtime::fault::{FaultStage, arm, disarm_all, fired};
use burn_graph_capture::{FallbackReason, GraphTrainerConfig, StepMode};

use crate::common::{
    MEDIUM, Plan, Stack, WARMUP, adam, device, device_bytes, eager_run, graphed_run, model_bytes,
    nothing, run_length,
};

/// Steps per run: warmup, capture and a few replays.
const STEPS: usize = 8;

/// The step before which `stage` is armed: replays fail at a replay, everything else in
/// the first capture (a pin there is the batch's static copy; the model and optimizer
/// state were pinned by the last warmup step).
fn armed_before(stage: FaultStage) -> usize {
    match stage {
        FaultStage::ReplayLaunch => WARMUP + 2,
        _ => WARMUP,
    }
}

fn plan() -> Plan {
    Plan {
        sizes: MEDIUM,
        seed: 61,
        steps: STEPS,
        base_lr: 1e-2,
    }
}

/// One run with `stage` armed once before its step; returns the run and how many
/// injected failures fired.
fn injected_run<G: Stack>(stage: FaultStage, bytes: &[u8]) -> (crate::common::Run, u64) {
    let before = fired(stage);
    let at = armed_before(stage);
    let mut between = |step: usize, _: &crate::common::Model<G>, _: &mut Vec<f32>| {
        if step + 1 == at {
            arm(stage, 1);
        }
    };
    let run = graphed_run::<G, _>(
        plan(),
        bytes,
        adam::<G>(),
        GraphTrainerConfig::new(),
        &mut between,
    );
    disarm_all();
    (run, fired(stage) - before)
}

/// The modes the injected run may show: warmup, then at least one step eager for a
/// reason other than warmup (the injected failure, typed), and no step refused.
fn check_modes(stage: FaultStage, modes: &[StepMode]) {
    let injected: Vec<&FallbackReason> = modes
        .iter()
        .filter_map(|mode| match mode {
            StepMode::Eager(FallbackReason::Warmup) => None,
            StepMode::Eager(reason) => Some(reason),
            _ => None,
        })
        .collect();
    assert!(
        !injected.is_empty(),
        "{stage:?}: no step fell back for the injected failure: {modes:?}"
    );
    println!("{stage:?}: modes {modes:?}");
}

fn each_stage_falls_back_and_stays_healthy<G: Stack>() {
    let bytes = model_bytes(MEDIUM);
    let eager = eager_run::<G, _>(plan(), &bytes, adam::<G>(), &mut nothing::<G>);
    for stage in FaultStage::ALL {
        let (run, fired) = injected_run::<G>(stage, &bytes);
        assert_eq!(fired, 1, "{stage:?}: the injected failure fired once");
        check_modes(stage, &run.modes);
        let first = run
            .losses
            .iter()
            .zip(&eager.losses)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            first, None,
            "{stage:?}: first loss that differs from eager training"
        );
        assert!(
            run.params == eager.params,
            "{stage:?}: final parameters differ from eager training"
        );
    }
}

/// 100 injected failures of each stage, each in a trainer of its own (a failed capture
/// leaves its shape eager for good): the device bytes the runtime holds after the last
/// equal those after the first (each measured once that round's trainer is gone).
fn memory_is_flat_over_100_injected_failures<G: Stack>() {
    let bytes = model_bytes(MEDIUM);
    let rounds = run_length(100).max(2);
    for stage in FaultStage::ALL {
        let mut usage = Vec::new();
        for round in 0..rounds {
            let (_, fired) = injected_run::<G>(stage, &bytes);
            assert_eq!(fired, 1, "{stage:?}, round {round}");
            if round == 0 || round + 1 == rounds {
                G::sync(&device()).expect("sync");
                usage.push(device_bytes());
            }
        }
        println!(
            "{stage:?}: (pools, arena, graph pools) bytes after round 1 and {rounds}: {usage:?}"
        );
        assert_eq!(usage[0], usage[1], "{stage:?}: device bytes grew");
    }
}

stack_tests!(
    each_stage_falls_back_and_stays_healthy,
    memory_is_flat_over_100_injected_failures,
);
