//! Every replay is traced (emulated graphs): the step closure runs at every step, its
//! ops are matched against the graph, and a step that differs runs eagerly from the
//! first difference. So training equals plain eager code when the world of the closure
//! changes after a capture: a host value (a loss weight), a host branch among tensors
//! of one shape (which head, which view of one tensor), a host coin, state inside an
//! `FnMut` closure, a constant replaced while two graphs read it. Each case also runs
//! with replays untraced (`Untraced`), which must diverge from plain code: the trace is
//! what catches it. And each runs with traces that stop at the first difference and run
//! the step again from its start, with a clone of the closure taken before the trace
//! (`RunsAgain`, as the fusion stack's traces do), which must train as plain code too.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use burn::module::AutodiffModule;
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::ElementConversion;
use burn_graph_capture::optim::CapturableAdam;
use burn_graph_capture::{
    EmulatedGraphs, FallbackReason, GraphTrainer, GraphTrainerConfig, RunsAgain, StepChange,
    StepMode, Untraced,
};
use lstm_example::train::parameter_bits;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use crate::common::models::{D_IN, Regression, materialized};
use crate::common::{B, adam};

/// `D_IN -> 8`, then one of two heads `8 -> 1` of one shape.
#[derive(Module, Debug)]
struct TwoHeads<B: Backend> {
    body: Linear<B>,
    first: Linear<B>,
    second: Linear<B>,
}

impl<B: Backend> TwoHeads<B> {
    fn new(device: &B::Device) -> Self {
        materialized(Self {
            body: LinearConfig::new(D_IN, 8).init(device),
            first: LinearConfig::new(8, 1).init(device),
            second: LinearConfig::new(8, 1).init(device),
        })
    }

    fn loss(&self, batch: &Regression<B>, second: bool) -> Tensor<B, 1> {
        let hidden = self.body.forward(batch.x.clone()).tanh();
        let head = if second { &self.second } else { &self.first };
        (head.forward(hidden) - batch.y.clone())
            .powi_scalar(2)
            .mean()
    }
}

type Model = TwoHeads<B>;

/// One run: each step's loss and mode, the final parameters, and the trainer's counts.
struct Run {
    losses: Vec<u32>,
    params: Vec<Vec<u32>>,
    modes: Vec<StepMode>,
    replayed: u64,
    traced: u64,
    /// Steps whose trace stopped and ran again from the start.
    ran_again: u64,
}

const STEPS: usize = 40;

fn batch(step: usize, sizes: &[usize]) -> Regression<B> {
    Regression::new(step, sizes[step % sizes.len()], &Default::default())
}

/// Trains with `step`, made fresh by `make` (the world it reads made fresh too), on the
/// trainer over emulated graphs, or as plain eager code (`trainer` false). `sizes`: the
/// batch sizes, in turn.
fn run<F>(make: impl Fn() -> (Box<dyn Fn(usize)>, F), sizes: &[usize], trainer: bool) -> Run
where
    F: FnMut(&Model, &Regression<B>) -> Tensor<B, 1> + Clone + 'static,
{
    let device = Default::default();
    // Both runs start from one model (the calling test holds the generators).
    B::seed(&device, 42);
    let model = Model::new(&device);
    let (before, mut step) = make();
    let mut run = Run {
        losses: Vec::new(),
        params: Vec::new(),
        modes: Vec::new(),
        replayed: 0,
        traced: 0,
        ran_again: 0,
    };
    if !trainer {
        let (mut model, mut optimizer): (Model, CapturableAdam<B>) = (model, adam());
        for index in 0..STEPS {
            before(index);
            let loss = step(&model, &batch(index, sizes));
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(model, grads);
            run.losses.push(loss.into_scalar().elem::<f32>().to_bits());
        }
        run.params = parameter_bits(&model.valid());
        return run;
    }
    let _graphs = EmulatedGraphs::on();
    let mut trainer = GraphTrainer::new(model, adam(), step, GraphTrainerConfig::new());
    for index in 0..STEPS {
        before(index);
        let outcome = trainer.step(batch(index, sizes)).unwrap();
        run.losses
            .push(outcome.output.into_scalar().elem::<f32>().to_bits());
        run.modes.push(outcome.mode);
    }
    run.params = parameter_bits(&trainer.model().unwrap().valid());
    let report = trainer.report();
    (run.replayed, run.traced) = (report.modes.replayed, report.traces_matched);
    run.ran_again = report.traces_run_again;
    run
}

/// What a traced run shows besides training as plain code does.
enum Shows {
    /// A step that differed from its graph for such a change, and ran eagerly.
    Difference(fn(&StepChange) -> bool),
    /// No step that differed: the graphs took what changed (a constant copied into its
    /// pin).
    NoDifference,
}

/// Traced: equal to plain code, replays (each matched by a trace), and what `shows`
/// says. Untraced: unequal to plain code. Returns the traced run.
fn check<F>(make: impl Fn() -> (Box<dyn Fn(usize)>, F), sizes: &[usize], shows: Shows) -> Run
where
    F: FnMut(&Model, &Regression<B>) -> Tensor<B, 1> + Clone + 'static,
{
    let plain = run(&make, sizes, false);
    let traced = run(&make, sizes, true);
    assert_eq!(traced.losses, plain.losses, "losses: {:?}", traced.modes);
    assert_eq!(traced.params, plain.params, "parameters");
    assert!(
        traced.replayed >= 10,
        "{} replays: {:?}",
        traced.replayed,
        traced.modes
    );
    assert_eq!(traced.traced, traced.replayed, "every replay was traced");
    let differed = |change: fn(&StepChange) -> bool| {
        traced.modes.iter().any(|mode| {
            matches!(mode, StepMode::Eager(FallbackReason::GraphStale { change: c }) if change(c))
        })
    };
    match shows {
        Shows::Difference(change) => assert!(differed(change), "{:?}", traced.modes),
        Shows::NoDifference => assert!(!differed(|_| true), "{:?}", traced.modes),
    }
    let again = {
        let _again = RunsAgain::on();
        run(&make, sizes, true)
    };
    assert_eq!(
        again.losses, plain.losses,
        "run again, losses: {:?}",
        again.modes
    );
    assert_eq!(again.params, plain.params, "run again, parameters");
    assert_eq!(
        again.traced, again.replayed,
        "run again: every replay was traced"
    );
    assert_eq!(
        traced.ran_again, 0,
        "traces go on where stand-ins are filled"
    );
    if let Shows::Difference(_) = shows {
        assert!(again.ran_again > 0, "no step ran again: {:?}", again.modes);
    }
    assert_eq!(
        again
            .modes
            .iter()
            .filter(|mode| **mode == StepMode::Replayed)
            .count(),
        traced
            .modes
            .iter()
            .filter(|mode| **mode == StepMode::Replayed)
            .count(),
        "run again: the same steps replay as where the trace goes on"
    );
    let _untraced = Untraced::on();
    let untraced = run(&make, sizes, true);
    assert_ne!(
        (untraced.losses, untraced.params),
        (plain.losses, plain.params),
        "untraced replays train as plain code: the case shows nothing"
    );
    traced
}

fn host_values(change: &StepChange) -> bool {
    matches!(change, StepChange::HostValues { .. })
}

fn other_input(change: &StepChange) -> bool {
    matches!(change, StepChange::OtherInput { .. })
}

#[test]
fn a_host_value_changed_after_the_capture_is_traced() {
    let _rng = crate::common::rng::exclusive();
    check(
        || {
            let weight = Rc::new(Cell::new(1.0f32));
            let set = Rc::clone(&weight);
            let before: Box<dyn Fn(usize)> = Box::new(move |step| {
                if step == 15 {
                    set.set(3.0);
                }
            });
            (before, move |m: &Model, b: &Regression<B>| {
                m.loss(b, false) * weight.get()
            })
        },
        &[4],
        Shows::Difference(host_values),
    );
}

#[test]
fn a_branch_among_heads_of_one_shape_is_traced() {
    let _rng = crate::common::rng::exclusive();
    check(
        || {
            let second = Rc::new(Cell::new(false));
            let set = Rc::clone(&second);
            let before: Box<dyn Fn(usize)> = Box::new(move |step| set.set(step >= 15));
            (before, move |m: &Model, b: &Regression<B>| {
                m.loss(b, second.get())
            })
        },
        &[4],
        Shows::Difference(other_input),
    );
}

/// Both halves of the batch are sliced at every step (two views of one tensor with one
/// shape); a host branch picks which one the loss reads.
#[test]
fn a_branch_between_views_of_one_tensor_is_traced() {
    let _rng = crate::common::rng::exclusive();
    let traced = check(
        || {
            let half = Rc::new(Cell::new(0));
            let set = Rc::clone(&half);
            let before: Box<dyn Fn(usize)> = Box::new(move |step| set.set(usize::from(step >= 15)));
            (before, move |m: &Model, b: &Regression<B>| {
                let rows = b.x.dims()[0] / 2;
                let halves = [
                    b.x.clone().narrow(0, 0, rows),
                    b.x.clone().narrow(0, rows, rows),
                ];
                let hidden = m.body.forward(halves[half.get()].clone()).tanh();
                (m.first.forward(hidden) - b.y.clone().narrow(0, 0, rows))
                    .powi_scalar(2)
                    .mean()
            })
        },
        &[4],
        Shows::Difference(other_input),
    );
    // The other view's path has ops like the first's: the trace, which found no graph
    // for it, tells them apart, and it graphs beside the first.
    assert_eq!(
        traced.modes.last(),
        Some(&StepMode::Replayed),
        "{:?}",
        traced.modes
    );
}

#[test]
fn a_host_coin_picking_a_branch_is_traced() {
    let _rng = crate::common::rng::exclusive();
    check(
        || {
            let coin = RefCell::new(SmallRng::seed_from_u64(7));
            let before: Box<dyn Fn(usize)> = Box::new(|_| {});
            (before, move |m: &Model, b: &Regression<B>| {
                let forced = coin.borrow_mut().random_range(0.0..1.0f32) < 0.9;
                m.loss(b, !forced)
            })
        },
        &[4],
        Shows::Difference(other_input),
    );
}

#[test]
fn state_inside_an_fnmut_closure_is_traced() {
    let _rng = crate::common::rng::exclusive();
    check(
        || {
            let before: Box<dyn Fn(usize)> = Box::new(|_| {});
            let mut calls = 0;
            (before, move |m: &Model, b: &Regression<B>| {
                calls += 1;
                let weight = if calls > 15 { 2.0 } else { 1.0 };
                m.loss(b, false) * weight
            })
        },
        &[4],
        Shows::Difference(host_values),
    );
}

#[test]
fn a_transient_schedule_is_traced_and_graphs_once_it_settles() {
    let _rng = crate::common::rng::exclusive();
    check(
        || {
            let weight = Rc::new(Cell::new(2.0f32));
            let set = Rc::clone(&weight);
            // Annealed from 2 to 1 in steps of a quarter from step 8 on, then constant.
            let before: Box<dyn Fn(usize)> = Box::new(move |step| {
                if (8..=14).contains(&step) && step % 2 == 0 {
                    set.set(2.0 - 0.25 * (step - 6) as f32 / 2.0);
                }
            });
            (before, move |m: &Model, b: &Regression<B>| {
                m.loss(b, false) * weight.get()
            })
        },
        &[4],
        Shows::Difference(|change| {
            matches!(
                change,
                StepChange::HostValues { .. } | StepChange::OtherOp { .. }
            )
        }),
    );
}

/// Two graphs read the constant through pins; the trace of each copies the new
/// constant into its pin, so neither differs.
#[test]
fn a_constant_replaced_while_two_graphs_read_it_is_copied_into_their_pins() {
    let _rng = crate::common::rng::exclusive();
    check(
        || {
            let device = Default::default();
            let constant = Rc::new(RefCell::new(Tensor::<B, 1>::from_floats([0.5], &device)));
            let set = Rc::clone(&constant);
            let before: Box<dyn Fn(usize)> = Box::new(move |step| {
                if step == 21 {
                    *set.borrow_mut() = Tensor::from_floats([2.5], &Default::default());
                }
            });
            (before, move |m: &Model, b: &Regression<B>| {
                m.loss(b, false) * constant.borrow().clone()
            })
        },
        &[4, 5],
        Shows::NoDifference,
    );
}

/// A soft target update: the loop replaces the constant by a new tensor, computed from
/// the old one, before every step. Each trace copies it into the graph's pin, so every
/// step after warmup and the capture replays, and training equals plain code. The
/// loop's tensors keep their values: a pin is the graph's own buffer.
#[test]
fn a_constant_refreshed_before_every_step_replays_every_step() {
    let _rng = crate::common::rng::exclusive();
    let make = || {
        let device = Default::default();
        let constant = Rc::new(RefCell::new(Tensor::<B, 1>::from_floats([0.5], &device)));
        let history = Rc::new(RefCell::new(Vec::new()));
        let (set, seen) = (Rc::clone(&constant), Rc::clone(&history));
        let before: Box<dyn Fn(usize)> = Box::new(move |_| {
            let old = set.borrow().clone();
            let value = old.clone().into_scalar().elem::<f32>();
            seen.borrow_mut().push((old.clone(), value));
            *set.borrow_mut() = old * 0.9 + 0.1;
            for (tensor, value) in seen.borrow().iter() {
                assert_eq!(tensor.clone().into_scalar().elem::<f32>(), *value);
            }
        });
        (before, move |m: &Model, b: &Regression<B>| {
            m.loss(b, false) * constant.borrow().clone()
        })
    };
    let plain = run(make, &[4], false);
    let traced = run(make, &[4], true);
    assert_eq!(traced.losses, plain.losses, "losses: {:?}", traced.modes);
    assert_eq!(traced.params, plain.params, "parameters");
    assert!(
        traced.replayed as usize >= STEPS - 5,
        "{} replays: {:?}",
        traced.replayed,
        traced.modes
    );
    assert_eq!(traced.traced, traced.replayed, "every replay was traced");
}

/// A constant replaced by one laid out otherwise (a transposed view) cannot be copied
/// into its pin: kernels would read it otherwise. The step differs, runs eagerly, and
/// the shape captures again on the new constant.
#[test]
fn a_constant_laid_out_otherwise_is_a_difference() {
    let _rng = crate::common::rng::exclusive();
    check(
        || {
            let square =
                |values: [[f32; 2]; 2]| Tensor::<B, 2>::from_floats(values, &Default::default());
            let constant = Rc::new(RefCell::new(square([[0.5, 0.25], [0.125, 1.0]])));
            let (set, old) = (Rc::clone(&constant), RefCell::new(None));
            let before: Box<dyn Fn(usize)> = Box::new(move |step| {
                if step == 21 {
                    let new = square([[1.5, 0.5], [2.0, 0.75]]).transpose();
                    // The old constant stays held, so that untraced replays read it.
                    *old.borrow_mut() = Some(std::mem::replace(&mut *set.borrow_mut(), new));
                }
            });
            (before, move |m: &Model, b: &Regression<B>| {
                let weights = constant
                    .borrow()
                    .clone()
                    .matmul(Tensor::ones([2, 1], &Default::default()));
                m.loss(b, false) * weights.sum()
            })
        },
        &[4],
        Shows::Difference(other_input),
    );
}
