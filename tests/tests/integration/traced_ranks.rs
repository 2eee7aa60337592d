//! Data-parallel ranks replay traced steps (emulated graphs): each rank's step closure
//! runs at every step and is matched against its graph, and before the gradient average
//! the ranks agree whether every rank's trace still matches, so that all of them replay
//! (the average inside their graphs) or all go on eagerly from there (the average run
//! eagerly by all). A host value or a host coin that changes on one rank after the
//! capture, in the step closure or in the optimizer after the average, then trains as
//! eager data-parallel steps do, bit for bit, on every rank; with replays untraced it
//! does not. So it does with traces that stop at the first difference and run the step
//! again from its start on every rank (`RunsAgain`, the fusion stack's way), the rank
//! that differed telling its peers before it leaves its closure, and the optimizer's
//! host state (its count of updates) put back as it was before the trace.

use burn::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn::optim::{GradientsParams, LearningRate};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use burn_graph_capture::optim::{CapturableAdam, CapturableOptimizer, StateSlot};
use burn_graph_capture::{
    DataParallelConfig, EmulatedGraphs, FallbackReason, GraphTrainer, GraphTrainerConfig,
    RunsAgain, StepChange, StepMode, Untraced,
};
use lstm_example::train::parameter_bits;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::common::{B, Model, adam, loss, model, model_bytes};
use crate::data_parallel::{on_ranks, shard};

const WORLD: usize = 2;
const STEPS: usize = 48;

/// How the ranks run their steps.
#[derive(Clone, Copy, PartialEq)]
enum Steps {
    /// Every step eager (Flex without graphs): the reference.
    Eager,
    /// Emulated graphs, replays traced.
    Traced,
    /// Emulated graphs, replays untraced.
    Untraced,
    /// Emulated graphs, replays traced, a differing step run again from its start.
    RunAgain,
}

/// The backend under autodiff.
type Inner = <B as AutodiffBackend>::InnerBackend;

/// A host value of rank `r` at its step `s`.
type HostValue = fn(usize, usize) -> f32;

/// Adam, then every parameter scaled by a host factor that the optimizer reads at each
/// update (a decay schedule): ops after the gradient average whose host value may change.
#[derive(Clone)]
struct DecayedAdam {
    adam: CapturableAdam<B>,
    decay: HostValue,
    rank: usize,
    updates: usize,
}

/// Scales every parameter.
struct Scale(f32);

impl ModuleMapper<B> for Scale {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let scaled = Tensor::from_inner(tensor.inner().mul_scalar(self.0)).require_grad();
        Param::from_mapped_value(id, scaled, mapper)
    }
}

impl CapturableOptimizer<Model, B> for DecayedAdam {
    type Record = <CapturableAdam<B> as CapturableOptimizer<Model, B>>::Record;

    fn init_state(&mut self, module: &Model) {
        self.adam.init_state(module);
    }

    fn step(&mut self, module: Model, grads: GradientsParams) -> Model {
        let factor = (self.decay)(self.rank, self.updates);
        self.updates += 1;
        Module::map(self.adam.step(module, grads), &mut Scale(factor))
    }

    fn set_lr(&mut self, lr: LearningRate) {
        CapturableOptimizer::<Model, B>::set_lr(&mut self.adam, lr);
    }

    fn visit_state(&mut self, visitor: &mut dyn FnMut(StateSlot, &mut Tensor<Inner, 1>)) {
        CapturableOptimizer::<Model, B>::visit_state(&mut self.adam, visitor);
    }

    fn to_record(&self) -> Self::Record {
        CapturableOptimizer::<Model, B>::to_record(&self.adam)
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self {
            adam: CapturableOptimizer::<Model, B>::load_record(self.adam, record),
            ..self
        }
    }
}

/// One rank's run: its losses and final parameters (bits), and what its steps did.
struct RankRun {
    losses: Vec<u32>,
    params: Vec<Vec<u32>>,
    modes: Vec<StepMode>,
    replayed: u64,
    traced: u64,
    ran_again: u64,
}

/// Trains `WORLD` ranks from the model in `bytes` for `STEPS` steps, rank `r`'s loss
/// scaled at its step `s` by `weight(r, s)`, a host value its closure reads (and counts
/// its own calls for), and its parameters after each update by `decay(r, s)`, which its
/// optimizer reads (counting its own updates).
fn run(steps: Steps, bytes: &[u8], weight: HostValue, decay: HostValue) -> Vec<RankRun> {
    let runs = on_ranks(WORLD, &DataParallelConfig::new(), |member| {
        let rank = member.rank();
        let _graphs = (steps != Steps::Eager).then(EmulatedGraphs::on);
        let _untraced = (steps == Steps::Untraced).then(Untraced::on);
        let _again = (steps == Steps::RunAgain).then(RunsAgain::on);
        let mut count = 0;
        let step_fn = move |model: &crate::common::Model, batch: &lstm_example::Batch<_>| {
            let scale = weight(rank, count);
            count += 1;
            loss(model, batch).mul_scalar(scale)
        };
        let mut trainer = GraphTrainer::data_parallel(
            model(bytes),
            DecayedAdam {
                adam: adam(),
                decay,
                rank,
                updates: 0,
            },
            step_fn,
            GraphTrainerConfig::new(),
            member,
        )
        .unwrap();
        let mut run = RankRun {
            losses: Vec::new(),
            params: Vec::new(),
            modes: Vec::new(),
            replayed: 0,
            traced: 0,
            ran_again: 0,
        };
        for step in 0..STEPS {
            let outcome = trainer.step(shard(step, rank, WORLD)).unwrap();
            run.losses
                .push(outcome.output.into_scalar().elem::<f32>().to_bits());
            run.modes.push(outcome.mode);
        }
        run.params = parameter_bits(&trainer.model().unwrap().valid());
        let report = trainer.report();
        (run.replayed, run.traced) = (report.modes.replayed, report.traces_matched);
        run.ran_again = report.traces_run_again;
        run
    });
    runs.into_iter().map(Result::unwrap).collect()
}

/// Whether every rank trained as the reference's did, bit for bit.
fn same(runs: &[RankRun], reference: &[RankRun]) -> bool {
    runs.iter()
        .zip(reference)
        .all(|(run, eager)| run.losses == eager.losses && run.params == eager.params)
}

/// The traced run equals the eager one on every rank, replays (each after a matched
/// trace), and the untraced run does not equal it.
fn check(weight: HostValue, decay: HostValue) -> Vec<RankRun> {
    let bytes = model_bytes();
    let eager = run(Steps::Eager, &bytes, weight, decay);
    let traced = run(Steps::Traced, &bytes, weight, decay);
    for (rank, run) in traced.iter().enumerate() {
        eprintln!(
            "rank {rank}: {} replays, {} traces matched, of {STEPS} steps",
            run.replayed, run.traced
        );
        assert!(run.replayed > 0, "rank {rank} never replayed");
        assert_eq!(run.replayed, run.traced, "rank {rank} replayed untraced");
    }
    for (rank, (run, eager)) in traced.iter().zip(&eager).enumerate() {
        let first = run
            .losses
            .iter()
            .zip(&eager.losses)
            .position(|(a, b)| a != b);
        if let Some(step) = first {
            for (index, mode) in run.modes.iter().enumerate() {
                eprintln!("rank {rank} step {index}: {mode:?}");
            }
            eprintln!(
                "rank {rank}: loss first differs at step {step}; modes from there: {:?}",
                &run.modes[step.saturating_sub(2)..(step + 3).min(STEPS)]
            );
        }
    }
    assert!(same(&traced, &eager), "traced ranks differ from eager ones");
    let again = run(Steps::RunAgain, &bytes, weight, decay);
    for (rank, run) in again.iter().enumerate() {
        assert_eq!(
            run.replayed, run.traced,
            "rank {rank} replayed untraced (run again)"
        );
        assert!(run.ran_again > 0, "rank {rank} never ran a step again");
    }
    assert!(
        same(&again, &eager),
        "ranks that run steps again differ from eager ones"
    );
    let untraced = run(Steps::Untraced, &bytes, weight, decay);
    assert!(
        untraced[0].replayed > 0,
        "the untraced ranks never replayed"
    );
    assert!(
        !same(&untraced, &eager),
        "untraced ranks trained as eager ones: the case shows nothing"
    );
    traced
}

#[test]
fn a_host_weight_changed_on_one_rank_trains_as_eager_ranks_do() {
    let _rng = crate::common::rng::shared();
    const CHANGE: usize = 24;
    let weight = |rank: usize, step: usize| {
        if rank == 1 && step >= CHANGE {
            2.0
        } else {
            1.0
        }
    };
    let traced = check(weight, |_, _| 1.0);
    changed_on_rank_one(&traced, CHANGE);
}

/// The step of the change: rank 1's trace saw the new value, rank 0's matched and went
/// on eagerly with it, and both say why; both replay again once the new value is graphed.
fn changed_on_rank_one(traced: &[RankRun], change: usize) {
    let stale = |run: &RankRun| match &run.modes[change] {
        StepMode::Eager(FallbackReason::GraphStale { change }) => Some(change.clone()),
        _ => None,
    };
    assert!(
        matches!(stale(&traced[1]), Some(StepChange::HostValues { .. })),
        "rank 1 at the change: {:?}",
        traced[1].modes[change]
    );
    assert_eq!(
        stale(&traced[0]),
        Some(StepChange::PeerDiffered { rank: 1 }),
        "rank 0 at the change: {:?}",
        traced[0].modes[change]
    );
    for run in traced {
        assert_eq!(run.modes.last(), Some(&StepMode::Replayed));
    }
}

#[test]
fn a_host_value_after_the_average_on_one_rank_trains_as_eager_ranks_do() {
    let _rng = crate::common::rng::shared();
    // Rank 1's optimizer decays the parameters from step 24 on: its trace matches the
    // average and stops matching after it, so every rank computes the average again,
    // together.
    const CHANGE: usize = 24;
    let decay = |rank: usize, step: usize| {
        if rank == 1 && step >= CHANGE {
            0.999
        } else {
            1.0
        }
    };
    let traced = check(|_, _| 1.0, decay);
    changed_on_rank_one(&traced, CHANGE);
}

#[test]
fn a_host_coin_on_each_rank_trains_as_eager_ranks_do() {
    let _rng = crate::common::rng::shared();
    // Each rank flips its own coin at each step (p = 0.3): the ranks' steps differ
    // from their graphs at different steps.
    let weight = |rank: usize, step: usize| {
        let mut coin = StdRng::seed_from_u64((rank * 1000 + step) as u64);
        if coin.random_bool(0.3) { 2.0 } else { 1.0 }
    };
    check(weight, |_, _| 1.0);
}

#[test]
fn a_host_value_the_optimizer_counts_trains_as_eager_ranks_do() {
    let _rng = crate::common::rng::shared();
    // Each rank's optimizer decays the parameters on every other block of 8 of its own
    // updates: a host count in the optimizer, which a step that runs again must not
    // advance twice.
    let decay = |_rank: usize, update: usize| if (update / 8) % 2 == 1 { 0.999 } else { 1.0 };
    check(|_, _| 1.0, decay);
}
