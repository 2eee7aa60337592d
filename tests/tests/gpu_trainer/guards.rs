//! Guards on the GPU (issue 5, acceptance 4): every case where a replay could go wrong
//! either runs eagerly or stays equal to eager training, and nothing crashes.
//!
//! Small sizes: `xtask gpu run memcheck` also runs these under compute-sanitizer.

use burn::prelude::*;
use burn_graph_capture::{FallbackReason, GraphTrainer, GraphTrainerConfig, StepMode};
use lstm_example::SineTask;
use lstm_example::train::parameter_values;

use crate::common::{
    Comparison, D_INPUT, Diff, Model, Plan, Run, SMALL, Stack, TOLERANCE, WARMUP, adam,
    adam_trainer, assert_warmup_capture_replay, batch, case, device, eager_churn, eager_run,
    graph_count, graphed_run, loss, lr_at, materialize, model, model_bytes, nothing,
};

const LR: f64 = 1e-2;

fn plan(seed: u64, steps: usize) -> Plan {
    Plan {
        sizes: SMALL,
        seed,
        steps,
        base_lr: LR,
    }
}

/// Two trainers whose models alias the same parameter buffers (I6, the motivating
/// illegal-address bug): the first step finds the share and runs eagerly with the
/// reason; its update moves that trainer onto buffers of its own, so from then on
/// neither shares and both warm up, capture and replay over multi-iteration graphs,
/// interleaved, each training exactly as its own eager training would.
fn shared_parameters_part_after_the_first_update<G: Stack>() {
    let steps = WARMUP + 6;
    let bytes = model_bytes(SMALL);
    let first_model = model::<G>(SMALL, &bytes);
    let second_model = first_model.clone(); // the same tensors: a share
    let mut first = GraphTrainer::new(first_model, adam::<G>(), loss, GraphTrainerConfig::new());
    let mut second = GraphTrainer::new(second_model, adam::<G>(), loss, GraphTrainerConfig::new());
    let (mut task_a, mut task_b) = (SineTask::new(6, D_INPUT), SineTask::new(7, D_INPUT));
    let (mut a_run, mut b_run) = (Run::default(), Run::default());
    for step in 0..steps {
        first.set_lr(lr_at(LR, step));
        second.set_lr(lr_at(LR, step));
        let a = first.step(batch(&mut task_a, SMALL)).expect("step");
        let b = second.step(batch(&mut task_b, SMALL)).expect("step");
        a_run.modes.push(a.mode);
        b_run.modes.push(b.mode);
        a_run.losses.push(a.output.into_scalar().elem());
        b_run.losses.push(b.output.into_scalar().elem());
    }
    assert_eq!(
        a_run.modes[0],
        StepMode::Eager(FallbackReason::SharedWithTrainer(second.id()))
    );
    assert_warmup_capture_replay(&a_run.modes[1..]);
    assert_warmup_capture_replay(&b_run.modes);
    assert_eq!(
        (first.report().shared_with, second.report().shared_with),
        (None, None)
    );
    assert_eq!(
        (first.report().graphs_alive, second.report().graphs_alive),
        (1, 1)
    );
    a_run.params = parameter_values(first.model().unwrap());
    b_run.params = parameter_values(second.model().unwrap());

    let eager_a = eager_run::<G, _>(plan(6, steps), &bytes, adam::<G>(), &mut nothing::<G>);
    let eager_b = eager_run::<G, _>(plan(7, steps), &bytes, adam::<G>(), &mut nothing::<G>);
    Comparison::of(&a_run, &eager_a).check(&case::<G>("shared, first trainer"), TOLERANCE);
    Comparison::of(&b_run, &eager_b).check(&case::<G>("shared, second trainer"), TOLERANCE);
}

/// A second trainer made from a graphed trainer's model (`trainer.model().clone()`)
/// starts on a copy, not on the first one's pinned buffers (I8): the first keeps
/// replaying, the second warms up on its own, nothing is shared, and each equals its
/// own eager training (I4: no silent divergence).
fn a_trainer_made_from_a_graphed_trainers_model_keeps_its_values<G: Stack>() {
    let (graphed_steps, shared_steps) = (WARMUP + 1 + 3, 3);
    let bytes = model_bytes(SMALL);
    let mut first = adam_trainer::<G>(SMALL, &bytes);
    let mut task_a = SineTask::new(61, D_INPUT);
    let mut a_run = Run::default();
    let mut step_first = |trainer: &mut GraphTrainer<_, _, _, _, _>, run: &mut Run, step| {
        trainer.set_lr(lr_at(LR, step));
        let outcome = trainer.step(batch::<G>(&mut task_a, SMALL)).expect("step");
        run.modes.push(outcome.mode);
        run.losses.push(outcome.output.into_scalar().elem());
    };
    for step in 0..graphed_steps {
        step_first(&mut first, &mut a_run, step);
    }
    assert_warmup_capture_replay(&a_run.modes);
    let snapshot: Model<G> = first.model().unwrap().clone();
    let snapshot_bytes = lstm_example::train::to_bytes(snapshot.clone());
    let mut second = GraphTrainer::new(snapshot, adam::<G>(), loss, GraphTrainerConfig::new());
    let mut task_b = SineTask::new(62, D_INPUT);
    let mut b_run = Run::default();
    for step in 0..shared_steps {
        // The first trainer steps first: a write-back into its pins would be seen by the
        // second trainer's model.
        step_first(&mut first, &mut a_run, graphed_steps + step);
        second.set_lr(lr_at(LR, step));
        let b = second.step(batch(&mut task_b, SMALL)).expect("step");
        assert_eq!(a_run.modes.last().unwrap(), &StepMode::Replayed);
        assert_eq!(b.mode, StepMode::Eager(FallbackReason::Warmup));
        b_run.losses.push(b.output.into_scalar().elem());
    }
    assert_eq!(
        first.report().graphs_alive,
        1,
        "the first trainer keeps its graph"
    );
    assert_eq!(
        (first.report().shared_with, second.report().shared_with),
        (None, None)
    );
    a_run.params = parameter_values(first.model().unwrap());
    b_run.params = parameter_values(second.model().unwrap());

    let steps = graphed_steps + shared_steps;
    let eager_a = eager_run::<G, _>(plan(61, steps), &bytes, adam::<G>(), &mut nothing::<G>);
    let eager_b = eager_run::<G, _>(
        plan(62, shared_steps),
        &snapshot_bytes,
        adam::<G>(),
        &mut nothing::<G>,
    );
    Comparison::of(&a_run, &eager_a).check(&case::<G>("graphed trainer, then shared"), TOLERANCE);
    Comparison::of(&b_run, &eager_b).check(&case::<G>("trainer made from its model"), TOLERANCE);
}

/// Eager work between replays (cubecl#1612: freed intermediates reused, later replays
/// corrupted): after every step the loss is read, the model is evaluated on a batch of
/// another shape, and tensors of several sizes are created, checked and dropped, one of
/// them kept across the next step. The whole run, evaluations included, must equal the
/// same run trained eagerly.
fn eager_work_between_replays_does_not_corrupt_them<G: Stack>() {
    let steps = WARMUP + 1 + 20;
    let bytes = model_bytes(SMALL);
    let mut kept: Option<(f32, Tensor<burn_graph_capture::TrainBackend<G>, 1>)> = None;
    let mut between = |step: usize, model: &Model<G>, probes: &mut Vec<f32>| {
        // A tensor kept across the step just run: the step must not have written it.
        if let Some((value, tensor)) = kept.take() {
            let sum: f32 = tensor.sum().into_scalar().elem();
            assert_eq!(sum, value * 4096.0, "a tensor kept across step {step}");
        }
        // Evaluation on data of another shape (no autodiff graph is kept).
        let mut eval_task = SineTask::new(99, D_INPUT);
        let eval = eval_task.next_batch(SMALL.batch + 3, SMALL.time + 2, &device());
        let prediction = model.forward(eval.x).detach();
        probes.push(prediction.sum().into_scalar().elem());
        eager_churn::<G>(step);
        let value = (step % 5) as f32;
        kept = Some((value, Tensor::full([4096], value, &device())));
    };
    let graphed = graphed_run::<G, _>(
        plan(21, steps),
        &bytes,
        adam::<G>(),
        GraphTrainerConfig::new(),
        &mut between,
    );
    assert_warmup_capture_replay(&graphed.modes);
    let eager = eager_run::<G, _>(plan(21, steps), &bytes, adam::<G>(), &mut between);
    assert_eq!(graphed.probes.len(), steps);
    Comparison::of(&graphed, &eager).check(&case::<G>("eager work between replays"), TOLERANCE);
}

/// Queues replays without reading anything, then drops the trainer (its graph, pins and
/// model) while they may still run, then does eager work on fresh memory. The graph must
/// be released (not leaked), the eager work must be correct, and the last replay's loss,
/// a tensor that outlives the trainer, must equal eager training's.
fn dropping_a_trainer_with_replays_in_flight_is_safe<G: Stack>() {
    let steps = WARMUP + 1 + 40;
    let bytes = model_bytes(SMALL);
    let graphs_before = graph_count();
    let mut trainer = adam_trainer::<G>(SMALL, &bytes);
    let mut task = SineTask::new(31, D_INPUT);
    let mut modes = Vec::new();
    let mut last_loss = None;
    for step in 0..steps {
        trainer.set_lr(lr_at(LR, step));
        let outcome = trainer.step(batch(&mut task, SMALL)).expect("step");
        modes.push(outcome.mode);
        last_loss = Some(outcome.output); // not read: replays stay queued
    }
    assert_eq!(
        graph_count(),
        graphs_before + 1,
        "the trainer holds one graph"
    );
    drop(trainer);
    // New allocations right away, while the dropped graph's replays may still run.
    eager_churn::<G>(1);
    eager_churn::<G>(2);
    G::sync(&device()).expect("sync");
    assert_eq!(
        graph_count(),
        graphs_before,
        "the dropped graph was released"
    );
    assert_warmup_capture_replay(&modes);

    // The reference trains on memory the dropped trainer just gave back.
    let eager = eager_run::<G, _>(plan(31, steps), &bytes, adam::<G>(), &mut nothing::<G>);
    let last: f32 = last_loss.unwrap().into_scalar().elem();
    let diff = Diff::of(&[last], &eager.losses[steps - 1..]);
    println!(
        "{}: last replayed loss {last} vs eager {}: {}",
        case::<G>("trainer dropped with replays in flight"),
        eager.losses[steps - 1],
        diff.describe()
    );
    assert!(diff.max_rel <= TOLERANCE, "last loss: {}", diff.describe());
}

/// Takes the model and optimizer out of a trainer (dropping its graph and pins) while
/// replays are queued: the model must hold what the last replay wrote.
fn into_parts_with_replays_in_flight_keeps_the_trained_model<G: Stack>() {
    let steps = WARMUP + 1 + 20;
    let bytes = model_bytes(SMALL);
    let mut trainer = adam_trainer::<G>(SMALL, &bytes);
    let mut task = SineTask::new(41, D_INPUT);
    let mut modes = Vec::new();
    for step in 0..steps {
        trainer.set_lr(lr_at(LR, step));
        modes.push(trainer.step(batch(&mut task, SMALL)).expect("step").mode);
    }
    let (model, optimizer) = trainer.into_parts();
    drop(optimizer);
    eager_churn::<G>(3);
    assert_warmup_capture_replay(&modes);
    let eager = eager_run::<G, _>(plan(41, steps), &bytes, adam::<G>(), &mut nothing::<G>);
    let params = parameter_values(&model);
    let diff = Diff::of(params.iter().flatten(), eager.params.iter().flatten());
    println!(
        "model taken out with replays in flight: params {}",
        diff.describe()
    );
    assert!(diff.max_rel <= TOLERANCE, "params: {}", diff.describe());
}

/// A smaller last batch (a new shape) with the one graph slot taken warms up eagerly
/// without taking it; the next full batch replays the graph again, and the whole run
/// equals eager training.
fn a_smaller_last_batch_gets_its_own_graph_or_runs_eagerly<G: Stack>() {
    let bytes = model_bytes(SMALL);
    let config = GraphTrainerConfig::new().with_max_graphs(1);
    let mut trainer = GraphTrainer::new(model::<G>(SMALL, &bytes), adam::<G>(), loss, config);
    let smaller = |size: usize| {
        if size == 6 {
            SMALL.batch - 1
        } else {
            SMALL.batch
        }
    };
    let mut task = SineTask::new(12, D_INPUT);
    let mut graphed = Run::default();
    for step in 0..8 {
        let batch = task.next_batch(smaller(step), SMALL.time, &device());
        let outcome = trainer.step(batch).expect("step");
        graphed.modes.push(outcome.mode);
        graphed.losses.push(outcome.output.into_scalar().elem());
    }
    assert_eq!(graphed.modes[WARMUP], StepMode::Captured);
    assert_eq!(graphed.modes[5], StepMode::Replayed);
    assert_eq!(graphed.modes[6], StepMode::Eager(FallbackReason::Warmup));
    assert_eq!(
        graphed.modes[7],
        StepMode::Replayed,
        "the eager step kept the pins"
    );
    graphed.params = parameter_values(trainer.model().unwrap());

    let mut eager_model = model::<G>(SMALL, &bytes);
    let mut optimizer = adam::<G>();
    optimizer.init_state(&eager_model);
    materialize::<G>();
    let mut task = SineTask::new(12, D_INPUT);
    let mut eager = Run::default();
    for step in 0..8 {
        let batch = task.next_batch(smaller(step), SMALL.time, &device());
        let loss = loss(&eager_model, &batch);
        let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &eager_model);
        eager_model = optimizer.step(eager_model, grads);
        eager.losses.push(loss.into_scalar().elem());
    }
    eager.params = parameter_values(&eager_model);
    Comparison::of(&graphed, &eager).check(&case::<G>("smaller last batch"), TOLERANCE);
}

// On the stack (Fusion over CubeCL on this runtime) and on plain CubeCL.
stack_tests!(
    shared_parameters_part_after_the_first_update,
    a_trainer_made_from_a_graphed_trainers_model_keeps_its_values,
    eager_work_between_replays_does_not_corrupt_them,
    dropping_a_trainer_with_replays_in_flight_is_safe,
    into_parts_with_replays_in_flight_keeps_the_trained_model,
    a_smaller_last_batch_gets_its_own_graph_or_runs_eagerly,
);
