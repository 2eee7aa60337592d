//! Setup shared by the GPU trainer tests: the LSTM, its loss, the three capturable
//! optimizers, a learning-rate schedule, and two ways to train (through a
//! `GraphTrainer`, and by hand), generic over the inner backend stack.

use burn::backend::Flex;
use burn::optim::GradientsParams;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::prelude::*;
use burn_graph_capture::nn::{
    GruKernels, LstmKernels, RecurrencePreference, set_recurrence_preference,
};
use burn_graph_capture::optim::{
    CapturableAdam, CapturableAdamConfig, CapturableAdamW, CapturableAdamWConfig,
    CapturableOptimizer, CapturableSgd, CapturableSgdConfig,
};
use burn_graph_capture::runtime::{CudaGraphDevice, with_server};
use burn_graph_capture::{
    Collectives, FallbackReason, GraphBackend, GraphTrainer, GraphTrainerConfig, StepMode,
    TrainBackend, TrainerReport,
};
use lstm_example::train::{from_bytes, parameter_values, to_bytes};
use lstm_example::{LstmRegressor, LstmRegressorConfig, SineTask};

/// An inner backend stack on this crate's CUDA runtime (`CudaCube`, `CudaFused`), with
/// every capability the tests use: graphs, the recurrences' kernels, collectives.
pub trait Stack:
    GraphBackend<Device = CudaGraphDevice> + LstmKernels + GruKernels + Collectives
{
}
impl<G> Stack for G where
    G: GraphBackend<Device = CudaGraphDevice> + LstmKernels + GruKernels + Collectives
{
}

/// A short name of the stack for logs: "fused" or "cube".
pub fn stack_name<G: Stack>() -> &'static str {
    if std::any::type_name::<G>().contains("Fusion<") {
        "fused"
    } else {
        "cube"
    }
}

/// A test case's name in logs, with its stack.
pub fn case<G: Stack>(name: &str) -> String {
    format!("{name}, {}", stack_name::<G>())
}

pub type Model<G> = LstmRegressor<TrainBackend<G>>;
pub type Batch<G> = lstm_example::Batch<TrainBackend<G>>;

/// Input features per time step (the example's sine windows).
pub const D_INPUT: usize = 32;
/// Warmup steps of the default trainer config: step `WARMUP` is captured.
pub const WARMUP: usize = 3;

/// Env var that cuts the long runs (200 correctness steps, 1,000 replays) to a tenth:
/// `xtask gpu run memcheck` sets it under compute-sanitizer, where every kernel runs
/// 10-100x slower, so the whole suite fits one sanitizer run on the same code paths.
pub const SHORT_VAR: &str = "GPU_TRAINER_SHORT";

/// With `GPU_TRACE` set, prints the trainer's step log and every kernel launch
/// (`burn_graph_capture::launch`) to stderr, so two runs' launch sequences can be diffed.
pub fn trace_from_env() {
    static INIT: std::sync::Once = std::sync::Once::new();
    if std::env::var_os("GPU_TRACE").is_some() {
        INIT.call_once(|| {
            let _ = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .without_time()
                .try_init();
        });
    }
}

/// `full`, or a tenth of it when `SHORT_VAR` is set.
pub fn run_length(full: usize) -> usize {
    if std::env::var_os(SHORT_VAR).is_some() {
        full / 10
    } else {
        full
    }
}

/// Batch, sequence length and hidden size of one test's LSTM.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub batch: usize,
    pub time: usize,
    pub hidden: usize,
}

/// Correctness and memory runs: small enough that 200 steps take well under a second
/// of GPU time once warm, large enough for every kernel family of a real LSTM step.
pub const MEDIUM: Sizes = Sizes {
    batch: 8,
    time: 16,
    hidden: 32,
};

/// Guard tests: these also run under compute-sanitizer, where kernels are 10-100x slower.
pub const SMALL: Sizes = Sizes {
    batch: 4,
    time: 8,
    hidden: 16,
};

pub fn device() -> CudaGraphDevice {
    CudaGraphDevice::new(0)
}

/// Launches the work still queued on the device, as a `GraphTrainer` does when it is
/// built (it resolves the model's buffers to register them). Plain-code references call
/// it once their model and optimizer state exist: on the fused stack, work still queued
/// (the model's initialization and loading) fuses with the first step's ops and so
/// changes which kernels that step launches; the two runs would then compute the same
/// step with other kernels, which may round apart (issue 11's cold divergence,
/// `bench/results/inputs-2026-12-01.md`).
/// Device bytes the runtime holds for tensors and graphs: in use in the normal pools and
/// the arena, and reserved by graphs' private pools (live graphs, and retired pools whose
/// handles are not all gone).
pub fn device_bytes() -> (u64, u64, u64) {
    burn_graph_capture::runtime::with_server(&device(), |server| {
        (
            server.pool_usage().bytes_in_use,
            server.arena_usage().bytes_in_use,
            server.graph_pool_bytes(),
        )
    })
    .expect("server")
}

pub fn materialize<G: Stack>() {
    G::sync(&device()).expect("device sync");
}

/// The LSTM regressor of `sizes`.
pub fn config(sizes: Sizes) -> LstmRegressorConfig {
    LstmRegressorConfig::new(sizes.hidden).with_d_input(D_INPUT)
}

/// Fresh weights as bytes. Burn initializes parameters lazily, so models built from
/// the same bytes are the only way to get two identical models.
/// Initial weights for `sizes`, the same on every call: Flex's RNG is seeded first (it
/// is not the GPU backend's, which the tests seed elsewhere). Unseeded, two runs of one
/// test started from different weights and differed from their first step.
pub fn model_bytes(sizes: Sizes) -> Vec<u8> {
    Flex::seed(&Default::default(), 7);
    to_bytes(config(sizes).init::<Flex>(&Default::default()))
}

pub fn model<G: Stack>(sizes: Sizes, bytes: &[u8]) -> Model<G> {
    from_bytes(&config(sizes), bytes.to_vec(), &device())
}

pub fn batch<G: Stack>(task: &mut SineTask, sizes: Sizes) -> Batch<G> {
    task.next_batch(sizes.batch, sizes.time, &device())
}

/// The step closure: ordinary Burn code, MSE of the LSTM's forecast.
pub fn loss<G: Stack>(model: &Model<G>, batch: &Batch<G>) -> Tensor<TrainBackend<G>, 1> {
    model.loss(batch.x.clone(), batch.y.clone())
}

/// A trainer with `adam` and the default configuration, the setup most guards share.
pub type AdamTrainer<G> = GraphTrainer<
    G,
    Model<G>,
    CapturableAdam<TrainBackend<G>>,
    Batch<G>,
    fn(&Model<G>, &Batch<G>) -> Tensor<TrainBackend<G>, 1>,
>;

/// A default-configured `adam` trainer of the model in `bytes`.
pub fn adam_trainer<G: Stack>(sizes: Sizes, bytes: &[u8]) -> AdamTrainer<G> {
    GraphTrainer::new(
        model::<G>(sizes, bytes),
        adam::<G>(),
        loss::<G>,
        GraphTrainerConfig::new(),
    )
}

pub fn adam<G: Stack>() -> CapturableAdam<TrainBackend<G>> {
    CapturableAdamConfig::new()
        .with_learning_rate(1e-2)
        .init(&device())
}

/// AdamW with a weight decay large enough to matter within 200 steps.
pub fn adamw<G: Stack>() -> CapturableAdamW<TrainBackend<G>> {
    CapturableAdamWConfig::new()
        .with_learning_rate(1e-2)
        .with_weight_decay(1e-2)
        .init(&device())
}

/// SGD with momentum (and weight decay, so that every term of the rule is exercised).
pub fn sgd_momentum<G: Stack>() -> CapturableSgd<TrainBackend<G>> {
    CapturableSgdConfig::new()
        .with_learning_rate(2e-2)
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .with_weight_decay(Some(WeightDecayConfig::new(1e-4)))
        .init(&device())
}

/// A learning rate that changes every step (a decaying cosine), as a multiple of the
/// optimizer's base rate. A replay that kept the captured rate would diverge from eager.
pub fn lr_at(base: f64, step: usize) -> f64 {
    let step = step as f64;
    base * (0.55 + 0.45 * (step * 0.3).cos()) / (1.0 + 0.01 * step)
}

/// What a training run produced.
#[derive(Debug, Default)]
pub struct Run {
    /// Loss of every step.
    pub losses: Vec<f32>,
    /// Final parameters, in visiting order.
    pub params: Vec<Vec<f32>>,
    /// Values the `between` hook computed (evaluations between steps).
    pub probes: Vec<f32>,
    /// Mode of every step (graphed runs only).
    pub modes: Vec<StepMode>,
    /// The trainer's report at the end (graphed runs only).
    pub report: Option<TrainerReport>,
}

/// Hook called after every step with the step index and the current model; what it
/// pushes becomes `Run::probes`.
pub type Between<'a, G> = &'a mut dyn FnMut(usize, &Model<G>, &mut Vec<f32>);

/// A hook that does nothing.
pub fn nothing<G: Stack>(_: usize, _: &Model<G>, _: &mut Vec<f32>) {}

/// How one run trains: which batches, which learning rates.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub sizes: Sizes,
    pub seed: u64,
    pub steps: usize,
    pub base_lr: f64,
}

/// `plan.steps` steps through a `GraphTrainer`, reading every loss.
pub fn graphed_run<G, O>(
    plan: Plan,
    bytes: &[u8],
    optimizer: O,
    config: GraphTrainerConfig,
    between: Between<'_, G>,
) -> Run
where
    G: Stack,
    O: CapturableOptimizer<Model<G>, TrainBackend<G>> + Clone,
{
    let mut trainer = GraphTrainer::new(model::<G>(plan.sizes, bytes), optimizer, loss, config);
    let mut task = SineTask::new(plan.seed, D_INPUT);
    let mut run = Run::default();
    for step in 0..plan.steps {
        trainer.set_lr(lr_at(plan.base_lr, step));
        let outcome = trainer.step(batch(&mut task, plan.sizes)).expect("step");
        run.modes.push(outcome.mode);
        run.losses.push(outcome.output.into_scalar().elem());
        between(step, trainer.model().expect("model"), &mut run.probes);
    }
    run.params = parameter_values(trainer.model().expect("model"));
    run.report = Some(trainer.report());
    run
}

/// The same training by hand: the same capturable optimizer, stepped eagerly.
pub fn eager_run<G, O>(plan: Plan, bytes: &[u8], mut optimizer: O, between: Between<'_, G>) -> Run
where
    G: Stack,
    O: CapturableOptimizer<Model<G>, TrainBackend<G>>,
{
    let mut model = model::<G>(plan.sizes, bytes);
    optimizer.init_state(&model);
    materialize::<G>();
    let mut task = SineTask::new(plan.seed, D_INPUT);
    let mut run = Run::default();
    for step in 0..plan.steps {
        optimizer.set_lr(lr_at(plan.base_lr, step));
        let batch = batch::<G>(&mut task, plan.sizes);
        let loss = loss(&model, &batch);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(model, grads);
        run.losses.push(loss.into_scalar().elem());
        between(step, &model, &mut run.probes);
    }
    run.params = parameter_values(&model);
    run
}

/// Relative difference of two values: `|a - b| / max(|b|, 1e-6)`, infinite when either
/// is not finite and they differ (so that NaNs cannot hide in a `max`).
pub fn rel(a: f32, b: f32) -> f64 {
    if a.to_bits() == b.to_bits() {
        return 0.0;
    }
    if !a.is_finite() || !b.is_finite() {
        return f64::INFINITY;
    }
    ((a - b).abs() / b.abs().max(1e-6)) as f64
}

/// How far apart two sequences of values are.
#[derive(Clone, Copy, Debug)]
pub struct Diff {
    pub bit_exact: bool,
    pub max_rel: f64,
}

impl Diff {
    pub fn of<'a>(
        a: impl IntoIterator<Item = &'a f32>,
        b: impl IntoIterator<Item = &'a f32>,
    ) -> Self {
        let (a, b): (Vec<f32>, Vec<f32>) = (
            a.into_iter().copied().collect(),
            b.into_iter().copied().collect(),
        );
        assert_eq!(a.len(), b.len(), "compared sequences differ in length");
        let max_rel = a
            .iter()
            .zip(&b)
            .map(|(x, y)| rel(*x, *y))
            .fold(0.0, f64::max);
        Self {
            bit_exact: a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            max_rel,
        }
    }

    pub fn describe(&self) -> String {
        if self.bit_exact {
            "bit-exact".into()
        } else {
            format!("max rel diff {:e}", self.max_rel)
        }
    }
}

/// Differences of a graphed run from an eager one: losses, final parameters, probes.
#[derive(Clone, Copy, Debug)]
pub struct Comparison {
    pub losses: Diff,
    pub params: Diff,
    pub probes: Diff,
}

impl Comparison {
    pub fn of(graphed: &Run, eager: &Run) -> Self {
        assert_eq!(graphed.params.len(), eager.params.len(), "parameter count");
        Self {
            losses: Diff::of(&graphed.losses, &eager.losses),
            params: Diff::of(
                graphed.params.iter().flatten(),
                eager.params.iter().flatten(),
            ),
            probes: Diff::of(&graphed.probes, &eager.probes),
        }
    }

    /// Prints one summary line ("graphed vs eager", kept in the JUnit output) and
    /// asserts every difference within `tolerance` relative.
    pub fn check(&self, case: &str, tolerance: f64) {
        println!(
            "graphed vs eager [{case}]: losses {}, params {}, probes {}",
            self.losses.describe(),
            self.params.describe(),
            self.probes.describe()
        );
        for (what, diff) in [
            ("losses", self.losses),
            ("params", self.params),
            ("probes", self.probes),
        ] {
            assert!(
                diff.max_rel <= tolerance,
                "{case}: {what} diverge from eager training: {:e} > {tolerance:e}",
                diff.max_rel
            );
        }
    }
}

/// The bound of the issue: replayed training equals eager training within 1e-6 relative
/// (bit-exact where the kernels are the same; each test prints which).
pub const TOLERANCE: f64 = 1e-6;

/// Asserts the default lifecycle: `WARMUP` eager warmup steps, one capture, replays.
/// The mode of the `i`-th step after a capture (from 0) with the default configuration:
/// a replay, or the eager check that follows every `every` replays (`ReplayCheck`).
pub fn expected_after_capture(i: usize, every: usize) -> StepMode {
    if every > 0 && (i + 1).is_multiple_of(every + 1) {
        StepMode::Eager(FallbackReason::ReplayCheck)
    } else {
        StepMode::Replayed
    }
}

/// Replays in a run of `steps` steps with the default configuration: every step after the
/// warmup and the capture, less the periodic eager checks.
pub fn expected_replays(steps: usize) -> usize {
    let every = GraphTrainerConfig::new().verify_every;
    (0..steps.saturating_sub(WARMUP + 1))
        .filter(|i| expected_after_capture(*i, every) == StepMode::Replayed)
        .count()
}

pub fn assert_warmup_capture_replay(modes: &[StepMode]) {
    assert!(
        modes.len() > WARMUP + 1,
        "too few steps to replay: {modes:?}"
    );
    for mode in &modes[..WARMUP] {
        assert_eq!(*mode, StepMode::Eager(FallbackReason::Warmup), "{modes:?}");
    }
    assert_eq!(modes[WARMUP], StepMode::Captured, "{modes:?}");
    // After every `verify_every` replays one step checks the graph eagerly.
    let every = GraphTrainerConfig::new().verify_every;
    let not_replayed: Vec<_> = modes[WARMUP + 1..]
        .iter()
        .enumerate()
        .filter(|(i, mode)| **mode != expected_after_capture(*i, every))
        .map(|(i, mode)| (i + WARMUP + 1, mode))
        .collect();
    assert!(
        not_replayed.is_empty(),
        "steps not replayed: {not_replayed:?}"
    );
}

/// Eager work on tensors of several sizes, checked exactly: `n` copies of a small
/// integer sum to `n` times it in any order (every partial sum is an integer below
/// 2^24). Panics on a wrong value, which is what a replay writing into eager memory (or
/// eager work reusing a graph's memory) would produce. Shapes stay fixed so that no
/// kernel is compiled or autotuned after the first call; `salt` changes the values.
pub fn eager_churn<G: Stack>(salt: usize) {
    let device = device();
    let value = (salt % 4 + 1) as f32;
    let mut kept = Vec::new();
    for n in [1usize, 1000, 65_537, (1 << 20) + 3] {
        let tensor = Tensor::<TrainBackend<G>, 1>::full([n], value, &device);
        let sum: f32 = tensor.clone().add_scalar(1.0).sum().into_scalar().elem();
        assert_eq!(sum, (value + 1.0) * n as f32, "eager sum over {n} elements");
        // Every other tensor lives on until the end, so frees and allocations interleave.
        if n % 2 == 1 {
            kept.push((n, tensor));
        }
    }
    for (n, tensor) in kept {
        let sum: f32 = tensor.sum().into_scalar().elem();
        assert_eq!(sum, value * n as f32, "kept tensor of {n} elements");
    }
}

/// Device memory of the normal pools: bytes in use and reserved.
pub fn pool_usage() -> (u64, u64) {
    let usage = with_server(&device(), |server| server.pool_usage()).expect("server");
    (usage.bytes_in_use, usage.bytes_reserved)
}

/// Live graphs on the device.
pub fn graph_count() -> usize {
    with_server(&device(), |server| server.graph_count()).expect("server")
}

/// The preference in force until dropped: tests run one at a time, and the next one finds
/// `Auto` again even when this one fails.
pub struct Preferring;

impl Preferring {
    pub fn new(preference: RecurrencePreference) -> Self {
        set_recurrence_preference(preference);
        Self
    }
}

impl Drop for Preferring {
    fn drop(&mut self) {
        set_recurrence_preference(RecurrencePreference::Auto);
    }
}
