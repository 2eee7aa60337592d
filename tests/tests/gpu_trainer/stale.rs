//! Issue 27 on the GPU: replays that cannot go stale.
//!
//! A replay does not call the step closure. When the loop changes what the closure
//! reads after the capture, the trainer must notice before it replays a stale graph:
//! 1. a target network replaced every 20 steps (DQN) and a constant mask replaced
//!    after the capture: the graph's constant is no longer held outside it, so the
//!    shape warms up again and graphs again; training equals plain eager code, with
//!    replays between the changes;
//! 2. a host loss weight changed after the capture cannot be seen without running the
//!    closure: the periodic check (`verify_every`) finds it, names the op, and the shape
//!    graphs again; passed as a tensor in the batch, the same schedule replays
//!    throughout and equals eager training;
//! 3. structure changes through `put_model` (unfreezing, a head re-initialised, an
//!    embedding grown under its id) re-fit the optimizer state, warm up again and
//!    replay again within warmup + 2 steps, equal to eager;
//! 4. a batch whose target is a column sliced from a wider upload and whose mask is
//!    expanded over the batch replays (their pins keep the views' layouts).
//!
//! Small sizes: `xtask gpu run memcheck` also runs these under compute-sanitizer.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use burn::module::{AutodiffModule, Module, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_graph_capture::{
    FallbackReason, GraphTrainer, GraphTrainerConfig, StepChange, StepInput, StepMode,
};
use lstm_example::train::parameter_values;
use lstm_example::{CharLm, CharLmConfig, SineTask, TokenBatch, TokenTask};

use crate::common::{
    Batch, Model, SMALL, Stack, WARMUP, batch, case, device, loss, lr_at, materialize, model,
    model_bytes,
};
use crate::inputs::{B, LR, Run, adam, check};

/// The inner-backend copy of a model: what a target network or reference model is.
type Frozen<G> = <Model<G> as AutodiffModule<B<G>>>::InnerModule;

/// The loss with a target network's forecast as a second target (weight 0.5).
fn with_target<G: Stack>(
    model: &Model<G>,
    batch: &Batch<G>,
    target: &Frozen<G>,
) -> Tensor<B<G>, 1> {
    let goal = Tensor::from_inner(target.forward(batch.x.clone().inner()));
    loss::<G>(model, batch)
        + (model.forward(batch.x.clone()) - goal)
            .powi_scalar(2)
            .mean()
            * 0.5
}

/// `steps` steps through a trainer and the same by hand; before step `s`, `change(s)`
/// says whether the loop replaces what the closure reads, which `world(s, model)`
/// builds from the model of that moment, on either side.
pub(crate) fn run_both<G, W>(
    steps: usize,
    config: GraphTrainerConfig,
    world: impl Fn(usize, &Model<G>) -> W,
    change: impl Fn(usize) -> bool,
    step_loss: impl Fn(&Model<G>, &Batch<G>, &W) -> Tensor<B<G>, 1> + Clone,
) -> (Run, Run)
where
    G: Stack,
{
    let bytes = model_bytes(SMALL);
    let start = model::<G>(SMALL, &bytes);
    let held = Rc::new(RefCell::new(world(0, &start)));
    let closure = {
        let (held, step_loss) = (Rc::clone(&held), step_loss.clone());
        move |m: &Model<G>, b: &Batch<G>| step_loss(m, b, &held.borrow())
    };
    let mut trainer = GraphTrainer::new(start, adam::<G>(), closure, config);
    let mut task = SineTask::new(27, crate::common::D_INPUT);
    let mut graphed = Run::default();
    for step in 0..steps {
        if change(step) {
            *held.borrow_mut() = world(step, trainer.model().expect("model"));
        }
        trainer.set_lr(lr_at(LR, step));
        let outcome = trainer.step(batch::<G>(&mut task, SMALL)).expect("step");
        graphed.modes.push(outcome.mode);
        graphed.losses.push(outcome.output.into_scalar().elem());
    }
    graphed.params = parameter_values(&trainer.model().expect("model").valid());
    graphed.report = Some(trainer.report());

    let mut plain = model::<G>(SMALL, &bytes);
    let mut optimizer = adam::<G>();
    optimizer.init_state(&plain);
    let mut world_now = world(0, &plain);
    materialize::<G>();
    let mut task = SineTask::new(27, crate::common::D_INPUT);
    let mut eager = Run::default();
    for step in 0..steps {
        if change(step) {
            world_now = world(step, &plain);
        }
        optimizer.set_lr(lr_at(LR, step));
        let l = step_loss(&plain, &batch::<G>(&mut task, SMALL), &world_now);
        let grads = GradientsParams::from_grads(l.backward(), &plain);
        plain = optimizer.step(plain, grads);
        eager.losses.push(l.into_scalar().elem());
    }
    eager.params = parameter_values(&plain.valid());
    (graphed, eager)
}

/// The steps whose mode is `GraphStale` with a change of `kind`.
pub(crate) fn stale_steps(run: &Run, kind: fn(&StepChange) -> bool) -> Vec<usize> {
    run.modes
        .iter()
        .enumerate()
        .filter(|(_, mode)| {
            matches!(mode, StepMode::Eager(FallbackReason::GraphStale { change }) if kind(change))
        })
        .map(|(step, _)| step)
        .collect()
}

/// Replays in `steps`.
pub(crate) fn replays(run: &Run, steps: std::ops::Range<usize>) -> usize {
    run.modes[steps]
        .iter()
        .filter(|mode| **mode == StepMode::Replayed)
        .count()
}

fn dropped(change: &StepChange) -> bool {
    matches!(change, StepChange::ConstantDropped { .. })
}

/// DQN's pattern: a target network copied from the model every 20 steps, held where
/// the closure reads it.
fn a_target_network_replaced_every_20_steps_equals_eager<G: Stack>() {
    let steps = 80;
    let (graphed, eager) = run_both::<G, _>(
        steps,
        GraphTrainerConfig::new(),
        |_, model: &Model<G>| model.valid(),
        |step| step > 0 && step % 20 == 0,
        with_target::<G>,
    );
    println!("target network: modes {:?}", graphed.modes);
    check(
        &case::<G>("target network replaced every 20 steps"),
        &graphed,
        &eager,
    );
    assert_eq!(
        stale_steps(&graphed, dropped),
        [20, 40, 60],
        "each replacement is found"
    );
    for change in [20, 40, 60] {
        assert!(
            replays(&graphed, change - 10..change) > 0,
            "replays before step {change}"
        );
        assert_eq!(
            graphed.modes[change + WARMUP + 1],
            StepMode::Replayed,
            "replays resume within warmup + 2 steps of {change}"
        );
    }
}

/// A per-sample weight mask `[batch, time, 1]` of the small size: `scale` plus a
/// pattern in steps of 0.25.
pub(crate) fn mask<G: Stack>(scale: f32) -> Tensor<B<G>, 3> {
    let weights: Vec<f32> = (0..SMALL.batch * SMALL.time)
        .map(|i| scale + (i % 3) as f32 * 0.25)
        .collect();
    Tensor::<B<G>, 3>::from_data(
        TensorData::new(weights, [SMALL.batch, SMALL.time, 1]),
        &device(),
    )
}

/// A mask the loop replaces once, after the capture.
fn a_constant_replaced_after_capture_equals_eager<G: Stack>() {
    let steps = 40;
    let (graphed, eager) = run_both::<G, _>(
        steps,
        GraphTrainerConfig::new(),
        |step, _: &Model<G>| mask::<G>(if step < 20 { 0.5 } else { 1.0 }),
        |step| step == 20,
        |model: &Model<G>, batch: &Batch<G>, mask: &Tensor<B<G>, 3>| {
            ((model.forward(batch.x.clone()) - batch.y.clone()).powi_scalar(2) * mask.clone())
                .mean()
        },
    );
    check(
        &case::<G>("constant replaced after capture"),
        &graphed,
        &eager,
    );
    assert_eq!(stale_steps(&graphed, dropped), [20]);
    assert!(replays(&graphed, 10..20) > 0);
    assert_eq!(graphed.modes[20 + WARMUP + 1], StepMode::Replayed);
}

/// A host loss weight that changes at step 30 (an annealing schedule written as a host
/// scalar): invisible to a replay; the check every `verify_every` replays finds it.
fn a_host_weight_changed_after_capture_is_found_by_the_check<G: Stack>() {
    let every = 8;
    let weight = Rc::new(Cell::new(1.0f32));
    let read = Rc::clone(&weight);
    let closure = move |m: &Model<G>, b: &Batch<G>| loss::<G>(m, b) * read.get();
    let bytes = model_bytes(SMALL);
    let config = GraphTrainerConfig::new().with_verify_every(every);
    let mut trainer = GraphTrainer::new(model::<G>(SMALL, &bytes), adam::<G>(), closure, config);
    let mut task = SineTask::new(28, crate::common::D_INPUT);
    let mut modes = Vec::new();
    for step in 0..50 {
        if step == 30 {
            weight.set(0.5);
        }
        modes.push(
            trainer
                .step(batch::<G>(&mut task, SMALL))
                .expect("step")
                .mode,
        );
    }
    println!("host weight: modes {modes:?}");
    let stale: Vec<_> = modes
        .iter()
        .enumerate()
        .filter_map(|(step, mode)| match mode {
            StepMode::Eager(FallbackReason::GraphStale { change }) => Some((step, change.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(stale.len(), 1, "{modes:?}");
    let (found, change) = &stale[0];
    assert!(
        (30..30 + every + 1).contains(found),
        "found at step {found}"
    );
    assert!(
        matches!(change, StepChange::HostValues { op, .. } if op == "float_mul_scalar"),
        "{change:?}"
    );
    assert!(modes.contains(&StepMode::Eager(FallbackReason::ReplayCheck)));
    assert_eq!(
        modes[found + WARMUP + 1],
        StepMode::Replayed,
        "graphs again"
    );
}

/// The sine batch with a loss weight as a one-element tensor: a schedule that graphs.
#[derive(Clone, Debug, StepInput)]
struct Weighted<B: Backend> {
    batch: lstm_example::Batch<B>,
    weight: Tensor<B, 1>,
}

/// The schedule of the test above as the guide recommends: the weight in the batch.
fn a_host_weight_in_the_batch_replays_and_equals_eager<G: Stack>() {
    let steps = 50;
    let weighted = |model: &Model<G>, input: &Weighted<B<G>>| {
        loss::<G>(model, &input.batch) * input.weight.clone()
    };
    let input = |step: usize| Weighted {
        batch: batch::<G>(
            &mut SineTask::new(900 + step as u64, crate::common::D_INPUT),
            SMALL,
        ),
        weight: Tensor::from_floats([if step < 30 { 1.0f32 } else { 0.5 }], &device()),
    };
    let bytes = model_bytes(SMALL);
    let (graphed, _) = crate::inputs::graphed(model::<G>(SMALL, &bytes), steps, input, weighted);
    crate::common::assert_warmup_capture_replay(&graphed.modes);
    let (eager, _) = crate::inputs::eager(model::<G>(SMALL, &bytes), steps, input, weighted, |m| m);
    check(&case::<G>("host weight in the batch"), &graphed, &eager);
}

/// Trains `model` 40 steps with `change` applied through `take_model` / `put_model`
/// before step 20, and the same by hand (the optimizer state re-fitted as
/// `CapturableOptimizer::fit_state` documents); both must agree, and replays must
/// resume within warmup + 2 steps of the change.
fn structure_change_mid_run<G, M, I>(
    name: &str,
    start: M,
    batch: impl Fn(usize) -> I,
    step_loss: impl Fn(&M, &I) -> Tensor<B<G>, 1> + Clone,
    change: impl Fn(M) -> M,
) where
    G: Stack,
    M: AutodiffModule<B<G>>,
    I: StepInput<B<G>>,
{
    let (steps, at) = (40, 20);
    let closure = {
        let step_loss = step_loss.clone();
        move |m: &M, b: &I| step_loss(m, b)
    };
    let mut trainer = GraphTrainer::new(
        start.clone(),
        adam::<G>(),
        closure,
        GraphTrainerConfig::new(),
    );
    let mut graphed = Run::default();
    for step in 0..steps {
        if step == at {
            let taken = trainer.take_model().expect("model");
            trainer.put_model(change(taken));
        }
        trainer.set_lr(lr_at(LR, step));
        let outcome = trainer.step(batch(step)).expect("step");
        graphed.modes.push(outcome.mode);
        graphed.losses.push(outcome.output.into_scalar().elem());
    }
    graphed.params = parameter_values(&trainer.model().expect("model").valid());
    graphed.report = Some(trainer.report());
    println!("{name}: modes {:?}", graphed.modes);
    crate::common::assert_warmup_capture_replay(&graphed.modes[..at]);
    crate::common::assert_warmup_capture_replay(&graphed.modes[at..]);

    let mut plain = start;
    let mut optimizer = adam::<G>();
    optimizer.init_state(&plain);
    materialize::<G>();
    let mut eager = Run::default();
    for step in 0..steps {
        if step == at {
            plain = change(plain);
            optimizer.fit_state(&plain);
        }
        optimizer.set_lr(lr_at(LR, step));
        let l = step_loss(&plain, &batch(step));
        let grads = GradientsParams::from_grads(l.backward(), &plain);
        plain = optimizer.step(plain, grads);
        eager.losses.push(l.into_scalar().elem());
    }
    eager.params = parameter_values(&plain.valid());
    check(&case::<G>(name), &graphed, &eager);
}

fn sine_batches<G: Stack>() -> impl Fn(usize) -> Batch<G> {
    |step| {
        batch::<G>(
            &mut SineTask::new(300 + step as u64, crate::common::D_INPUT),
            SMALL,
        )
    }
}

fn sine_loss<G: Stack>(model: &Model<G>, batch: &Batch<G>) -> Tensor<B<G>, 1> {
    loss::<G>(model, batch)
}

/// The LSTM frozen for the first 20 steps (only the head trains), then unfrozen.
fn unfreezing_mid_run_graphs_again_and_equals_eager<G: Stack>() {
    let start = model::<G>(SMALL, &model_bytes(SMALL));
    let frozen = Model::<G> {
        lstm: start.lstm.no_grad(),
        head: start.head,
    };
    structure_change_mid_run::<G, _, _>(
        "unfreezing",
        frozen,
        sine_batches::<G>(),
        sine_loss::<G>,
        |model: Model<G>| Model::<G> {
            lstm: unfrozen(model.lstm),
            head: model.head,
        },
    );
}

/// Every parameter of `module` trainable again.
fn unfrozen<Bk: AutodiffBackend, M: Module<Bk>>(module: M) -> M {
    struct Unfreeze;
    impl<Bk: AutodiffBackend> burn::module::ModuleMapper<Bk> for Unfreeze {
        fn map_float<const D: usize>(
            &mut self,
            param: Param<Tensor<Bk, D>>,
        ) -> Param<Tensor<Bk, D>> {
            param.set_require_grad(true)
        }
    }
    module.map(&mut Unfreeze)
}

/// A fine-tuning step: the head replaced by a fresh one of the same size (new ids).
fn a_head_reinitialised_mid_run_graphs_again_and_equals_eager<G: Stack>() {
    let fresh = crate::common::config(SMALL).init::<burn::backend::Flex>(&Default::default());
    let head_bytes = lstm_example::train::to_bytes(fresh.head);
    structure_change_mid_run::<G, _, _>(
        "head re-initialised",
        model::<G>(SMALL, &model_bytes(SMALL)),
        sine_batches::<G>(),
        sine_loss::<G>,
        move |model: Model<G>| {
            let head = burn::nn::LinearConfig::new(SMALL.hidden, 1).init::<B<G>>(&device());
            let head = lstm_example::train::load_bytes(head, head_bytes.clone(), &device());
            Model::<G> {
                lstm: model.lstm,
                head: crate::models::materialized(head),
            }
        },
    );
}

const VOCAB: usize = 24;

/// A token model whose embedding grows by 8 rows under its id (`Param::map`).
fn vocabulary_growth_mid_run_graphs_again_and_equals_eager<G: Stack>() {
    let fresh = CharLmConfig::new(VOCAB, 16).init::<burn::backend::Flex>(&Default::default());
    let start = lstm_example::train::load_bytes(
        CharLmConfig::new(VOCAB, 16).init::<B<G>>(&device()),
        lstm_example::train::to_bytes(fresh),
        &device(),
    );
    let batches =
        |step: usize| TokenTask::new(500 + step as u64, VOCAB).next_batch(4, 12, &device());
    structure_change_mid_run::<G, _, _>(
        "vocabulary grown",
        start,
        batches,
        |model: &CharLm<B<G>>, batch: &TokenBatch<B<G>>| {
            model.loss(batch.tokens.clone(), batch.targets.clone())
        },
        |model: CharLm<B<G>>| {
            model.map(&mut GrowEmbedding {
                rows: 8,
                done: false,
            })
        },
    );
}

/// Grows the first matrix a model visits (`CharLm`'s embedding table) by `rows` zero
/// rows, under its id, as `Param::map` does.
struct GrowEmbedding {
    rows: usize,
    done: bool,
}

impl<Bk: AutodiffBackend> burn::module::ModuleMapper<Bk> for GrowEmbedding {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Bk, D>>) -> Param<Tensor<Bk, D>> {
        if self.done || D != 2 {
            return param;
        }
        self.done = true;
        let rows = self.rows;
        param.map(|table| {
            let mut dims = table.dims();
            dims[0] = rows;
            let zeros = Tensor::<Bk::InnerBackend, D>::zeros(dims, &table.device());
            Tensor::from_inner(Tensor::cat(vec![table.inner(), zeros], 0)).require_grad()
        })
    }
}

/// A batch whose target is a column sliced from a wider upload and whose mask is one
/// row expanded over the batch: views whose layout a packed pin would not keep.
#[derive(Clone, Debug, StepInput)]
struct Views<B: Backend> {
    x: Tensor<B, 3>,
    /// `[batch, time, 1]`, strides `[time * 4, 4, 1]`: column 0 of `[batch, time, 4]`.
    y: Tensor<B, 3>,
    /// `[batch, time, 1]`, batch stride 0.
    mask: Tensor<B, 3>,
}

fn views<G: Stack>(step: usize) -> Views<B<G>> {
    let plain = batch::<G>(
        &mut SineTask::new(700 + step as u64, crate::common::D_INPUT),
        SMALL,
    );
    let wide = Tensor::cat(vec![plain.y.clone(); 4], 2);
    let row: Vec<f32> = (0..SMALL.time)
        .map(|t| 0.5 + (t % 4) as f32 * 0.25)
        .collect();
    let mask = Tensor::<B<G>, 3>::from_data(TensorData::new(row, [1, SMALL.time, 1]), &device())
        .expand([SMALL.batch, SMALL.time, 1]);
    Views {
        x: plain.x,
        y: wide.narrow(2, 0, 1),
        mask,
    }
}

fn masked_column_loss<G: Stack>(model: &Model<G>, batch: &Views<B<G>>) -> Tensor<B<G>, 1> {
    ((model.forward(batch.x.clone()) - batch.y.clone()).powi_scalar(2) * batch.mask.clone()).mean()
}

/// Issue 27's item 6: strided and broadcast batch tensors replay.
fn a_strided_target_column_and_an_expanded_mask_replay<G: Stack>() {
    let steps = 30;
    let bytes = model_bytes(SMALL);
    let (graphed, _) = crate::inputs::graphed(
        model::<G>(SMALL, &bytes),
        steps,
        views::<G>,
        masked_column_loss::<G>,
    );
    println!("strided views: modes {:?}", graphed.modes);
    crate::common::assert_warmup_capture_replay(&graphed.modes);
    let (eager, _) = crate::inputs::eager(
        model::<G>(SMALL, &bytes),
        steps,
        views::<G>,
        masked_column_loss::<G>,
        |m| m,
    );
    check(
        &case::<G>("strided column and expanded mask"),
        &graphed,
        &eager,
    );
}

stack_tests!(
    a_strided_target_column_and_an_expanded_mask_replay,
    a_target_network_replaced_every_20_steps_equals_eager,
    a_constant_replaced_after_capture_equals_eager,
    a_host_weight_changed_after_capture_is_found_by_the_check,
    a_host_weight_in_the_batch_replays_and_equals_eager,
    unfreezing_mid_run_graphs_again_and_equals_eager,
    a_head_reinitialised_mid_run_graphs_again_and_equals_eager,
    vocabulary_growth_mid_run_graphs_again_and_equals_eager,
);
