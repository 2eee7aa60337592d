//! `FusedLstm` on the GPU (issue 12, acceptance 1 and 4).
//!
//! - Numerics: outputs, final states and every gradient against `nn::Lstm` on the same
//!   stack and weights, within 1e-5 relative (t=1, h=33, no bias, two layers included).
//!   Autotune may pick TF32 matmul kernels for the two models' different GEMM shapes; a
//!   failure here names the first value out of tolerance.
//! - Both recurrences (issue 28): the persistent kernels and the stepwise ones, each forced,
//!   against `nn::Lstm` at the cases above, batch 1, a batch over 32, 130 blocks, and the
//!   benchmark's 8/64/128 (larger ones within 1e-5 or 1e-4 of their largest values);
//!   the persistent runs must launch.
//! - Training: 200 steps of the sunspot-style regression with `FusedLstm` through a
//!   `GraphTrainer` replay, and equal eager training (capture off) bit for bit.

use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use burn_graph_capture::nn::LstmBackend;
use burn_graph_capture::nn::{RecurrencePreference, persistent_launches};
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{GraphTrainer, GraphTrainerConfig, TrainBackend};
use lstm_example::model::{Forecaster, FusedLstmRegressor};
use lstm_example::train::{from_bytes, parameter_bits};
use lstm_example::{Batch, SineTask};

use crate::common::{
    MEDIUM, Preferring, Stack, config, device, expected_replays, model, model_bytes, run_length,
};
use crate::parity::{BASE, Case, Tolerance, compare, compare_within};

fn matches_nn_lstm<G: Stack>() {
    compare::<TrainBackend<G>>(BASE);
    compare::<TrainBackend<G>>(Case { time: 1, ..BASE });
    compare::<TrainBackend<G>>(Case {
        hidden: 33,
        time: 3,
        ..BASE
    });
    compare::<TrainBackend<G>>(Case {
        bias: false,
        ..BASE
    });
    compare::<TrainBackend<G>>(Case { layers: 2, ..BASE });
}

/// The cases both recurrences are checked at, each value within 1e-5:
/// `matches_nn_lstm`'s and batch 1.
const RECURRENCE_CASES: [Case; 6] = [
    BASE,
    Case { time: 1, ..BASE },
    Case {
        hidden: 33,
        time: 3,
        ..BASE
    },
    Case {
        bias: false,
        ..BASE
    },
    Case { layers: 2, ..BASE },
    Case { batch: 1, ..BASE },
];

/// Larger cases, each value within 1e-5 of its tensor's largest (`Tolerance::OfLargest`):
/// a batch over 32 (warps take several rows), 130 blocks of four units (h = 520), five
/// units a block (h = 600 on 132 SMs: sums padded to a power of two for the transposed
/// warp sum, one row a warp and two), and the benchmark's 8/64/128 (within 1e-4 of the
/// largest: 64 steps). Session 16 on the H200 found weight gradients of 200-term sums off
/// by 1.2e-4 of their own (small) value.
const LARGE_CASES: [(Case, f32); 5] = [
    (
        Case {
            batch: 40,
            hidden: 100,
            time: 5,
            ..BASE
        },
        1e-5,
    ),
    (
        Case {
            batch: 2,
            time: 4,
            hidden: 520,
            ..BASE
        },
        1e-5,
    ),
    (
        Case {
            batch: 4,
            time: 3,
            hidden: 600,
            ..BASE
        },
        1e-5,
    ),
    (
        Case {
            batch: 40,
            time: 3,
            hidden: 600,
            ..BASE
        },
        1e-5,
    ),
    (
        Case {
            batch: 8,
            time: 64,
            hidden: 128,
            input: 16,
            ..BASE
        },
        1e-4,
    ),
];

/// Each recurrence, forced, matches `nn::Lstm` (tolerances above); the
/// persistent one launches its kernels (two per layer: forward and backward), the
/// stepwise one none.
fn both_recurrences_match_nn_lstm<G: Stack>() {
    for preference in [
        RecurrencePreference::Persistent,
        RecurrencePreference::Stepwise,
    ] {
        let _preferring = Preferring::new(preference);
        let each = RECURRENCE_CASES.map(|case| (case, Tolerance::Each(1e-5)));
        let large = LARGE_CASES.map(|(case, relative)| (case, Tolerance::OfLargest(relative)));
        for (case, tolerance) in each.into_iter().chain(large) {
            let before = persistent_launches();
            compare_within::<TrainBackend<G>>(case, tolerance);
            let launched = persistent_launches() - before;
            let expected = match preference {
                RecurrencePreference::Persistent => 2 * case.layers as u64,
                _ => 0,
            };
            // t=1 backward reads no carried gradient but still runs the kernel.
            assert_eq!(launched, expected, "{preference:?} at {case:?}");
        }
    }
    // `Auto` between batches 97 and 128: the stepwise forward's states and gates feed the
    // persistent backward (one launch per layer).
    let mixed = Case {
        batch: 100,
        time: 5,
        hidden: 64,
        ..BASE
    };
    let before = persistent_launches();
    compare_within::<TrainBackend<G>>(mixed, Tolerance::OfLargest(1e-5));
    assert_eq!(
        persistent_launches() - before,
        mixed.layers as u64,
        "{mixed:?}"
    );
}

/// Losses (bits) and final parameter bits of 200 steps, graphed or eager.
fn train<G: Stack>(capture: bool) -> (Vec<u32>, Vec<Vec<u32>>, u64) {
    type M<G> = FusedLstmRegressor<TrainBackend<G>>;
    let bytes = model_bytes(MEDIUM);
    let fused = model::<G>(MEDIUM, &bytes).to_fused().expect("converts");
    let adam = CapturableAdamConfig::new()
        .with_learning_rate(1e-2)
        .init::<TrainBackend<G>>(&device());
    let loss = |m: &M<G>, b: &Batch<TrainBackend<G>>| m.mse(b.x.clone(), b.y.clone());
    let config = GraphTrainerConfig::new().with_capture(capture);
    let mut trainer = GraphTrainer::new(fused, adam, loss, config);
    let mut task = SineTask::new(21, crate::common::D_INPUT);
    let mut losses = Vec::new();
    for _ in 0..run_length(200) {
        let batch = task.next_batch(MEDIUM.batch, MEDIUM.time, &device());
        let loss: f32 = trainer
            .step(batch)
            .expect("step")
            .output
            .into_scalar()
            .elem();
        losses.push(loss.to_bits());
    }
    let replayed = trainer.report().modes.replayed;
    (
        losses,
        parameter_bits(trainer.model().expect("model")),
        replayed,
    )
}

fn replays_equal_eager_training<G: Stack>() {
    let (graphed, graphed_params, replayed) = train::<G>(true);
    let (eager, eager_params, _) = train::<G>(false);
    assert_eq!(
        replayed,
        expected_replays(graphed.len()) as u64,
        "warmup, one capture, then replays (and the periodic checks)"
    );
    let first = graphed.iter().zip(&eager).position(|(a, b)| a != b);
    assert_eq!(first, None, "first differing loss at step {first:?}");
    assert!(graphed_params == eager_params, "final parameters differ");
}

/// Losses and final parameter bits of 20 plain eager steps on backend `B` (no trainer,
/// Burn's own Adam): the sunspot-style regression with `FusedLstm`.
fn plain<B: AutodiffBackend + LstmBackend>(device: &B::Device) -> (Vec<u32>, Vec<Vec<u32>>) {
    let bytes = model_bytes(MEDIUM);
    let nn = from_bytes::<B>(&config(MEDIUM), bytes, device);
    let mut model = nn.to_fused().expect("converts");
    let mut adam = AdamConfig::new().init();
    let mut task = SineTask::new(21, crate::common::D_INPUT);
    let mut losses = Vec::new();
    for _ in 0..20 {
        let batch = task.next_batch(MEDIUM.batch, MEDIUM.time, device);
        let loss = model.mse(batch.x, batch.y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = adam.step(1e-2, model, grads);
        losses.push(loss.into_scalar().elem::<f32>().to_bits());
    }
    (losses, parameter_bits(&model))
}

/// The first plain eager run on `B` in a process (its kernels compiled and autotuned
/// during its first step) equals a second one.
fn first_plain_run_equals_second_on<B: AutodiffBackend + LstmBackend>(device: &B::Device) {
    let first = plain::<B>(device);
    let second = plain::<B>(device);
    let at = first.0.iter().zip(&second.0).position(|(a, b)| a != b);
    assert_eq!(at, None, "plain eager: first differing loss at step {at:?}");
    assert!(first.1 == second.1, "plain eager: final parameters differ");
}

fn first_plain_run_equals_second<G: Stack>() {
    first_plain_run_equals_second_on::<TrainBackend<G>>(&device());
}

/// The same on stock burn-cuda: tells whether a failure is this runtime's or CubeCL's.
mod stock {
    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn first_plain_run_equals_second() {
        super::first_plain_run_equals_second_on::<burn::backend::Autodiff<burn_cuda::Cuda>>(
            &Default::default(),
        );
    }
}

/// The same through the trainer with capture off. Issue 11's open divergence shows here
/// when this fails in a fresh process and the plain test does not.
fn first_trainer_run_equals_second<G: Stack>() {
    let (first, first_params, _) = train::<G>(false);
    let (second, second_params, _) = train::<G>(false);
    let at = first.iter().zip(&second).position(|(a, b)| a != b);
    assert_eq!(
        at, None,
        "trainer, capture off: first differing loss at step {at:?}"
    );
    assert!(
        first_params == second_params,
        "trainer: final parameters differ"
    );
}

stack_tests!(
    matches_nn_lstm,
    both_recurrences_match_nn_lstm,
    replays_equal_eager_training,
    first_plain_run_equals_second,
    first_trainer_run_equals_second
);
