//! `FusedGru` on the GPU (issue 28).
//!
//! - Numerics: outputs, final states and every gradient against `nn::Gru` on the same
//!   stack and weights, within 1e-5 relative (t=1, h=33, no bias, two layers, batch 1).
//! - Training: 200 steps of the sine regression with a `FusedGru` through a `GraphTrainer`,
//!   graphed and eager (capture off), equal bit for bit.

use burn::prelude::ElementConversion;
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{GraphTrainer, GraphTrainerConfig, TrainBackend};
use lstm_example::model::{Forecaster, GruRegressor, GruRegressorConfig};
use lstm_example::train::{load_bytes, parameter_bits, to_bytes};
use lstm_example::{Batch, SineTask};

use crate::common::{D_INPUT, MEDIUM, Stack, device, expected_replays, run_length};
use crate::gru_parity::{GRU_BASE, GruCase, compare_gru};

fn matches_nn_gru<G: Stack>() {
    for case in [
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
    ] {
        compare_gru::<TrainBackend<G>>(case);
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

fn replays_equal_eager_training<G: Stack>() {
    let (graphed, graphed_params, replayed) = train::<G>(true);
    let (eager, eager_params, _) = train::<G>(false);
    assert_eq!(replayed, expected_replays(graphed.len()) as u64);
    let first = graphed.iter().zip(&eager).position(|(a, b)| a != b);
    assert_eq!(first, None, "first differing loss at step {first:?}");
    assert!(graphed_params == eager_params, "final parameters differ");
}

stack_tests!(matches_nn_gru, replays_equal_eager_training);
