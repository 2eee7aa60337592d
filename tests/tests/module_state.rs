//! Module state beyond parameters, on the CPU: BatchNorm's running statistics and a
//! parameter tied through two fields both pass warmup (they would graph on a GPU),
//! and train exactly as eager Burn code does.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{FallbackReason, GraphTrainer, GraphTrainerConfig, StepMode};
use lstm_example::train::parameter_bits;

mod common;

use common::B;
use common::models::{BnMlp, Regression, TiedMlp};

const STEPS: usize = 8;

fn batch(step: usize) -> Regression<B> {
    Regression::new(step, 6, &Default::default())
}

fn after_warmup(modes: &[StepMode]) -> &[StepMode] {
    &modes[GraphTrainerConfig::new().warmup_steps..]
}

#[test]
fn batch_norm_passes_warmup_and_its_running_stats_follow_eager_training() {
    let device = Default::default();
    let model = BnMlp::<B>::new(5, &device);
    let reference = model.clone();
    let loss = |model: &BnMlp<B>, batch: &Regression<B>| model.loss(batch);
    let adam = || {
        CapturableAdamConfig::new()
            .with_learning_rate(1e-2)
            .init::<B>(&device)
    };
    let mut trainer = GraphTrainer::new(model, adam(), loss, GraphTrainerConfig::new());
    let mut losses = Vec::new();
    let mut modes = Vec::new();
    for step in 0..STEPS {
        let outcome = trainer.step(batch(step)).unwrap();
        losses.push(outcome.loss.into_scalar().to_bits());
        modes.push(outcome.mode);
    }
    for mode in after_warmup(&modes) {
        assert_eq!(
            *mode,
            StepMode::Eager(FallbackReason::NoHardwareGraphs),
            "{modes:?}"
        );
    }

    // The same training in plain Burn code.
    let mut model = reference;
    let mut optimizer = adam();
    optimizer.init_state(&model);
    let mut eager_losses = Vec::new();
    for step in 0..STEPS {
        let loss = model.loss(&batch(step));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(model, grads);
        eager_losses.push(loss.into_scalar().to_bits());
    }
    assert_eq!(losses, eager_losses);
    let trained = trainer.model().unwrap();
    assert_eq!(parameter_bits(trained), parameter_bits(&model.valid()));
    assert_eq!(trained.running_stats(), model.running_stats());
    let (mean, _) = trained.running_stats();
    assert!(
        mean.iter().any(|m| *m != 0.0),
        "the running mean moved: {mean:?}"
    );
}

#[test]
fn a_snapshot_keeps_its_running_stats_while_training_goes_on() {
    let device = Default::default();
    let loss = |model: &BnMlp<B>, batch: &Regression<B>| model.loss(batch);
    let optimizer = CapturableAdamConfig::new().init::<B>(&device);
    let mut trainer = GraphTrainer::new(
        BnMlp::<B>::new(5, &device),
        optimizer,
        loss,
        GraphTrainerConfig::new(),
    );
    trainer.step(batch(0)).unwrap();
    let clone = trainer.model().unwrap().clone();
    let valid = trainer.model().unwrap().valid();
    let before = clone.running_stats();
    for step in 1..STEPS {
        trainer.step(batch(step)).unwrap();
    }
    assert_ne!(
        trainer.model().unwrap().running_stats(),
        before,
        "training moved them"
    );
    assert_eq!(clone.running_stats(), before, "a clone is a snapshot");
    let read = |t: Tensor<burn_graph_capture::GraphCapture<burn::backend::Flex>, 1>| {
        t.into_data().to_vec::<f32>().unwrap()
    };
    assert_eq!(read(valid.norm_mean()), before.0, "so is a valid() copy");
}

#[test]
fn a_tied_parameter_passes_warmup_and_stays_tied() {
    let device = Default::default();
    let model = TiedMlp::<B>::new(&device);
    assert!(model.tied());
    let reference = model.clone();
    let loss = |model: &TiedMlp<B>, batch: &Regression<B>| model.loss(batch);
    let adam = || {
        CapturableAdamConfig::new()
            .with_learning_rate(1e-2)
            .init::<B>(&device)
    };
    let mut trainer = GraphTrainer::new(model, adam(), loss, GraphTrainerConfig::new());
    let mut losses = Vec::new();
    let mut modes = Vec::new();
    for step in 0..STEPS {
        let outcome = trainer.step(batch(step)).unwrap();
        losses.push(outcome.loss.into_scalar().to_bits());
        modes.push(outcome.mode);
        assert!(trainer.model().unwrap().tied(), "tied after step {step}");
    }
    for mode in after_warmup(&modes) {
        assert_eq!(
            *mode,
            StepMode::Eager(FallbackReason::NoHardwareGraphs),
            "{modes:?}"
        );
    }

    // Plain Burn code keeps the tie only by hand: its optimizers update the first field.
    let mut model = reference;
    let mut optimizer = adam();
    optimizer.init_state(&model);
    let mut eager_losses = Vec::new();
    for step in 0..STEPS {
        let loss = model.loss(&batch(step));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(model, grads);
        model.retie();
        eager_losses.push(loss.into_scalar().to_bits());
    }
    assert_eq!(losses, eager_losses);
    assert_eq!(
        parameter_bits(trainer.model().unwrap()),
        parameter_bits(&model)
    );
}
