//! A new user's models on the CPU: a GRU trained with evaluation and a checkpoint
//! between steps passes warmup (it would graph on a GPU) and trains exactly as plain
//! Burn code does.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{FallbackReason, GraphTrainer, GraphTrainerConfig, StepMode};
use lstm_example::train::{load_bytes, parameter_bits, to_bytes};

use crate::common::B;
use crate::common::models::{GruRegressor, Regression};

const STEPS: usize = 8;

fn batch(step: usize) -> Regression<B> {
    Regression::new(step, 4, &Default::default())
}

#[test]
fn a_gru_with_evaluation_and_checkpoints_between_steps_trains_as_plain_burn() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let model = GruRegressor::<B>::new(6, &device);
    let bytes = to_bytes(model.clone());
    let adam = || {
        CapturableAdamConfig::new()
            .with_learning_rate(1e-2)
            .init::<B>(&device)
    };
    let loss = |model: &GruRegressor<B>, batch: &Regression<B>| model.loss(batch);
    let mut trainer = GraphTrainer::new(model, adam(), loss, GraphTrainerConfig::new());
    let mut losses = Vec::new();
    let mut evaluations = Vec::new();
    let mut checkpoint = Vec::new();
    for step in 0..STEPS {
        let outcome = trainer.step(batch(step)).unwrap();
        if step >= GraphTrainerConfig::new().warmup_steps {
            assert_eq!(
                outcome.mode,
                StepMode::Eager(FallbackReason::NoHardwareGraphs)
            );
        }
        losses.push(outcome.output.into_scalar().to_bits());
        // Evaluation on the inner backend, and a checkpoint, between steps.
        let valid = trainer.model().unwrap().valid();
        evaluations.push(
            valid
                .loss(&Regression::new(99, 4, &device))
                .into_scalar()
                .to_bits(),
        );
        checkpoint = to_bytes(trainer.model().unwrap().clone());
    }

    let mut model = load_bytes(GruRegressor::<B>::new(6, &device), bytes, &device);
    let mut optimizer = adam();
    optimizer.init_state(&model);
    let mut plain_losses = Vec::new();
    let mut plain_evaluations = Vec::new();
    for step in 0..STEPS {
        let l = model.loss(&batch(step));
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optimizer.step(model, grads);
        plain_losses.push(l.into_scalar().to_bits());
        let valid = model.valid();
        plain_evaluations.push(
            valid
                .loss(&Regression::new(99, 4, &device))
                .into_scalar()
                .to_bits(),
        );
    }
    assert_eq!(losses, plain_losses);
    assert_eq!(evaluations, plain_evaluations);
    let restored = load_bytes(GruRegressor::<B>::new(6, &device), checkpoint, &device);
    assert_eq!(
        parameter_bits(&restored),
        parameter_bits(&model),
        "the checkpoint holds the trained weights"
    );
}
