//! This crate's step on its own runtime, graphed through `GraphTrainer` and eager with
//! the same capturable Adam, generic over the stack (`CudaFused` or `CudaCube`) and the
//! model (`nn::Lstm` or `FusedLstm`).

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::nn::{GruKernels, LstmKernels};
use burn_graph_capture::optim::{CapturableAdam, CapturableAdamConfig};
use burn_graph_capture::runtime::{CudaGraphDevice, GraphInfo, with_server};
use burn_graph_capture::{
    Collectives, DataParallel, DataParallelConfig, FallbackReason, GraphBackend, GraphTrainer,
    GraphTrainerConfig, RankMember, StepMode, TrainBackend, TrainerReport,
};
use lstm_example::Batch;

use crate::host_profile;
use crate::memory::{self, PoolDelta};
use crate::setup::{BenchModel, WARMUP, Workload, loss};
use crate::timing::{self, Timing};

/// A stack of this crate's runtime that `GraphTrainer` can capture.
pub trait Stack:
    GraphBackend<Device = CudaGraphDevice> + LstmKernels + GruKernels + Collectives
{
}
impl<G> Stack for G where
    G: GraphBackend<Device = CudaGraphDevice> + LstmKernels + GruKernels + Collectives
{
}

/// A model the bench trains on stack `G`.
pub trait Model<G: Stack>: BenchModel<TrainBackend<G>> + AutodiffModule<TrainBackend<G>> {}
impl<G: Stack, M: BenchModel<TrainBackend<G>> + AutodiffModule<TrainBackend<G>>> Model<G> for M {}

type Input<G> = Batch<TrainBackend<G>>;
type LossFn<G, M> = fn(&M, &Input<G>) -> Tensor<TrainBackend<G>, 1>;
type Trainer<G, M> = GraphTrainer<G, M, CapturableAdam<TrainBackend<G>>, Input<G>, LossFn<G, M>>;

fn adam<G: Stack>(device: &CudaGraphDevice) -> CapturableAdam<TrainBackend<G>> {
    CapturableAdamConfig::new().init::<TrainBackend<G>>(device)
}

fn read<G: Stack>(loss: Tensor<TrainBackend<G>, 1>) {
    let _ = loss.into_scalar();
}

/// What a graphed run measured.
pub struct Graphed {
    pub timing: Timing,
    pub report: TrainerReport,
    /// Timed steps that were not replays (should be 0).
    pub not_replayed: usize,
    /// The live graphs after the run (the trainer's one graph), read from the server.
    pub graphs: Vec<GraphInfo>,
    /// Bytes the arena reserves (pinned tensors plus page rounding).
    pub arena_reserved: u64,
}

/// The trainer of `work` on `G`, warmed up and captured: `WARMUP` eager steps, one
/// captured step.
///
/// Its graph is not checked against eager steps (`verify_every` 0), so that every timed
/// step is a replay; [`check_cost`] measures what the checks add.
fn captured_trainer<G: Stack, M: Model<G>>(
    work: &Workload,
    batches: &[Input<G>],
    device: &CudaGraphDevice,
    member: Option<RankMember>,
) -> Trainer<G, M> {
    let config = GraphTrainerConfig::new()
        .with_warmup_steps(WARMUP)
        .with_verify_every(0);
    captured_with::<G, M>(work, batches, device, member, config)
}

fn captured_with<G: Stack, M: Model<G>>(
    work: &Workload,
    batches: &[Input<G>],
    device: &CudaGraphDevice,
    member: Option<RankMember>,
    config: GraphTrainerConfig,
) -> Trainer<G, M> {
    let step: LossFn<G, M> = loss;
    let model = M::build(work, device);
    let mut trainer = match member {
        None => GraphTrainer::new(model, adam::<G>(device), step, config),
        Some(member) => GraphTrainer::data_parallel(model, adam::<G>(device), step, config, member)
            .expect("a data-parallel trainer"),
    };
    for batch in batches.iter().cycle().take(WARMUP + 1) {
        read::<G>(trainer.step(batch.clone()).expect("step").output);
    }
    trainer
}

/// Whether the trainer is one of data-parallel training (issue 16): its step then holds
/// the gradient all-reduce (NCCL, one rank) and the ranks' agreement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ranks {
    /// A plain trainer.
    None,
    /// The one rank of a data-parallel group.
    One,
}

/// Times replays of `work`'s step on `G` (the trainer is dropped at the end).
pub fn graphed<G: Stack, M: Model<G>>(work: &Workload, device: &CudaGraphDevice) -> Graphed {
    graphed_ranks::<G, M>(work, device, Ranks::None)
}

/// [`graphed`], by a plain trainer or the one rank of a data-parallel group.
pub fn graphed_ranks<G: Stack, M: Model<G>>(
    work: &Workload,
    device: &CudaGraphDevice,
    ranks: Ranks,
) -> Graphed {
    let member = match ranks {
        Ranks::None => None,
        Ranks::One => {
            let group = DataParallel::new(1, &DataParallelConfig::new()).expect("group");
            Some(group.member(0).expect("member"))
        }
    };
    timed_replays::<G, M>(work, device, member)
}

/// Times rank 0's replays of `work`'s step in a group of two ranks, GPUs 0 and 1, each
/// with `work`'s batch (so the two train on twice the batch of one GPU). Rank 1 steps
/// alongside on its own thread: every step the ranks agree and average their gradients.
pub fn graphed_two<G: Stack, M: Model<G>>(work: &Workload) -> Graphed {
    let group = DataParallel::new(2, &DataParallelConfig::new()).expect("group");
    let mut members = group.members().expect("members").into_iter();
    let (zero, one) = (
        members.next().expect("rank 0"),
        members.next().expect("rank 1"),
    );
    let plan = timing::GRAPHED;
    let steps = WARMUP + 1 + plan.per_step + plan.rounds * plan.round_len;
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let device = CudaGraphDevice::new(1);
            let batches = work.batches::<TrainBackend<G>>(&device);
            let mut trainer = captured_trainer::<G, M>(work, &batches, &device, Some(one));
            let mut last = None;
            for batch in batches.iter().cycle().take(steps - WARMUP - 1) {
                last = Some(trainer.step(batch.clone()).expect("rank 1's step").output);
            }
            read::<G>(last.expect("a step"));
        });
        timed_replays::<G, M>(work, &CudaGraphDevice::new(0), Some(zero))
    })
}

/// Builds and captures the trainer (of `member`'s rank, if any), then times its replays.
fn timed_replays<G: Stack, M: Model<G>>(
    work: &Workload,
    device: &CudaGraphDevice,
    member: Option<RankMember>,
) -> Graphed {
    let batches = work.batches::<TrainBackend<G>>(device);
    let mut trainer = captured_trainer::<G, M>(work, &batches, device, member);
    let mut next = batches.iter().cycle();
    let mut not_replayed = 0;
    let timing = timing::time(
        timing::GRAPHED,
        || {
            let outcome = trainer.step(next.next().unwrap().clone()).expect("step");
            if outcome.mode != StepMode::Replayed {
                not_replayed += 1;
            }
            outcome.output
        },
        read::<G>,
    );
    let report = trainer.report();
    let (graphs, arena_reserved) = with_server(device, |server| {
        (server.graph_infos(), server.arena_usage().bytes_reserved)
    })
    .expect("server");
    Graphed {
        timing,
        report,
        not_replayed,
        graphs,
        arena_reserved,
    }
}

/// What checking a graph against an eager step every `verify_every` replays costs
/// (issue 27): mean ms per step over the same steps with the checks and without, side
/// by side in rounds that alternate between two trainers of the same model.
pub struct CheckCost {
    pub verify_every: usize,
    pub steps_per_round: usize,
    pub rounds: usize,
    /// Mean ms per step with checks (every round's wall time over its steps, median of
    /// the rounds), and without.
    pub checked_ms: f64,
    pub unchecked_ms: f64,
    /// Check steps (`ReplayCheck`) the checked trainer ran in the timed rounds.
    pub checks: u64,
}

pub fn check_cost<G: Stack, M: Model<G>>(
    work: &Workload,
    device: &CudaGraphDevice,
    verify_every: usize,
) -> CheckCost {
    let batches = work.batches::<TrainBackend<G>>(device);
    let config = GraphTrainerConfig::new().with_warmup_steps(WARMUP);
    let mut checked = captured_with::<G, M>(
        work,
        &batches,
        device,
        None,
        config.clone().with_verify_every(verify_every),
    );
    let mut unchecked =
        captured_with::<G, M>(work, &batches, device, None, config.with_verify_every(0));
    let (rounds, steps_per_round) = (5, 2 * verify_every.max(50));
    let mut next = batches.iter().cycle();
    let mut round = |trainer: &mut Trainer<G, M>| {
        let start = std::time::Instant::now();
        let mut last = None;
        for _ in 0..steps_per_round {
            let outcome = trainer.step(next.next().unwrap().clone()).expect("step");
            last = Some(outcome.output);
        }
        read::<G>(last.expect("a step"));
        start.elapsed().as_secs_f64() * 1e3 / steps_per_round as f64
    };
    let checks_before = checked.report().fallbacks.get("ReplayCheck").copied();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        with.push(round(&mut checked));
        without.push(round(&mut unchecked));
    }
    let checks = checked.report().fallbacks.get("ReplayCheck").copied();
    CheckCost {
        verify_every,
        steps_per_round,
        rounds,
        checked_ms: timing::median(with),
        unchecked_ms: timing::median(without),
        checks: checks.unwrap_or(0) - checks_before.unwrap_or(0),
    }
}

/// Profiles one replay: the graph's own kernels (ncu profiles graph kernel nodes one by
/// one by default).
pub fn profile_replay<G: Stack, M: Model<G>>(work: &Workload, device: &CudaGraphDevice) -> f64 {
    let batches = work.batches::<TrainBackend<G>>(device);
    let mut trainer = captured_trainer::<G, M>(work, &batches, device, None);
    let batch = batches[0].clone();
    crate::profile::range(
        || TrainBackend::<G>::sync(device).expect("sync"),
        || {
            let outcome = trainer.step(batch).expect("step");
            assert_eq!(
                outcome.mode,
                StepMode::Replayed,
                "the profiled step replays"
            );
        },
    )
}

/// An eager loop of `work`'s step on `G` with the capturable Adam, outside any trainer.
struct Eager<G: Stack, M> {
    model: Option<M>,
    optimizer: CapturableAdam<TrainBackend<G>>,
    batches: Vec<Batch<TrainBackend<G>>>,
    next: usize,
}

impl<G: Stack, M: Model<G>> Eager<G, M> {
    fn new(
        work: &Workload,
        batches: Vec<Batch<TrainBackend<G>>>,
        device: &CudaGraphDevice,
    ) -> Self {
        let model = M::build(work, device);
        let mut optimizer = adam::<G>(device);
        optimizer.init_state(&model);
        Self {
            model: Some(model),
            optimizer,
            batches,
            next: 0,
        }
    }

    fn step(&mut self) -> Tensor<TrainBackend<G>, 1> {
        let model = self.model.take().expect("model");
        let batch = &self.batches[self.next % self.batches.len()];
        self.next += 1;
        let l = loss(&model, batch);
        let grads = GradientsParams::from_grads(l.backward(), &model);
        self.model = Some(self.optimizer.step(model, grads));
        l
    }

    fn warm_up(&mut self) {
        for _ in 0..WARMUP {
            read::<G>(self.step());
        }
    }
}

/// Times eager steps of `work` on `G`, and the pools' growth from before the model exists
/// to after the steps (run it after the graphed run, so that warmup's autotuning is not
/// counted as step memory; the batches exist before, as the graphed run's do).
pub fn eager<G: Stack, M: Model<G>>(
    work: &Workload,
    device: &CudaGraphDevice,
) -> (Timing, PoolDelta) {
    let batches = work.batches(device);
    let sync = || TrainBackend::<G>::sync(device).expect("sync");
    let before = memory::ours_after_cleanup::<G>(sync, device);
    let mut run = Eager::<G, M>::new(work, batches, device);
    run.warm_up();
    let timing = timing::time(timing::EAGER, || run.step(), read::<G>);
    sync();
    let after = memory::ours(device);
    (timing, PoolDelta::between(before, after))
}

/// Profiles the eager step after `WARMUP` eager steps: the step a graph captures.
pub fn profile_eager<G: Stack, M: Model<G>>(work: &Workload, device: &CudaGraphDevice) -> f64 {
    let mut run = Eager::<G, M>::new(work, work.batches(device), device);
    run.warm_up();
    let sync = || TrainBackend::<G>::sync(device).expect("sync");
    let mut loss = None;
    let wall = crate::profile::range(sync, || loss = Some(run.step()));
    read::<G>(loss.expect("loss"));
    wall
}

/// What tracing every replay costs: mean ms per step of two trainers of one model, one
/// captured with traces and one without (`Untraced` at its capture: its graph has no
/// trace recording), in alternating rounds of pipelined replays, and the traced
/// trainer's host time in traces per step (`TrainerReport::trace_ms`).
pub struct TraceCost {
    pub steps_per_round: usize,
    pub rounds: usize,
    pub traced_ms: f64,
    pub untraced_ms: f64,
    /// Host ms per step spent tracing (the traced trainer's timed rounds).
    pub trace_ms_per_step: f64,
    /// Host ms per step in checks and in launches (`TrainerReport::check_ms`,
    /// `launch_ms`), traced and untraced: with the trace, what a replayed step's host
    /// time is made of.
    pub check_ms: (f64, f64),
    pub launch_ms: (f64, f64),
    /// Host ms per call of `step` (traced, untraced): where it exceeds the device's time
    /// per step, the host bounds the pipeline.
    pub host_ms: (f64, f64),
    /// The same step run eagerly by a trainer that never captures: pipelined ms and host
    /// ms per call. Its host time is the floor of a trace's (the closure, autodiff and
    /// the update's host code, plus a launch per kernel that a trace skips).
    pub eager_ms: f64,
    pub eager_host_ms: f64,
    /// Timed steps of the traced trainer that replayed after a matched trace.
    pub traces_matched: u64,
    /// Timed steps of either trainer that did not replay (should be 0).
    pub not_replayed: usize,
}

/// Traced, untraced and eager rounds of `model`'s step side by side; a host profile of
/// more traced steps under `HOST_PROFILE` (`trace-MODEL-B-T-H.folded`).
pub fn trace_cost<G: Stack, M: Model<G>>(
    model: &str,
    work: &Workload,
    device: &CudaGraphDevice,
) -> TraceCost {
    let batches = work.batches::<TrainBackend<G>>(device);
    let config = GraphTrainerConfig::new()
        .with_warmup_steps(WARMUP)
        .with_verify_every(0);
    let mut traced = captured_with::<G, M>(work, &batches, device, None, config.clone());
    let mut untraced = {
        let _untraced = burn_graph_capture::Untraced::on();
        captured_with::<G, M>(work, &batches, device, None, config.clone())
    };
    let mut eager = captured_with::<G, M>(work, &batches, device, None, config.with_capture(false));
    let (rounds, steps_per_round) = (7, 50);
    let mut next = batches.iter().cycle();
    let mut not_replayed = 0;
    let mut round = |trainer: &mut Trainer<G, M>, host: &mut std::time::Duration| {
        let expected = if trainer.config().capture {
            StepMode::Replayed
        } else {
            StepMode::Eager(FallbackReason::CaptureDisabled)
        };
        let start = std::time::Instant::now();
        let mut last = None;
        for _ in 0..steps_per_round {
            let batch = next.next().unwrap().clone();
            let called = std::time::Instant::now();
            let outcome = trainer.step(batch).expect("step");
            *host += called.elapsed();
            not_replayed += usize::from(outcome.mode != expected);
            last = Some(outcome.output);
        }
        read::<G>(last.expect("a step"));
        start.elapsed().as_secs_f64() * 1e3 / steps_per_round as f64
    };
    let before = traced.report();
    let untraced_before = untraced.report();
    let (mut with, mut without, mut eagerly) = (Vec::new(), Vec::new(), Vec::new());
    let (mut host_with, mut host_without, mut host_eager) = Default::default();
    for _ in 0..rounds {
        without.push(round(&mut untraced, &mut host_without));
        with.push(round(&mut traced, &mut host_with));
        eagerly.push(round(&mut eager, &mut host_eager));
    }
    let after = traced.report();
    let untraced_after = untraced.report();
    let timed = (rounds * steps_per_round) as f64;
    let per_step = |field: fn(&TrainerReport) -> f64| {
        (
            (field(&after) - field(&before)) / timed,
            (field(&untraced_after) - field(&untraced_before)) / timed,
        )
    };
    // After the timed rounds, so that sampling slows none of them.
    let name = format!("trace-{model}-{}", work.size.to_string().replace('/', "-"));
    host_profile::sampled(&name, || {
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(2) {
            traced.step(next.next().unwrap().clone()).expect("step");
        }
    });
    TraceCost {
        steps_per_round,
        rounds,
        traced_ms: timing::median(with),
        untraced_ms: timing::median(without),
        trace_ms_per_step: per_step(|report| report.trace_ms).0,
        check_ms: per_step(|report| report.check_ms),
        launch_ms: per_step(|report| report.launch_ms),
        host_ms: (
            host_with.as_secs_f64() * 1e3 / timed,
            host_without.as_secs_f64() * 1e3 / timed,
        ),
        traces_matched: after.traces_matched - before.traces_matched,
        not_replayed,
        eager_ms: timing::median(eagerly),
        eager_host_ms: host_eager.as_secs_f64() * 1e3 / timed,
    }
}
