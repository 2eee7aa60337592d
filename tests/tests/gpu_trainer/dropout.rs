//! Dropout inside graphs on the GPU (issue 15).
//!
//! - The device draws equal `rng::draw`'s host values: uniform and Bernoulli to a fused
//!   multiply-add's rounding, normal to the GPU's `ln`/`cos`; the offset's advance
//!   carries into its high word.
//! - An LSTM with dropout 0.3 between its two layers graphs and replays, and the report
//!   names the graphed draw; with the weights held (learning rate 0) every replay's loss
//!   differs, so every replay drew a fresh mask.
//! - 200 steps graphed equal 200 steps with capture off from the same seed: losses and
//!   final parameters, bit for bit.

use burn::backend::Flex;
use burn::prelude::*;
use burn::tensor::{DType, FloatDType, Shape};
use burn::tensor::{Distribution, TensorPrimitive};
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::rng::{draw, state::Words};
use burn_graph_capture::{GraphTrainer, GraphTrainerConfig, TrainBackend};
use lstm_example::SineTask;
use lstm_example::model::{DropoutLstmRegressor, DropoutLstmRegressorConfig, Forecaster};
use lstm_example::train::{load_bytes, parameter_bits, to_bytes};

use crate::common::{D_INPUT, MEDIUM, Stack, WARMUP, device, expected_replays, run_length};

fn device_draws_match_the_host_reference<G: Stack>() {
    // An offset two below 2^32: draw 3 crosses into the high word.
    let words = Words {
        key: 0x1234_5678_9abc_def0,
        offset: u64::from(u32::MAX) - 1,
    };
    let state = G::int_from_data(words.to_data(DType::I32).unwrap(), &device());
    let cases = [
        (0, Distribution::Default, 1e-7),
        (1, Distribution::Uniform(-1.0, 3.0), 1e-6),
        (2, Distribution::Bernoulli(0.3), 0.0),
        (3, Distribution::Normal(0.5, 2.0), 1e-5),
    ];
    for (index, distribution, tolerance) in cases {
        // 1001 values: the last block is partly outside the tensor.
        let drawn = G::random(
            &state,
            index,
            Shape::new([7, 143]),
            distribution,
            FloatDType::F32,
        );
        let drawn = Tensor::<G, 2>::from_primitive(TensorPrimitive::Float(drawn))
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let offset = words.offset + u64::from(index);
        let host = draw::values(words.key, offset, distribution, drawn.len());
        for (i, (d, h)) in drawn.iter().zip(&host).enumerate() {
            let bound = tolerance * h.abs().max(1.0);
            assert!(
                (d - h).abs() <= bound,
                "{distribution:?} value {i}: device {d}, host {h}"
            );
        }
    }
    let next = G::advance_random(state, 5);
    let next = Tensor::<G, 1, Int>::from_primitive(next).into_data();
    assert_eq!(Words::from_data(&next), Some(words.advanced(5)));
}

type M<G> = DropoutLstmRegressor<TrainBackend<G>>;

/// The model (weights drawn on the CPU from a fixed seed), with the device seeded so the
/// trainer made next takes the same generator stream in every run.
fn seeded_model<G: Stack>() -> M<G> {
    let config = DropoutLstmRegressorConfig::new(MEDIUM.hidden).with_d_input(D_INPUT);
    Flex::seed(&Default::default(), 11);
    let bytes = to_bytes(config.init::<Flex>(&Default::default()));
    let model = load_bytes(config.init::<TrainBackend<G>>(&device()), bytes, &device());
    TrainBackend::<G>::seed(&device(), 29);
    model
}

/// Losses (bits), final parameter bits, and the trainer's report over `steps` steps.
fn train<G: Stack>(
    capture: bool,
    lr: f64,
    steps: usize,
    fixed_batch: bool,
) -> (Vec<u32>, Vec<Vec<u32>>, burn_graph_capture::TrainerReport) {
    let adam = CapturableAdamConfig::new()
        .with_learning_rate(lr)
        .init::<TrainBackend<G>>(&device());
    let loss = |m: &M<G>, b: &crate::common::Batch<G>| m.mse(b.x.clone(), b.y.clone());
    let config = GraphTrainerConfig::new().with_capture(capture);
    let mut trainer = GraphTrainer::new(seeded_model::<G>(), adam, loss, config);
    let mut task = SineTask::new(5, D_INPUT);
    let first = task.next_batch(MEDIUM.batch, MEDIUM.time, &device());
    let mut losses = Vec::new();
    for _ in 0..steps {
        let batch = match fixed_batch {
            true => first.clone(),
            false => task.next_batch(MEDIUM.batch, MEDIUM.time, &device()),
        };
        let outcome = trainer.step(batch).expect("step");
        if capture && losses.len() > WARMUP {
            let every = GraphTrainerConfig::new().verify_every;
            let expected = crate::common::expected_after_capture(losses.len() - WARMUP - 1, every);
            assert_eq!(outcome.mode, expected);
        }
        let loss: f32 = outcome.output.into_scalar().elem();
        losses.push(loss.to_bits());
    }
    let params = parameter_bits(trainer.model().expect("model"));
    (losses, params, trainer.report())
}

fn replays_draw_fresh_masks<G: Stack>() {
    let steps = WARMUP + 1 + 8;
    let (losses, _, report) = train::<G>(true, 0.0, steps, true);
    assert_eq!(report.modes.captured, 1, "{report:?}");
    assert_eq!(report.modes.replayed as usize, expected_replays(steps));
    assert_eq!(
        report.graphed_random_ops.len(),
        1,
        "{:?}",
        report.graphed_random_ops
    );
    assert!(report.graphed_random_ops[0].starts_with("float_random Bernoulli(0.7"));
    for (i, a) in losses.iter().enumerate() {
        for (j, b) in losses.iter().enumerate().skip(i + 1) {
            assert_ne!(a, b, "steps {i} and {j} drew the same mask");
        }
    }
}

fn replays_equal_eager_training<G: Stack>() {
    let steps = run_length(200);
    let (graphed, graphed_params, report) = train::<G>(true, 1e-2, steps, false);
    let (eager, eager_params, _) = train::<G>(false, 1e-2, steps, false);
    assert_eq!(report.modes.replayed as usize, expected_replays(steps));
    let first = graphed.iter().zip(&eager).position(|(a, b)| a != b);
    assert_eq!(first, None, "first differing loss at step {first:?}");
    assert!(graphed_params == eager_params, "final parameters differ");
}

stack_tests!(
    device_draws_match_the_host_reference,
    replays_draw_fresh_masks,
    replays_equal_eager_training,
);
