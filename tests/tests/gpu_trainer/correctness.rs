//! Replayed training equals eager training (issue 5, acceptance 1).
//!
//! 200 steps through a `GraphTrainer` (3 warmup, 1 captured, 196 replayed) against the
//! same 200 steps by hand with the same capturable optimizer, from the same weights and
//! batches, with a learning rate that changes every step. A replay that froze the
//! learning rate, the step count or a bias correction, or read a stale parameter, would
//! diverge within a few steps. (20 steps with `GPU_TRAINER_SHORT`, under the sanitizer.)

use burn_graph_capture::optim::CapturableOptimizer;
use burn_graph_capture::{GraphTrainerConfig, TrainBackend};

use crate::common::{
    MEDIUM, Model, Plan, Stack, TOLERANCE, adam, adamw, assert_warmup_capture_replay, eager_run,
    graphed_run, model_bytes, nothing, run_length, sgd_momentum,
};

/// Steps per run (before `run_length`).
const STEPS: usize = 200;

/// Trains twice with optimizers from `make`, graphed and eager, and compares.
fn replayed_equals_eager<G, O>(case: &str, base_lr: f64, make: fn() -> O)
where
    G: Stack,
    O: CapturableOptimizer<Model<G>, TrainBackend<G>> + Clone,
{
    let steps = run_length(STEPS);
    let bytes = model_bytes(MEDIUM);
    let plan = Plan {
        sizes: MEDIUM,
        seed: 11,
        steps,
        base_lr,
    };
    let graphed = graphed_run::<G, O>(
        plan,
        &bytes,
        make(),
        GraphTrainerConfig::new(),
        &mut nothing::<G>,
    );
    assert_warmup_capture_replay(&graphed.modes);
    let eager = eager_run::<G, O>(plan, &bytes, make(), &mut nothing::<G>);
    let case = crate::common::case::<G>(case);
    let comparison = crate::common::Comparison::of(&graphed, &eager);
    println!(
        "{case}: loss {} -> {} over {steps} steps; report {}",
        eager.losses[0],
        eager.losses[steps - 1],
        serde_json::to_string(&graphed.report).unwrap()
    );
    assert!(
        eager.losses[steps - 1] < eager.losses[0],
        "{case}: training did not learn (a vacuous comparison)"
    );
    comparison.check(&case, TOLERANCE);
}

fn adam_replays_equal_eager<G: Stack>() {
    replayed_equals_eager::<G, _>("adam", 1e-2, adam::<G>);
}

fn adamw_replays_equal_eager<G: Stack>() {
    replayed_equals_eager::<G, _>("adamw", 1e-2, adamw::<G>);
}

fn sgd_momentum_replays_equal_eager<G: Stack>() {
    replayed_equals_eager::<G, _>("sgd+momentum", 2e-2, sgd_momentum::<G>);
}

// On the stack (Fusion over CubeCL on this runtime) and on plain CubeCL.
stack_tests!(
    adam_replays_equal_eager,
    adamw_replays_equal_eager,
    sgd_momentum_replays_equal_eager,
);
