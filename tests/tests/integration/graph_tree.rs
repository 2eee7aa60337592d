//! Several graphs per batch shape, chosen by the trace. A host branch (a coin picking a
//! head, LayerDrop picking which layers run) gives one shape several paths; each path
//! gets a graph of its own once it recurs, and every later step replays the graph of the
//! path it takes. Training equals plain eager code bit for bit throughout, and every
//! replay follows a trace that matched it.

use std::cell::RefCell;
use std::rc::Rc;

use burn::module::AutodiffModule;
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::ElementConversion;
use burn_graph_capture::optim::CapturableAdam;
use burn_graph_capture::{
    EmulatedGraphs, FallbackReason, GraphTrainer, GraphTrainerConfig, StepMode,
};
use lstm_example::train::parameter_bits;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use crate::common::models::{D_IN, Regression, materialized};
use crate::common::{B, adam};

/// `D_IN -> 8`, two hidden layers `8 -> 8` that a step may skip, and two heads `8 -> 1`
/// of one shape that a step picks between.
#[derive(Module, Debug)]
struct Branchy<B: Backend> {
    body: Linear<B>,
    first: Linear<B>,
    second: Linear<B>,
    heads: [Linear<B>; 2],
}

/// Which parts of [`Branchy`] a step runs: a path of the step closure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Path {
    first: bool,
    second: bool,
    head: usize,
}

impl<B: Backend> Branchy<B> {
    fn new(device: &B::Device) -> Self {
        let layer = |from, to| LinearConfig::new(from, to).init(device);
        materialized(Self {
            body: layer(D_IN, 8),
            first: layer(8, 8),
            second: layer(8, 8),
            heads: [layer(8, 1), layer(8, 1)],
        })
    }

    fn loss(&self, batch: &Regression<B>, path: Path) -> Tensor<B, 1> {
        let mut hidden = self.body.forward(batch.x.clone()).tanh();
        if path.first {
            hidden = self.first.forward(hidden).tanh();
        }
        if path.second {
            hidden = self.second.forward(hidden).tanh();
        }
        (self.heads[path.head].forward(hidden) - batch.y.clone())
            .powi_scalar(2)
            .mean()
    }
}

type Model = Branchy<B>;

/// Draws a step's path on the host.
type Draw = fn(&mut SmallRng) -> Path;

/// One run: each step's loss, path and mode, and the final parameters.
struct Run {
    losses: Vec<u32>,
    paths: Vec<Path>,
    modes: Vec<StepMode>,
    params: Vec<Vec<u32>>,
    traced: u64,
}

/// Trains `steps` steps whose paths `draw` picks from a host generator seeded alike in
/// both runs: on the trainer over emulated graphs, or as plain eager code.
fn run(draw: fn() -> Draw, steps: usize, trainer: bool) -> Run {
    let device = Default::default();
    B::seed(&device, 42);
    let model = Model::new(&device);
    let paths = Rc::new(RefCell::new(Vec::new()));
    let (seen, draw, mut coin) = (Rc::clone(&paths), draw(), SmallRng::seed_from_u64(11));
    let step = move |m: &Model, b: &Regression<B>| {
        let path = draw(&mut coin);
        seen.borrow_mut().push(path);
        m.loss(b, path)
    };
    let batch = |index: usize| Regression::new(index, 4, &Default::default());
    let (mut losses, mut modes) = (Vec::new(), Vec::new());
    let (params, traced) = if trainer {
        let _graphs = EmulatedGraphs::on();
        let mut trainer = GraphTrainer::new(model, adam(), step, GraphTrainerConfig::new());
        for index in 0..steps {
            let outcome = trainer.step(batch(index)).unwrap();
            losses.push(outcome.output.into_scalar().elem::<f32>().to_bits());
            modes.push(outcome.mode);
        }
        let report = trainer.report();
        assert_eq!(
            report.traces_matched, report.modes.replayed,
            "every replay was traced"
        );
        let params = parameter_bits(&trainer.model().unwrap().valid());
        (params, report.traces_matched)
    } else {
        let (mut model, mut optimizer, mut step): (Model, CapturableAdam<B>, _) =
            (model, adam(), step);
        for index in 0..steps {
            let loss = step(&model, &batch(index));
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(model, grads);
            losses.push(loss.into_scalar().elem::<f32>().to_bits());
        }
        (parameter_bits(&model.valid()), 0)
    };
    let paths = paths.borrow().clone();
    Run {
        losses,
        paths,
        modes,
        params,
        traced,
    }
}

/// Equal to plain code; the last `settled` steps all replay (or are the periodic check
/// of a graph against an eager step, `verify_every`), and between them take every path
/// in `expected`.
fn check(draw: fn() -> Draw, steps: usize, settled: usize, expected: &[Path]) {
    let plain = run(draw, steps, false);
    let traced = run(draw, steps, true);
    let replayed = traced
        .modes
        .iter()
        .filter(|mode| **mode == StepMode::Replayed);
    let settled_from = traced
        .modes
        .iter()
        .rposition(|mode| {
            !matches!(
                mode,
                StepMode::Replayed | StepMode::Eager(FallbackReason::ReplayCheck)
            )
        })
        .map_or(0, |step| step + 1);
    println!(
        "{} of {steps} steps replayed; every step from {settled_from} on replays",
        replayed.count()
    );
    assert_eq!(traced.paths, plain.paths, "both runs drew the same paths");
    assert_eq!(traced.losses, plain.losses, "losses: {:?}", traced.modes);
    assert_eq!(traced.params, plain.params, "parameters");
    let tail = steps - settled;
    let late: Vec<_> = traced.modes[tail..]
        .iter()
        .zip(&traced.paths[tail..])
        .filter(|(mode, _)| {
            !matches!(
                mode,
                StepMode::Replayed | StepMode::Eager(FallbackReason::ReplayCheck)
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "{} of the last {settled} steps did not replay: {late:?}",
        late.len()
    );
    let mut taken: Vec<Path> = traced.paths[tail..].to_vec();
    taken.sort();
    taken.dedup();
    assert_eq!(taken, expected, "paths replayed at the end");
    assert!(traced.traced >= settled as u64);
}

const HEAD: Path = Path {
    first: true,
    second: true,
    head: 0,
};

#[test]
fn both_outcomes_of_a_host_coin_replay() {
    let _rng = crate::common::rng::exclusive();
    let coin = || -> Draw {
        |rng: &mut SmallRng| Path {
            head: usize::from(rng.random_range(0.0..1.0f32) >= 0.7),
            ..HEAD
        }
    };
    check(coin, 160, 60, &[HEAD, Path { head: 1, ..HEAD }]);
}

#[test]
fn the_four_choices_of_layer_drop_replay() {
    let _rng = crate::common::rng::exclusive();
    let layer_drop = || -> Draw {
        |rng: &mut SmallRng| Path {
            first: rng.random_range(0.0..1.0f32) >= 0.5,
            second: rng.random_range(0.0..1.0f32) >= 0.5,
            head: 0,
        }
    };
    let choices: Vec<Path> = [(false, false), (false, true), (true, false), (true, true)]
        .map(|(first, second)| Path {
            first,
            second,
            head: 0,
        })
        .to_vec();
    check(layer_drop, 240, 60, &choices);
}
