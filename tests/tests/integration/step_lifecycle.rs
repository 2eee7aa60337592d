//! `GraphTrainer` on the CPU: warmup, per-shape accounting, fallbacks, and parity with
//! plain eager training.

use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::{BreakerKind, FallbackReason, GraphTrainer, GraphTrainerConfig, StepMode};
use lstm_example::train::parameter_bits;
use lstm_example::{Batch, SineTask};

use crate::common::{B, Model, adam, loss, model, model_bytes};

fn reason(mode: &StepMode) -> &FallbackReason {
    match mode {
        StepMode::Eager(reason) => reason,
        other => panic!("expected an eager step, got {other:?}"),
    }
}

#[test]
fn cpu_steps_warm_up_then_report_no_hardware_graphs() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(1, 32);
    let device = Default::default();
    let modes: Vec<_> = (0..5)
        .map(|_| trainer.step(task.next_batch(4, 6, &device)).unwrap().mode)
        .collect();
    let warmup = StepMode::Eager(FallbackReason::Warmup);
    let no_graphs = StepMode::Eager(FallbackReason::NoHardwareGraphs);
    assert_eq!(
        modes,
        [
            warmup.clone(),
            warmup.clone(),
            warmup,
            no_graphs.clone(),
            no_graphs
        ]
    );
    let report = trainer.report();
    assert_eq!(report.steps, 5);
    assert_eq!(report.modes.eager, 5);
    assert_eq!(report.fallbacks["Warmup"], 3);
    assert_eq!(report.fallbacks["NoHardwareGraphs"], 2);
    assert_eq!(report.graphs_alive, 0);
}

/// The trainer's steps are the same ops as a hand-written loop with the same optimizer.
#[test]
fn trainer_training_equals_a_plain_loop() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let device = Default::default();
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, GraphTrainerConfig::new());
    let mut task = SineTask::new(2, 32);
    let trained: Vec<f32> = (0..8)
        .map(|_| {
            let outcome = trainer.step(task.next_batch(4, 6, &device)).unwrap();
            outcome.output.into_scalar()
        })
        .collect();

    let mut plain = model(&bytes);
    let mut optimizer = adam();
    optimizer.init_state(&plain);
    let mut task = SineTask::new(2, 32);
    let looped: Vec<f32> = (0..8)
        .map(|_| {
            let batch = task.next_batch::<B>(4, 6, &device);
            let loss = loss(&plain, &batch);
            let grads = GradientsParams::from_grads(loss.backward(), &plain);
            plain = optimizer.step(plain.clone(), grads);
            loss.into_scalar()
        })
        .collect();

    assert_eq!(trained, looped);
    assert!(parameter_bits(trainer.model().unwrap()) == parameter_bits(&plain));
}

#[test]
fn a_new_shape_gets_its_own_warmup_and_shapes_without_graphs_hold_no_slot() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let device = Default::default();
    let config = GraphTrainerConfig::new()
        .with_warmup_steps(1)
        .with_max_graphs(2);
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), loss, config);
    let mut task = SineTask::new(3, 32);
    let mut step = |batch: usize| {
        let batch = task.next_batch(batch, 6, &device);
        reason(&trainer.step(batch).unwrap().mode).clone()
    };
    assert_eq!(step(4), FallbackReason::Warmup);
    assert_eq!(step(4), FallbackReason::NoHardwareGraphs);
    assert_eq!(
        step(3),
        FallbackReason::Warmup,
        "a smaller last batch warms up"
    );
    assert_eq!(step(3), FallbackReason::NoHardwareGraphs);
    assert_eq!(
        step(2),
        FallbackReason::Warmup,
        "no shape holds a graph on the CPU, so the cache has room"
    );
    assert_eq!(
        step(4),
        FallbackReason::NoHardwareGraphs,
        "old shapes stay warm"
    );
    assert!(!trainer.report().fallbacks.contains_key("GraphCacheFull"));
}

#[test]
fn non_static_control_flow_stays_eager() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let device = Default::default();
    let mut calls = 0;
    let branching = move |model: &Model, batch: &Batch<B>| {
        calls += 1;
        let mut out = model.forward(batch.x.clone());
        // A host-side branch that takes a new path at every step.
        for _ in 0..calls {
            out = out.tanh();
        }
        (out - batch.y.clone()).powi_scalar(2).mean()
    };
    let mut trainer =
        GraphTrainer::new(model(&bytes), adam(), branching, GraphTrainerConfig::new());
    let mut task = SineTask::new(4, 32);
    let first = trainer.step(task.next_batch(4, 6, &device)).unwrap().mode;
    assert_eq!(first, StepMode::Eager(FallbackReason::Warmup));
    let second = trainer.step(task.next_batch(4, 6, &device)).unwrap().mode;
    assert!(
        matches!(reason(&second), FallbackReason::NonStaticControlFlow { .. }),
        "{second:?}"
    );
    // Each step of a new path starts the warmup over, `max_warmup_restarts` times; then
    // the shape stays eager for that reason.
    let restarts = GraphTrainerConfig::new().max_warmup_restarts;
    for _ in 0..restarts + 3 {
        let next = trainer.step(task.next_batch(4, 6, &device)).unwrap().mode;
        assert!(
            matches!(reason(&next), FallbackReason::NonStaticControlFlow { .. }),
            "the shape stays eager for the same reason: {next:?}"
        );
    }
    assert!(!trainer.report().fallbacks.contains_key("NoHardwareGraphs"));
}

/// A host branch between two paths, taken in turn: each path's steps count towards its
/// own warmup, so the shape is ready for a graph after a few steps of each (on the CPU:
/// `NoHardwareGraphs`), and no step of the run restarts it for good.
#[test]
fn two_paths_taken_in_turn_each_warm_up() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let device = Default::default();
    let mut calls = 0;
    let branching = move |model: &Model, batch: &Batch<B>| {
        calls += 1;
        let out = model.forward(batch.x.clone());
        let out = if calls % 2 == 0 { out.tanh() } else { out };
        (out - batch.y.clone()).powi_scalar(2).mean()
    };
    let mut trainer =
        GraphTrainer::new(model(&bytes), adam(), branching, GraphTrainerConfig::new());
    let mut task = SineTask::new(4, 32);
    let modes: Vec<StepMode> = (0..12)
        .map(|_| trainer.step(task.next_batch(4, 6, &device)).unwrap().mode)
        .collect();
    let ready = modes
        .iter()
        .position(|mode| *mode == StepMode::Eager(FallbackReason::NoHardwareGraphs));
    assert!(ready.is_some_and(|step| step <= 2 * 3), "{modes:?}");
    assert!(
        modes[ready.unwrap()..]
            .iter()
            .all(|mode| *mode == StepMode::Eager(FallbackReason::NoHardwareGraphs)),
        "{modes:?}"
    );
}

/// Runs warmup steps with `step_fn` and returns the fallback of the first step.
fn first_reason(step_fn: impl FnMut(&Model, &Batch<B>) -> Tensor<B, 1> + Clone) -> FallbackReason {
    let bytes = model_bytes();
    let device = Default::default();
    let mut trainer = GraphTrainer::new(model(&bytes), adam(), step_fn, GraphTrainerConfig::new());
    let batch = SineTask::new(5, 32).next_batch(4, 6, &device);
    let mode = trainer.step(batch).unwrap().mode;
    reason(&mode).clone()
}

fn breaker_kind(reason: FallbackReason) -> BreakerKind {
    match reason {
        FallbackReason::CaptureBreaker(breaker) => breaker.kind,
        other => panic!("expected a capture breaker, got {other:?}"),
    }
}

#[test]
fn each_capture_breaker_makes_the_trainer_eager_with_its_reason() {
    let _rng = crate::common::rng::shared();
    let host_read = first_reason(|model, batch| {
        let loss = loss(model, batch);
        let _logged: f32 = loss.clone().into_scalar();
        loss
    });
    assert_eq!(breaker_kind(host_read), BreakerKind::HostRead);

    // Int draws come from Burn's host-seeded generator.
    let rng = first_reason(|model, batch| {
        let noise = Tensor::<B, 3, Int>::random(
            batch.x.dims(),
            burn::tensor::Distribution::Uniform(0.0, 2.0),
            &batch.x.device(),
        );
        model.loss(batch.x.clone() + noise.float() * 0.01, batch.y.clone())
    });
    assert_eq!(breaker_kind(rng), BreakerKind::Rng);

    // Float draws come from the trainer's device generator: no breaker.
    let served = first_reason(|model, batch| {
        let noise = Tensor::random_like(&batch.x, burn::tensor::Distribution::Default);
        model.loss(batch.x.clone() + noise * 0.01, batch.y.clone())
    });
    assert_eq!(served, FallbackReason::Warmup);

    // A move to the device the tensor is on is a no-op, not a breaker.
    let same_device = first_reason(|model, batch| {
        let x = batch.x.clone().to_device(&Default::default());
        model.loss(x, batch.y.clone())
    });
    assert_eq!(same_device, FallbackReason::Warmup);

    let data_dependent = first_reason(|model, batch| {
        let positive = batch.y.clone().greater_elem(0.0).argwhere();
        let weight = positive.dims()[0] as f32;
        loss(model, batch) * (1.0 / weight.max(1.0))
    });
    assert_eq!(
        breaker_kind(data_dependent),
        BreakerKind::DataDependentShape
    );
}

/// Two trainers whose models alias the same parameter buffers: the first step finds
/// the share and runs eagerly with the reason; its update moves that trainer onto
/// buffers of its own, so neither shares any more, and both train exactly as two plain
/// eager trainers would.
#[test]
fn a_shared_parameter_makes_the_trainers_eager_until_they_part() {
    let _rng = crate::common::rng::shared();
    let bytes = model_bytes();
    let device = Default::default();
    let first_model = model(&bytes);
    let second_model = first_model.clone(); // the same tensors: a share
    let mut first = GraphTrainer::new(first_model, adam(), loss, GraphTrainerConfig::new());
    let mut second = GraphTrainer::new(second_model, adam(), loss, GraphTrainerConfig::new());
    let mut task_a = SineTask::new(6, 32);
    let mut task_b = SineTask::new(7, 32);
    let mut losses = (Vec::new(), Vec::new());
    for step in 0..5 {
        let a = first.step(task_a.next_batch(4, 6, &device)).unwrap();
        let b = second.step(task_b.next_batch(4, 6, &device)).unwrap();
        let shared = StepMode::Eager(FallbackReason::SharedWithTrainer(second.id()));
        assert_eq!(a.mode == shared, step == 0, "step {step}: {:?}", a.mode);
        assert!(
            !matches!(
                b.mode,
                StepMode::Eager(FallbackReason::SharedWithTrainer(_))
            ),
            "step {step}: the first trainer's update parted them"
        );
        losses.0.push(a.output.into_scalar());
        losses.1.push(b.output.into_scalar());
    }
    assert_eq!(first.report().shared_with, None);

    // The same two trainings, by hand.
    let eager = |seed| {
        let mut model = model(&bytes);
        let mut optimizer = adam();
        optimizer.init_state(&model);
        let mut task = SineTask::new(seed, 32);
        (0..5)
            .map(|_| {
                let batch = task.next_batch::<B>(4, 6, &device);
                let loss = loss(&model, &batch);
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                model = optimizer.step(model.clone(), grads);
                loss.into_scalar()
            })
            .collect::<Vec<f32>>()
    };
    assert_eq!(losses.0, eager(6));
    assert_eq!(losses.1, eager(7));
}

#[test]
fn trainers_without_shares_are_independent() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let mut first = GraphTrainer::new(
        model(&model_bytes()),
        adam(),
        loss,
        GraphTrainerConfig::new(),
    );
    let mut second = GraphTrainer::new(
        model(&model_bytes()),
        adam(),
        loss,
        GraphTrainerConfig::new(),
    );
    let batch = SineTask::new(8, 32).next_batch(4, 6, &device);
    assert_eq!(
        first.step(batch.clone()).unwrap().mode,
        StepMode::Eager(FallbackReason::Warmup)
    );
    assert_eq!(
        second.step(batch).unwrap().mode,
        StepMode::Eager(FallbackReason::Warmup)
    );
    assert_eq!(first.report().shared_with, None);
}
