//! `GraphTrainer`'s API: bad input, panics, taking the model out, lr changes, report.

use std::panic::{AssertUnwindSafe, catch_unwind};

use burn::backend::Flex;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::optim::{CapturableAdam, CapturableOptimizer, StateSlot};
use burn_graph_capture::{
    EmulatedGraphs, FallbackReason, GraphCapture, GraphTrainer, GraphTrainerConfig, StepError,
    StepMode, TrainerReport,
};
use lstm_example::train::parameter_bits;
use lstm_example::{Batch, SineTask};

use crate::common::{B, Model, adam, loss, model, model_bytes};

fn batch(task: &mut SineTask) -> Batch<B> {
    task.next_batch(4, 6, &Default::default())
}

/// Losses of `steps` trainer steps on batches of seed `seed`.
fn losses<F>(
    trainer: &mut GraphTrainer<Flex, Model, CapturableAdam<B>, Batch<B>, F>,
    seed: u64,
    steps: usize,
) -> Vec<f32>
where
    F: FnMut(&Model, &Batch<B>) -> Tensor<B, 1> + Clone,
{
    let mut task = SineTask::new(seed, 32);
    (0..steps)
        .map(|_| trainer.step(batch(&mut task)).unwrap().output.into_scalar())
        .collect()
}

#[test]
fn an_empty_batch_is_refused_and_changes_nothing() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let empty = SineTask::new(1, 32).next_batch::<B>(0, 6, &Default::default());
    let error = trainer.step(empty).unwrap_err();
    assert!(matches!(error, StepError::EmptyBatch(_)), "{error}");
    assert!(parameter_bits(trainer.model().unwrap()) == parameter_bits(&model(&bytes)));
    assert_eq!(trainer.report().steps, 0);
    assert!(
        trainer.step(batch(&mut SineTask::new(1, 32))).is_ok(),
        "still usable"
    );
}

#[test]
fn a_non_scalar_loss_is_refused_and_changes_nothing() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let per_sample = |model: &Model, batch: &Batch<B>| {
        let error = model.forward(batch.x.clone()) - batch.y.clone();
        error
            .powi_scalar(2)
            .mean_dim(1)
            .mean_dim(2)
            .flatten::<1>(0, 2)
    };
    let mut trainer =
        GraphTrainer::new(model(&bytes), adam(), per_sample, GraphTrainerConfig::new());
    let error = trainer.step(batch(&mut SineTask::new(1, 32))).unwrap_err();
    assert_eq!(error, StepError::NonScalarLoss { shape: vec![4] });
    assert!(parameter_bits(trainer.model().unwrap()) == parameter_bits(&model(&bytes)));
    assert_eq!(trainer.report().steps, 0);
}

#[test]
fn a_panicking_step_closure_keeps_the_model() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut calls = 0;
    let flaky = move |model: &Model, batch: &Batch<B>| {
        calls += 1;
        if calls == 2 {
            panic!("user code failed");
        }
        loss(model, batch)
    };
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), flaky, GraphTrainerConfig::new());
    let mut task = SineTask::new(2, 32);
    trainer.step(batch(&mut task)).unwrap();
    let before = parameter_bits(trainer.model().unwrap());
    let result = catch_unwind(AssertUnwindSafe(|| trainer.step(batch(&mut task))));
    assert!(result.is_err(), "the panic reaches the caller");
    assert!(
        parameter_bits(trainer.model().unwrap()) == before,
        "model unchanged"
    );
    assert_eq!(trainer.report().steps, 1, "the failed step is not counted");
    let next = trainer.step(batch(&mut task)).unwrap();
    assert_eq!(next.mode, StepMode::Eager(FallbackReason::Warmup));
}

/// Adam that panics in its `fail_at`-th step (counted from 1), after updating its state:
/// a user's optimizer that fails halfway.
#[derive(Clone)]
struct FailingAdam {
    inner: CapturableAdam<B>,
    steps: usize,
    fail_at: usize,
}

impl CapturableOptimizer<Model, B> for FailingAdam {
    type Record = <CapturableAdam<B> as CapturableOptimizer<Model, B>>::Record;

    fn init_state(&mut self, module: &Model) {
        CapturableOptimizer::<Model, B>::init_state(&mut self.inner, module);
    }

    fn step(&mut self, module: Model, grads: GradientsParams) -> Model {
        self.steps += 1;
        let updated = CapturableOptimizer::<Model, B>::step(&mut self.inner, module, grads);
        assert!(self.steps != self.fail_at, "the optimizer failed");
        updated
    }

    fn set_lr(&mut self, lr: f64) {
        CapturableOptimizer::<Model, B>::set_lr(&mut self.inner, lr);
    }

    fn visit_state(
        &mut self,
        visitor: &mut dyn FnMut(StateSlot, &mut Tensor<GraphCapture<Flex>, 1>),
    ) {
        CapturableOptimizer::<Model, B>::visit_state(&mut self.inner, visitor);
    }

    fn to_record(&self) -> Self::Record {
        CapturableOptimizer::<Model, B>::to_record(&self.inner)
    }

    fn load_record(self, record: Self::Record) -> Self {
        let inner = CapturableOptimizer::<Model, B>::load_record(self.inner, record);
        Self { inner, ..self }
    }
}

/// Every state tensor's bits, in visiting order.
fn state_bits(optimizer: &mut impl CapturableOptimizer<Model, B>) -> Vec<Vec<u32>> {
    let mut bits = Vec::new();
    optimizer.visit_state(&mut |_, tensor| {
        let values = tensor.clone().into_data().to_vec::<f32>().unwrap();
        bits.push(values.into_iter().map(f32::to_bits).collect());
    });
    bits
}

/// An optimizer that panics in step `fail_at` leaves the model and its state as they
/// were, and training goes on as plain code that never ran that step.
fn a_panicking_optimizer_keeps_the_model_and_its_state_at(fail_at: usize) {
    let bytes = model_bytes();
    let failing = FailingAdam {
        inner: adam(),
        steps: 0,
        fail_at,
    };
    let mut trainer = GraphTrainer::new(model(&bytes), failing, loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(5, 32);
    let batches: Vec<_> = (0..fail_at + 2).map(|_| batch(&mut task)).collect();
    let failed = fail_at - 1;
    for batch in &batches[..failed] {
        trainer.step(batch.clone()).unwrap();
    }
    let model_before = parameter_bits(trainer.model().unwrap());
    let state_before = state_bits(&mut trainer.optimizer().clone());

    let result = catch_unwind(AssertUnwindSafe(|| trainer.step(batches[failed].clone())));
    assert!(result.is_err(), "the optimizer's panic reaches the caller");
    assert!(
        parameter_bits(trainer.model().unwrap()) == model_before,
        "model as before the step"
    );
    assert_eq!(
        state_bits(&mut trainer.optimizer().clone()),
        state_before,
        "optimizer state as before"
    );
    assert_eq!(
        trainer.report().steps,
        failed as u64,
        "the failed step is not counted"
    );

    // Training goes on as plain code that never ran the failed step.
    for batch in &batches[fail_at..] {
        trainer.step(batch.clone()).unwrap();
    }
    let mut plain_model = model(&bytes);
    let mut plain = adam();
    plain.init_state(&plain_model);
    for batch in batches[..failed].iter().chain(&batches[fail_at..]) {
        let grads = GradientsParams::from_grads(loss(&plain_model, batch).backward(), &plain_model);
        plain_model = plain.step(plain_model, grads);
    }
    let report = trainer.report();
    let (model, _) = trainer.into_parts();
    assert!(parameter_bits(&model) == parameter_bits(&plain_model));
    if EmulatedGraphs::active() {
        assert!(report.modes.replayed >= 2, "{report:?}");
        assert_eq!(report.traces_matched, report.modes.replayed);
    }
}

#[test]
fn a_panicking_optimizer_keeps_the_model_and_its_state() {
    let _rng = crate::common::rng::shared();
    a_panicking_optimizer_keeps_the_model_and_its_state_at(3);
}

/// The same in a replay's trace, on emulated graphs: the optimizer's ops were matched
/// (stand-ins), and the step's panic leaves the pins and the learner as they were.
#[test]
fn an_optimizer_panicking_in_a_traced_replay_keeps_the_model_and_its_state() {
    let _rng = crate::common::rng::shared();
    let _graphs = EmulatedGraphs::on();
    a_panicking_optimizer_keeps_the_model_and_its_state_at(6);
}

#[test]
fn the_model_can_be_taken_out_and_put_back() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut interrupted = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(3, 32);
    let mut got = Vec::new();
    for step in 0..6 {
        if step == 3 {
            let model = interrupted.take_model().unwrap();
            assert_eq!(
                interrupted
                    .step(batch(&mut SineTask::new(9, 32)))
                    .unwrap_err(),
                StepError::ModelTakenOut
            );
            // Evaluate it, as a user would between steps.
            let _ = model
                .forward(batch(&mut SineTask::new(9, 32)).x)
                .into_data();
            interrupted.put_model(model);
        }
        got.push(
            interrupted
                .step(batch(&mut task))
                .unwrap()
                .output
                .into_scalar(),
        );
    }
    let mut straight = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    assert_eq!(got, losses(&mut straight, 3, 6));
    assert!(
        parameter_bits(interrupted.model().unwrap()) == parameter_bits(straight.model().unwrap())
    );
}

#[test]
fn the_learning_rate_can_change_every_step() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut scheduled = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(4, 32);
    let mut modes = Vec::new();
    let with_schedule: Vec<f32> = (0..6)
        .map(|step| {
            scheduled.set_lr(1e-2 / (1.0 + step as f64));
            let outcome = scheduled.step(batch(&mut task)).unwrap();
            modes.push(outcome.mode);
            outcome.output.into_scalar()
        })
        .collect();
    assert_eq!(
        modes[3],
        StepMode::Eager(FallbackReason::NoHardwareGraphs),
        "a changing lr keeps the step static"
    );
    let mut constant = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let without = losses(&mut constant, 4, 6);
    assert_eq!(with_schedule[0], without[0]);
    assert_ne!(with_schedule[5], without[5], "the schedule took effect");
}

#[test]
fn capture_off_runs_every_step_eagerly_with_the_same_results() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut default = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let config = GraphTrainerConfig::new().with_capture(false);
    let mut off = GraphTrainer::new(model(&bytes), adam(), loss, config);
    assert_eq!(losses(&mut default, 3, 5), losses(&mut off, 3, 5));
    let report = off.report();
    assert_eq!(
        report.fallbacks.get("CaptureDisabled"),
        Some(&5),
        "{report:?}"
    );
    assert_eq!(report.last_fallback.as_deref(), Some("CaptureDisabled"));
    assert_eq!(
        parameter_bits(default.model().unwrap()),
        parameter_bits(off.model().unwrap())
    );
}

#[test]
fn the_report_round_trips_through_json() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    losses(&mut trainer, 5, 4);
    let report = trainer.report();
    let json = serde_json::to_string_pretty(&report).unwrap();
    let back: TrainerReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, report);
    assert_eq!(back.steps, 4);
    assert_eq!(back.trainer, Some(trainer.id()));
    assert!(json.contains("\"NoHardwareGraphs\": 1"), "{json}");

    // A report written before `graphed_random_ops` existed still reads.
    let mut older: serde_json::Value = serde_json::from_str(&json).unwrap();
    older.as_object_mut().unwrap().remove("graphed_random_ops");
    let older: TrainerReport = serde_json::from_value(older).unwrap();
    assert_eq!(older, report);

    // Timings whose shortest decimal form does not parse back to the same bits
    // without exact float parsing (CI once measured check_ms = 0.028170999999999998).
    let mut awkward = report;
    awkward.check_ms = 0.028170999999999998;
    awkward.snapshot_ms = 0.1 + 0.2;
    let back: TrainerReport =
        serde_json::from_str(&serde_json::to_string(&awkward).unwrap()).unwrap();
    assert_eq!(back, awkward);
}
