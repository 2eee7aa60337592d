//! Issue 14, part 6: bad input. Each case gets a typed error or a documented behaviour,
//! and the trainer stays usable afterwards. (Empty batches, non-scalar losses, panicking
//! closures and a taken-out model: `step_api.rs`; batches on another device and empty
//! int tensors: `step_inputs.rs`.)

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn::backend::Flex;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::{FallbackReason, GraphTrainer, GraphTrainerConfig, StepError, StepMode};
use lstm_example::train::{from_bytes, parameter_bits, to_bytes};
use lstm_example::{Batch, LstmRegressorConfig, SineTask};

use crate::common::{B, Model, adam, loss, model, model_bytes};

fn batch(task: &mut SineTask) -> Batch<B> {
    task.next_batch(4, 6, &Default::default())
}

/// A model of another structure than `common::model` (hidden size 16, not 8).
fn wider() -> Model {
    let config = LstmRegressorConfig::new(16);
    from_bytes(
        &config,
        to_bytes(config.init::<Flex>(&Default::default())),
        &Default::default(),
    )
}

#[test]
fn a_batch_of_the_wrong_shape_panics_in_the_step_and_keeps_the_trainer() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(1, 32);
    trainer.step(batch(&mut task)).unwrap();
    let before = parameter_bits(trainer.model().unwrap());
    // 5 features for a model of 32: Burn's matmul panics inside the step closure.
    let wrong = SineTask::new(2, 5).next_batch::<B>(4, 6, &Default::default());
    let result = catch_unwind(AssertUnwindSafe(|| trainer.step(wrong)));
    assert!(result.is_err(), "the shape error reaches the caller");
    assert!(
        parameter_bits(trainer.model().unwrap()) == before,
        "model unchanged"
    );
    assert_eq!(trainer.report().steps, 1, "the failed step is not counted");
    let next = trainer.step(batch(&mut task)).expect("still usable");
    assert_eq!(next.mode, StepMode::Eager(FallbackReason::Warmup));
}

/// Plain Burn training with the same optimizer, for comparison.
fn plain_losses(bytes: &[u8], batches: &[Batch<B>]) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut model = model(bytes);
    let mut optimizer = adam();
    optimizer.init_state(&model);
    let mut losses = Vec::new();
    for batch in batches {
        let l = loss(&model, batch);
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optimizer.step(model, grads);
        losses.push(l.into_scalar().to_bits());
    }
    (losses, parameter_bits(&model))
}

#[test]
fn a_non_finite_loss_propagates_exactly_as_in_eager_training() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut task = SineTask::new(3, 32);
    let mut batches: Vec<Batch<B>> = (0..4).map(|_| batch(&mut task)).collect();
    // One NaN input in the second batch.
    let x = batches[1].x.clone();
    let nan = Tensor::<B, 3>::full([1, 1, 1], f32::NAN, &Default::default());
    batches[1].x = x.slice_assign([0..1, 0..1, 0..1], nan);
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let losses: Vec<u32> = batches
        .iter()
        .map(|b| {
            let outcome = trainer.step(b.clone()).expect("a NaN is no error");
            outcome.output.into_scalar().to_bits()
        })
        .collect();
    assert!(
        f32::from_bits(losses[1]).is_nan(),
        "the NaN reached the loss"
    );
    let (eager_losses, eager_params) = plain_losses(&bytes, &batches);
    assert_eq!(losses, eager_losses, "losses, bit for bit");
    assert!(
        parameter_bits(trainer.model().unwrap()) == eager_params,
        "parameters, bit for bit (NaN included)"
    );
}

#[test]
fn a_model_of_another_structure_starts_the_graphs_over() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(4, 32);
    for _ in 0..4 {
        trainer.step(batch(&mut task)).unwrap();
    }
    trainer.put_model(wider());
    let outcome = trainer.step(batch(&mut task)).unwrap();
    assert_eq!(
        outcome.mode,
        StepMode::Eager(FallbackReason::Warmup),
        "every shape warms up again"
    );
    assert!(outcome.output.into_scalar().is_finite());
    let shapes = |m: &Model| parameter_bits(m).iter().map(Vec::len).collect::<Vec<_>>();
    assert_eq!(shapes(trainer.model().unwrap()), shapes(&wider()));
    let before = parameter_bits(trainer.model().unwrap());
    trainer.step(batch(&mut task)).unwrap();
    assert!(
        parameter_bits(trainer.model().unwrap()) != before,
        "the new model trains"
    );
}

#[test]
fn an_optimizer_record_of_another_model_is_refused_until_that_model_is_put_in() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let other = wider();
    let mut trained = adam();
    trained.init_state(&other);
    let optimizer = adam().load_record(trained.to_record());
    let mut trainer = GraphTrainer::new(model(&bytes), optimizer, loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(5, 32);
    let error = trainer.step(batch(&mut task)).unwrap_err();
    let StepError::OptimizerStateMismatch { foreign, misshapen } = error else {
        panic!("{error}");
    };
    assert_eq!(
        foreign,
        parameter_bits(&other).len(),
        "every state is foreign"
    );
    assert_eq!(misshapen, 0);
    assert!(
        parameter_bits(trainer.model().unwrap()) == parameter_bits(&model(&bytes)),
        "nothing ran"
    );
    assert_eq!(trainer.report().steps, 0);
    // The record's own model fits it: the trainer takes it and trains.
    trainer.put_model(other);
    let outcome = trainer.step(batch(&mut task)).expect("fits now");
    assert!(outcome.output.into_scalar().is_finite());
}
