//! Issue 27 on the CPU: what the trainer does when the world of the step changes.
//! Structure changes through `put_model` (a parameter resized under its id, a head
//! re-initialised, a layer unfrozen) re-fit the optimizer state and warm up again;
//! warmup that meets work done once (a lazily built constant, an anchor cloned from the
//! initial model) starts over instead of disabling the shape; shapes without a graph
//! hold no graph slot; trainers built from clones of one model share only until their
//! first updates part them. Each trains as plain code with the same optimizer does.

use std::cell::RefCell;
use std::collections::BTreeMap;

use burn::backend::Flex;
use burn::module::{Module, Param, ParamId};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::optim::{CapturableAdam, CapturableOptimizer, StateSlot};
use burn_graph_capture::{
    FallbackReason, GraphCapture, GraphTrainer, GraphTrainerConfig, StepError, StepMode,
};
use lstm_example::train::{load_bytes, parameter_bits, to_bytes};

use crate::common::models::{D_IN, Regression, materialized};
use crate::common::{B, adam};

/// An MLP whose hidden width can grow: `D_IN -> hidden -> 1`.
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    first: Linear<B>,
    head: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(hidden: usize, device: &B::Device) -> Self {
        materialized(Self {
            first: LinearConfig::new(D_IN, hidden).init(device),
            head: LinearConfig::new(hidden, 1).init(device),
        })
    }

    fn loss(&self, batch: &Regression<B>) -> Tensor<B, 1> {
        let hidden = self.first.forward(batch.x.clone()).tanh();
        (self.head.forward(hidden) - batch.y.clone())
            .powi_scalar(2)
            .mean()
    }
}

type LossFn = fn(&Mlp<B>, &Regression<B>) -> Tensor<B, 1>;

fn batch(step: usize) -> Regression<B> {
    Regression::new(step, 6, &Default::default())
}

fn trainer(model: Mlp<B>) -> GraphTrainer<Flex, Mlp<B>, CapturableAdam<B>, Regression<B>, LossFn> {
    GraphTrainer::new(
        model,
        adam(),
        Mlp::loss as LossFn,
        GraphTrainerConfig::new(),
    )
}

/// Pads a parameter's last dimension (`dim`) with `extra` zeros, keeping its id: what
/// growing a layer or a vocabulary with `Param::map` does.
fn grow<const D: usize>(
    param: Param<Tensor<B, D>>,
    dim: usize,
    extra: usize,
) -> Param<Tensor<B, D>> {
    param.map(|tensor| {
        let mut dims = tensor.dims();
        dims[dim] = extra;
        let zeros = Tensor::zeros(dims, &tensor.device());
        Tensor::from_inner(Tensor::cat(vec![tensor.inner(), zeros], dim)).require_grad()
    })
}

/// `model` with `extra` more hidden units, under the same parameter ids.
fn widened(model: Mlp<B>, extra: usize) -> Mlp<B> {
    let Mlp {
        mut first,
        mut head,
    } = model;
    first.weight = grow(first.weight, 1, extra);
    first.bias = first.bias.map(|bias| grow(bias, 0, extra));
    head.weight = grow(head.weight, 0, extra);
    Mlp { first, head }
}

/// Each state tensor's number of elements, by parameter id and slot.
fn state_sizes(optimizer: &mut CapturableAdam<B>) -> BTreeMap<(ParamId, usize), usize> {
    let mut sizes = BTreeMap::new();
    CapturableOptimizer::<Mlp<B>, B>::visit_state(optimizer, &mut |slot, tensor| {
        if let StateSlot::Param { id, index } = slot {
            sizes.insert((id, index), tensor.shape().num_elements());
        }
    });
    sizes
}

/// `steps` plain optimizer steps from `start`, the batches numbered from `first`.
fn plain_steps(
    model: Mlp<B>,
    optimizer: &mut CapturableAdam<B>,
    first: usize,
    steps: usize,
) -> (Vec<u32>, Mlp<B>) {
    let mut model = model;
    let mut losses = Vec::new();
    for step in first..first + steps {
        let loss = model.loss(&batch(step));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(model, grads);
        losses.push(loss.into_scalar().to_bits());
    }
    (losses, model)
}

fn trainer_steps(
    trainer: &mut GraphTrainer<Flex, Mlp<B>, CapturableAdam<B>, Regression<B>, LossFn>,
    first: usize,
    steps: usize,
) -> (Vec<u32>, Vec<StepMode>) {
    (first..first + steps)
        .map(|step| {
            let outcome = trainer.step(batch(step)).unwrap();
            (outcome.output.into_scalar().to_bits(), outcome.mode)
        })
        .unzip()
}

fn warmup_then_no_graphs(modes: &[StepMode]) {
    let warmup = GraphTrainerConfig::new().warmup_steps;
    for (step, mode) in modes.iter().enumerate() {
        let expected = if step < warmup {
            FallbackReason::Warmup
        } else {
            FallbackReason::NoHardwareGraphs
        };
        assert_eq!(*mode, StepMode::Eager(expected), "step {step} of {modes:?}");
    }
}

/// A first warmup step, a second that restarted the warmup for a reason of `kind`
/// (counting as its first step), the rest of the warmup, then steps that would graph on
/// a GPU.
fn settled_after_a_restart(modes: &[StepMode], kind: &str) {
    assert_eq!(modes[0], StepMode::Eager(FallbackReason::Warmup));
    assert!(
        matches!(&modes[1], StepMode::Eager(reason) if reason.kind() == kind),
        "{modes:?}"
    );
    let warmup = GraphTrainerConfig::new().warmup_steps;
    let rest = warmup - 1;
    for mode in &modes[2..2 + rest] {
        assert_eq!(*mode, StepMode::Eager(FallbackReason::Warmup), "{modes:?}");
    }
    for mode in &modes[2 + rest..] {
        assert_eq!(
            *mode,
            StepMode::Eager(FallbackReason::NoHardwareGraphs),
            "{modes:?}"
        );
    }
}

/// Trains 5 steps, changes the model with `change`, puts it in, trains 6 more; the
/// same by hand, where the optimizer state is made to fit the changed model as
/// `CapturableOptimizer::fit_state` documents. Returns the trainer's parts.
fn change_mid_run(change: impl Fn(Mlp<B>) -> Mlp<B>) -> (Mlp<B>, CapturableAdam<B>) {
    let start = Mlp::<B>::new(4, &Default::default());
    let mut graphed = trainer(start.clone());
    let (before, _) = trainer_steps(&mut graphed, 0, 5);
    let changed = change(graphed.take_model().unwrap());
    graphed.put_model(changed);
    let (after, modes) = trainer_steps(&mut graphed, 5, 6);
    warmup_then_no_graphs(&modes);

    let mut optimizer = adam();
    optimizer.init_state(&start);
    let (plain_before, model) = plain_steps(start, &mut optimizer, 0, 5);
    let changed = change(model);
    optimizer.fit_state(&changed);
    let (plain_after, model) = plain_steps(changed, &mut optimizer, 5, 6);
    assert_eq!(before, plain_before);
    assert_eq!(after, plain_after);
    assert!(parameter_bits(graphed.model().unwrap()) == parameter_bits(&model));
    graphed.into_parts()
}

#[test]
fn a_parameter_resized_under_its_id_gets_fresh_state_of_its_new_size() {
    let _rng = crate::common::rng::shared();
    let (model, mut optimizer) = change_mid_run(|model| widened(model, 2));
    let sizes = state_sizes(&mut optimizer);
    let params = [
        (
            model.first.weight.id,
            model.first.weight.val().shape().num_elements(),
        ),
        (model.first.bias.as_ref().unwrap().id, 6),
        (model.head.weight.id, 6),
    ];
    assert_eq!(params[0].1, D_IN * 6);
    for (id, size) in params {
        assert_eq!((sizes[&(id, 0)], sizes[&(id, 1)]), (size, size), "{id}");
    }
    assert_eq!(sizes.len(), 4 * 2, "no state of another size is left");
}

#[test]
fn a_checkpoint_of_another_size_loads_and_trains() {
    let _rng = crate::common::rng::shared();
    let (model, _) = change_mid_run(|model| {
        let device = Default::default();
        load_bytes(
            Mlp::<B>::new(7, &device),
            to_bytes(widened(model, 3)),
            &device,
        )
    });
    assert_eq!(model.head.weight.dims(), [7, 1]);
}

#[test]
fn a_head_reinitialised_at_the_same_size_trains_and_the_run_resumes() {
    let _rng = crate::common::rng::shared();
    let head = materialized(LinearConfig::new(4, 1).init::<B>(&Default::default()));
    let head_id = head.weight.id;
    let change = move |model: Mlp<B>| Mlp {
        first: model.first,
        head: head.clone(),
    };
    let (_, mut optimizer) = change_mid_run(change.clone());
    let ids: Vec<ParamId> = state_sizes(&mut optimizer)
        .keys()
        .map(|(id, _)| *id)
        .collect();
    assert!(ids.contains(&head_id), "the new head has state");
    assert_eq!(
        ids.len(),
        4 * 2,
        "four parameters' two moments: the old head's are gone"
    );

    // Resuming: the parts build a new trainer, whose steps are not refused.
    let mut resumed = trainer(Mlp::new(4, &Default::default()));
    let taken = resumed.take_model().unwrap();
    resumed.put_model(change(taken));
    let (model, optimizer) = resumed.into_parts();
    let mut again = GraphTrainer::new(
        model,
        optimizer,
        Mlp::loss as LossFn,
        GraphTrainerConfig::new(),
    );
    assert!(again.step(batch(0)).is_ok());
}

#[test]
fn unfreezing_a_layer_gives_it_state_and_trains_it() {
    let _rng = crate::common::rng::shared();
    let start = Mlp::<B>::new(4, &Default::default());
    let frozen = Mlp {
        first: start.first.clone().no_grad(),
        head: start.head.clone(),
    };
    let mut graphed = trainer(frozen.clone());
    let (_, modes) = trainer_steps(&mut graphed, 0, 4);
    warmup_then_no_graphs(&modes);
    let first_before = graphed.model().unwrap().first.weight.val().to_data();
    let model = graphed.take_model().unwrap();
    let unfrozen = Mlp {
        first: Linear {
            weight: model.first.weight.set_require_grad(true),
            bias: model.first.bias.map(|bias| bias.set_require_grad(true)),
        },
        head: model.head,
    };
    graphed.put_model(unfrozen);
    let (_, modes) = trainer_steps(&mut graphed, 4, 5);
    warmup_then_no_graphs(&modes);
    let first_after = graphed.model().unwrap().first.weight.val().to_data();
    assert_ne!(first_before, first_after, "the unfrozen layer trains");
    let (_, mut optimizer) = graphed.into_parts();
    assert_eq!(
        state_sizes(&mut optimizer).len(),
        4 * 2,
        "every parameter has state"
    );
}

#[test]
fn an_optimizer_that_cannot_refit_refuses_the_step_and_keeps_the_model() {
    let _rng = crate::common::rng::shared();
    /// Adam without `fit_state`: the trait's default only adds state.
    #[derive(Clone)]
    struct NoRefit(CapturableAdam<B>);
    impl CapturableOptimizer<Mlp<B>, B> for NoRefit {
        type Record = <CapturableAdam<B> as CapturableOptimizer<Mlp<B>, B>>::Record;
        fn init_state(&mut self, module: &Mlp<B>) {
            self.0.init_state(module);
        }
        fn step(&mut self, module: Mlp<B>, grads: GradientsParams) -> Mlp<B> {
            self.0.step(module, grads)
        }
        fn set_lr(&mut self, lr: f64) {
            self.0.set_lr(lr);
        }
        fn visit_state(
            &mut self,
            visitor: &mut dyn FnMut(StateSlot, &mut Tensor<GraphCapture<Flex>, 1>),
        ) {
            CapturableOptimizer::<Mlp<B>, B>::visit_state(&mut self.0, visitor);
        }
        fn to_record(&self) -> Self::Record {
            CapturableOptimizer::<Mlp<B>, B>::to_record(&self.0)
        }
        fn load_record(self, record: Self::Record) -> Self {
            Self(CapturableOptimizer::<Mlp<B>, B>::load_record(
                self.0, record,
            ))
        }
    }
    let mut graphed = GraphTrainer::new(
        Mlp::<B>::new(4, &Default::default()),
        NoRefit(adam()),
        Mlp::loss as LossFn,
        GraphTrainerConfig::new(),
    );
    graphed.step(batch(0)).unwrap();
    let wide = widened(graphed.take_model().unwrap(), 2);
    let bits = parameter_bits(&wide);
    graphed.put_model(wide);
    assert!(matches!(
        graphed.step(batch(1)),
        Err(StepError::OptimizerStateMismatch { misshapen: 3, .. })
    ));
    assert!(
        parameter_bits(graphed.model().unwrap()) == bits,
        "nothing was taken out"
    );
}

/// A step closure whose first call builds a constant it reads from then on (a mask
/// or positional encoding cached on first use).
#[test]
fn a_constant_built_lazily_inside_the_step_settles_after_a_restart() {
    let _rng = crate::common::rng::shared();
    let cache: RefCell<Option<Tensor<B, 2>>> = RefCell::new(None);
    let step_fn = |model: &Mlp<B>, batch: &Regression<B>| {
        let mask = cache
            .borrow_mut()
            .get_or_insert_with(|| Tensor::<B, 2>::ones([6, 1], &Default::default()) * 0.5)
            .clone();
        (model.first.forward(batch.x.clone()).tanh().sum_dim(1) * mask - batch.y.clone())
            .powi_scalar(2)
            .mean()
    };
    let mut graphed = GraphTrainer::new(
        Mlp::<B>::new(4, &Default::default()),
        adam(),
        step_fn,
        GraphTrainerConfig::new(),
    );
    let modes: Vec<StepMode> = (0..7)
        .map(|step| graphed.step(batch(step)).unwrap().mode)
        .collect();
    settled_after_a_restart(&modes, "NonStaticControlFlow");
}

/// An anchor cloned from the initial model before the trainer is built (L2-SP): in the
/// first step its buffers are the trainer's own, later they are a constant.
#[test]
fn an_anchor_cloned_from_the_initial_model_is_a_constant() {
    let _rng = crate::common::rng::shared();
    let start = Mlp::<B>::new(4, &Default::default());
    let anchor = start.clone();
    let step_fn = move |model: &Mlp<B>, batch: &Regression<B>| {
        let drift = (model.first.weight.val() - anchor.first.weight.val().detach())
            .powi_scalar(2)
            .sum();
        model.loss(batch) + drift * 0.1
    };
    let mut graphed = GraphTrainer::new(start, adam(), step_fn, GraphTrainerConfig::new());
    let modes: Vec<StepMode> = (0..7)
        .map(|step| graphed.step(batch(step)).unwrap().mode)
        .collect();
    settled_after_a_restart(&modes, "UnlistedInput");
}

/// A ragged last batch, seen once, before the frequent shape: with one graph slot, the
/// frequent shape still warms up (on a GPU: graphs).
#[test]
fn a_shape_seen_once_does_not_block_a_frequent_one() {
    let _rng = crate::common::rng::shared();
    let config = GraphTrainerConfig::new()
        .with_warmup_steps(1)
        .with_max_graphs(1);
    let mut graphed = GraphTrainer::new(
        Mlp::<B>::new(4, &Default::default()),
        adam(),
        Mlp::loss as LossFn,
        config,
    );
    let device = Default::default();
    let ragged = graphed.step(Regression::new(0, 3, &device)).unwrap().mode;
    assert_eq!(ragged, StepMode::Eager(FallbackReason::Warmup));
    let modes: Vec<StepMode> = (1..5)
        .map(|step| {
            graphed
                .step(Regression::new(step, 6, &device))
                .unwrap()
                .mode
        })
        .collect();
    assert_eq!(modes[0], StepMode::Eager(FallbackReason::Warmup));
    for mode in &modes[1..] {
        assert_eq!(*mode, StepMode::Eager(FallbackReason::NoHardwareGraphs));
    }
    assert!(!graphed.report().fallbacks.contains_key("GraphCacheFull"));
}

/// Trains two trainers over clones of `start`, with `optimizers`: the first trainer's
/// first step finds the share, then each warms up with no share left, and both train as
/// plain code does.
fn shared_until_the_first_update(start: Mlp<B>, optimizers: [CapturableAdam<B>; 2]) {
    let [mut first, mut second] = optimizers.map(|optimizer| {
        GraphTrainer::new(
            start.clone(),
            optimizer,
            Mlp::loss as LossFn,
            GraphTrainerConfig::new(),
        )
    });
    let a = first.step(batch(0)).unwrap().mode;
    assert_eq!(
        a,
        StepMode::Eager(FallbackReason::SharedWithTrainer(second.id()))
    );
    let (_, modes) = trainer_steps(&mut second, 0, 5);
    warmup_then_no_graphs(&modes);
    let (_, modes) = trainer_steps(&mut first, 1, 5);
    warmup_then_no_graphs(&modes);
    assert_eq!(first.report().shared_with, None);
    assert_eq!(second.report().shared_with, None);

    // Both trained as plain code does.
    for (graphed, steps) in [(&first, 0..6), (&second, 0..5)] {
        let mut optimizer = adam();
        optimizer.init_state(&start);
        let (_, plain) = plain_steps(start.clone(), &mut optimizer, 0, steps.len());
        assert!(parameter_bits(graphed.model().unwrap()) == parameter_bits(&plain));
    }
}

/// Two trainers built from clones of one model hold the same buffers until one of them
/// updates: only then do they part, and neither shares any more.
#[test]
fn trainers_built_from_clones_share_until_their_first_update() {
    let _rng = crate::common::rng::shared();
    shared_until_the_first_update(Mlp::new(4, &Default::default()), [adam(), adam()]);
}

/// Two trainers over clones of one model whose first layer is frozen, given clones of
/// one optimizer: the frozen layer and the learning-rate tensor stay one buffer for
/// good, but steps only read them (and pinning copies them), so they share only until
/// their first updates part the trainable parameters.
#[test]
fn a_frozen_backbone_and_a_cloned_optimizer_share_only_until_the_first_update() {
    let _rng = crate::common::rng::shared();
    let start = Mlp::<B>::new(4, &Default::default());
    let start = Mlp {
        first: start.first.no_grad(),
        head: start.head,
    };
    let optimizer = adam();
    shared_until_the_first_update(start, [optimizer.clone(), optimizer]);
}

#[test]
fn a_shape_eager_during_a_transient_schedule_graphs_once_it_settles() {
    let _rng = crate::common::rng::shared();
    // A loss weight annealed over the first 12 steps, constant after: every warmup step
    // differs from the one before until then, and the shape is made eager.
    let weight = |step: usize| 1.0 + 0.1 * step.min(12) as f32;
    let current = std::rc::Rc::new(std::cell::Cell::new(0_usize));
    let reading = std::rc::Rc::clone(&current);
    let weighted = move |model: &Mlp<B>, batch: &Regression<B>| {
        model.loss(batch).mul_scalar(weight(reading.get()))
    };
    let start = Mlp::<B>::new(4, &Default::default());
    let config = GraphTrainerConfig::new().with_rewarm_after(4);
    let mut graphed = GraphTrainer::new(start.clone(), adam(), weighted, config);
    let steps = 40;
    let mut losses = Vec::new();
    let mut modes = Vec::new();
    for step in 0..steps {
        current.set(step);
        let outcome = graphed.step(batch(step)).unwrap();
        losses.push(outcome.output.into_scalar().to_bits());
        modes.push(outcome.mode);
    }
    let kinds: Vec<&str> = modes.iter().map(StepMode::kind).collect();
    let made_eager = |mode: &StepMode| {
        matches!(
            mode,
            StepMode::Eager(FallbackReason::NonStaticControlFlow { .. })
        )
    };
    assert!(
        modes[..12].iter().any(made_eager),
        "the schedule made the shape eager: {kinds:?}"
    );
    assert!(
        modes[steps - 10..]
            .iter()
            .all(|mode| *mode == StepMode::Eager(FallbackReason::NoHardwareGraphs)),
        "once settled, the shape is ready for a graph again: {modes:?}"
    );
    assert!(graphed.report().rewarms >= 1, "{:?}", graphed.report());

    let mut optimizer = adam();
    optimizer.init_state(&start);
    let mut model = start;
    let mut plain = Vec::new();
    for step in 0..steps {
        let loss = model.loss(&batch(step)).mul_scalar(weight(step));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(model, grads);
        plain.push(loss.into_scalar().to_bits());
    }
    assert_eq!(losses, plain);
    assert!(parameter_bits(graphed.model().unwrap()) == parameter_bits(&model));
}
