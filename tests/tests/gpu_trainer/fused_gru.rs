//! `FusedGru` on the GPU (issue 28).
//!
//! - Numerics: outputs, final states and every gradient against `nn::Gru` on the same
//!   stack and weights, within 1e-5 relative (t=1, h=33, no bias, two layers, batch 1),
//!   with each recurrence forced: the persistent kernels (which must launch, two per
//!   layer) and the plain ops; larger cases (a batch over 32, 130 blocks, the benchmark's
//!   32/64/256) within 1e-5 or 1e-4 of their tensors' largest values.
//! - Training: 200 steps of the sine regression with a `FusedGru` through a `GraphTrainer`,
//!   graphed and eager (capture off), equal bit for bit.

use burn::prelude::ElementConversion;
use burn_graph_capture::nn::{RecurrencePreference, persistent_launches};
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{GraphTrainer, GraphTrainerConfig, TrainBackend};
use lstm_example::model::{Forecaster, GruRegressor, GruRegressorConfig};
use lstm_example::train::{load_bytes, parameter_bits, to_bytes};
use lstm_example::{Batch, SineTask};

use crate::common::{D_INPUT, MEDIUM, Preferring, Stack, device, expected_replays, run_length};
use crate::gru_parity::{GRU_BASE, GruCase, Tolerance, compare_gru, compare_gru_within};

/// The cases, each value within 1e-5.
const CASES: [GruCase; 6] = [
    GRU_BASE,
    GruCase {
        time: 1,
        ..GRU_BASE
    },
    GruCase {
        hidden: 33,
        time: 3,
        ..GRU_BASE
    },
    GruCase {
        bias: false,
        ..GRU_BASE
    },
    GruCase {
        layers: 2,
        ..GRU_BASE
    },
    GruCase {
        batch: 1,
        ..GRU_BASE
    },
];

/// Larger cases, against each tensor's largest value: a batch over 32 warps, 130 blocks
/// of four units, and the benchmark's size.
const LARGE_CASES: [(GruCase, f32); 3] = [
    (
        GruCase {
            batch: 40,
            time: 12,
            hidden: 100,
            input: 8,
            ..GRU_BASE
        },
        1e-5,
    ),
    (
        GruCase {
            batch: 4,
            time: 6,
            hidden: 520,
            input: 8,
            ..GRU_BASE
        },
        1e-5,
    ),
    (
        GruCase {
            batch: 32,
            time: 64,
            hidden: 256,
            input: 16,
            ..GRU_BASE
        },
        1e-4,
    ),
];

/// Each recurrence, forced, matches `nn::Gru`; the persistent one launches its kernels
/// (forward and backward per layer), the plain one none.
fn matches_nn_gru<G: Stack>() {
    for preference in [
        RecurrencePreference::Persistent,
        RecurrencePreference::Stepwise,
    ] {
        let _preferring = Preferring::new(preference);
        let expected = |case: GruCase| match preference {
            RecurrencePreference::Persistent => 2 * case.layers as u64,
            _ => 0,
        };
        let launches = |case: GruCase, compare: &dyn Fn()| {
            // The tolerance's message names the case, this line the recurrence.
            eprintln!("{preference:?}: {case:?}");
            let before = persistent_launches();
            compare();
            let launched = persistent_launches() - before;
            assert_eq!(launched, expected(case), "{preference:?} at {case:?}");
        };
        for case in CASES {
            launches(case, &|| compare_gru::<TrainBackend<G>>(case));
        }
        for (case, relative) in LARGE_CASES {
            let tolerance = Tolerance::OfLargest(relative);
            launches(case, &|| {
                compare_gru_within::<TrainBackend<G>>(case, tolerance)
            });
        }
    }
}

/// Losses (bits), final parameter bits and replays of 200 steps, graphed or eager.
fn train<G: Stack>(capture: bool) -> (Vec<u32>, Vec<Vec<u32>>, u64) {
    let config = GruRegressorConfig::new(MEDIUM.hidden).with_d_input(D_INPUT);
    // Seeded, so that the graphed and the eager run start from the same weights.
    <burn::backend::Flex as burn::tensor::backend::Backend>::seed(&Default::default(), 7);
    let bytes = to_bytes(config.init::<burn::backend::Flex>(&Default::default()));
    let model: GruRegressor<TrainBackend<G>> = load_bytes(config.init(&device()), bytes, &device());
    let adam = CapturableAdamConfig::new()
        .with_learning_rate(1e-2)
        .init::<TrainBackend<G>>(&device());
    let loss = |m: &GruRegressor<TrainBackend<G>>, b: &Batch<TrainBackend<G>>| {
        m.mse(b.x.clone(), b.y.clone())
    };
    let config = GraphTrainerConfig::new().with_capture(capture);
    let mut trainer = GraphTrainer::new(model, adam, loss, config);
    let mut task = SineTask::new(23, D_INPUT);
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

/// 200 steps graphed equal 200 eager bit for bit; the medium size runs the persistent
/// recurrence (`Auto`).
fn replays_equal_eager_training<G: Stack>() {
    let before = persistent_launches();
    let (graphed, graphed_params, replayed) = train::<G>(true);
    let (eager, eager_params, _) = train::<G>(false);
    assert!(
        persistent_launches() > before,
        "the persistent recurrence ran"
    );
    assert_eq!(replayed, expected_replays(graphed.len()) as u64);
    let first = graphed.iter().zip(&eager).position(|(a, b)| a != b);
    assert_eq!(first, None, "first differing loss at step {first:?}");
    assert!(graphed_params == eager_params, "final parameters differ");
}

stack_tests!(matches_nn_gru, replays_equal_eager_training);
