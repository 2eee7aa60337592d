//! Every tensor a graph reads is accounted for (issue 11), on the GPU:
//!
//! 1. a character-level language model (`Embedding` + `nn::Lstm` + `Linear`,
//!    cross-entropy on int targets, a derived batch) graphs and equals eager training;
//! 2. the same model with a batch that lists only a float mask never replays, and says
//!    which op read the unlisted tokens;
//! 3. a tensor built once outside the loop and read in the step is a constant: it
//!    replays and equals eager;
//! 4. snapshots taken after capture (a model clone, a `valid()` model, one parameter
//!    tensor, an optimizer record) keep their values while replays go on, and a model
//!    taken out and put back is checked by one eager step, then replays again;
//! 5. an MLP with `BatchNorm` graphs: losses, parameters, running statistics and the
//!    `valid()` model's outputs equal eager training;
//! 6. a parameter tied through two fields graphs and equals eager training.
//!
//! Layouts (a model reloaded, put back, laid out otherwise) are the `layouts` module's.
//!
//! Every run is compared bit for bit with the same training written as plain Burn code
//! with the same capturable optimizer (tied weights re-tied by hand, as plain Burn code
//! must). Small sizes: `xtask gpu run memcheck` also runs these under compute-sanitizer.

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn_graph_capture::optim::{CapturableAdam, CapturableAdamConfig};
use burn_graph_capture::{
    FallbackReason, GraphTrainer, GraphTrainerConfig, StepInput, StepMode, TrainBackend,
    TrainerReport,
};
use lstm_example::train::{load_bytes, parameter_values, to_bytes};
use lstm_example::{CharLm, CharLmConfig, TokenBatch, TokenTask};

use crate::common::{
    Diff, Stack, TOLERANCE, WARMUP, assert_warmup_capture_replay, case, device, lr_at, materialize,
    run_length,
};
use crate::models::{BnMlp, MaskOnly, Regression, TiedMlp};

pub(crate) const LR: f64 = 1e-2;
pub(crate) const VOCAB: usize = 32;
pub(crate) const BATCH: usize = 8;
pub(crate) const TIME: usize = 16;

pub(crate) type B<G> = TrainBackend<G>;

pub(crate) fn adam<G: Stack>() -> CapturableAdam<B<G>> {
    CapturableAdamConfig::new()
        .with_learning_rate(LR)
        .init(&device())
}

/// A model of `B<G>` with the weights of `fresh` (built on the CPU): graphed and eager
/// runs start from the same values.
fn on_gpu<G: Stack, M: Module<burn::backend::Flex>, N: Module<B<G>>>(fresh: M, empty: N) -> N {
    load_bytes(empty, to_bytes(fresh), &device())
}

fn lm_config() -> CharLmConfig {
    CharLmConfig::new(VOCAB, 32)
}

fn lm<G: Stack>(bytes: &[u8]) -> CharLm<B<G>> {
    load_bytes(lm_config().init(&device()), bytes.to_vec(), &device())
}

fn lm_bytes() -> Vec<u8> {
    to_bytes(lm_config().init::<burn::backend::Flex>(&Default::default()))
}

pub(crate) fn lm_loss<G: Stack>(model: &CharLm<B<G>>, batch: &TokenBatch<B<G>>) -> Tensor<B<G>, 1> {
    model.loss(batch.tokens.clone(), batch.targets.clone())
}

/// What one training run produced.
#[derive(Debug, Default)]
pub(crate) struct Run {
    pub(crate) losses: Vec<f32>,
    pub(crate) modes: Vec<StepMode>,
    pub(crate) params: Vec<Vec<f32>>,
    pub(crate) report: Option<TrainerReport>,
}

/// A trainer with this module's Adam.
type Trainer<G, M, I, F> = GraphTrainer<G, M, CapturableAdam<B<G>>, I, F>;

/// `steps` trainer steps on `batch(step)`, the learning rate changed every step.
pub(crate) fn graphed<G, M, I, F>(
    model: M,
    steps: usize,
    mut batch: impl FnMut(usize) -> I,
    loss: F,
) -> (Run, Trainer<G, M, I, F>)
where
    G: Stack,
    M: AutodiffModule<B<G>>,
    I: StepInput<B<G>>,
    F: FnMut(&M, &I) -> Tensor<B<G>, 1> + Clone,
{
    let mut trainer = GraphTrainer::new(model, adam::<G>(), loss, GraphTrainerConfig::new());
    let mut run = Run::default();
    for step in 0..steps {
        trainer.set_lr(lr_at(LR, step));
        let outcome = trainer.step(batch(step)).expect("step");
        run.modes.push(outcome.mode);
        run.losses.push(outcome.output.into_scalar().elem());
    }
    run.params = parameter_values(&trainer.model().expect("model").valid());
    run.report = Some(trainer.report());
    (run, trainer)
}

/// The same training as plain Burn code; `after` runs after each optimizer step. Its
/// model and optimizer state are materialized first, as the trainer's are when it is
/// built (`materialize`).
pub(crate) fn eager<G, M, I>(
    mut model: M,
    steps: usize,
    mut batch: impl FnMut(usize) -> I,
    mut loss: impl FnMut(&M, &I) -> Tensor<B<G>, 1>,
    mut after: impl FnMut(M) -> M,
) -> (Run, M)
where
    G: Stack,
    M: AutodiffModule<B<G>>,
{
    let mut optimizer = adam::<G>();
    optimizer.init_state(&model);
    materialize::<G>();
    let mut run = Run::default();
    for step in 0..steps {
        optimizer.set_lr(lr_at(LR, step));
        let batch = batch(step);
        let l = loss(&model, &batch);
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = after(optimizer.step(model, grads));
        run.losses.push(l.into_scalar().elem());
    }
    run.params = parameter_values(&model.valid());
    (run, model)
}

/// The first step whose losses differ in their bits, if any.
pub(crate) fn first_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
}

/// The bits of `losses` in a line that can be compared across processes: the first
/// four in hex and an FNV-1a hash of all of them (cold runs of one build in separate
/// processes must print the same line for the same training to be reproducible).
fn digest(losses: &[f32]) -> String {
    let hash = losses.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, l| {
        (h ^ u64::from(l.to_bits())).wrapping_mul(0x0100_0000_01b3)
    });
    let head: Vec<String> = losses
        .iter()
        .take(4)
        .map(|l| format!("{:08x}", l.to_bits()))
        .collect();
    format!("{} #{hash:016x}", head.join(" "))
}

/// A line that separates a test's phases in its log, among cubecl's autotune lines
/// (`AUTOTUNE_LOG=1`): which kernels each phase tuned first.
fn phase(name: &str) {
    println!("=== phase: {name}");
}

/// Asserts a graphed run equal to the eager one (losses and parameters), printing how.
pub(crate) fn check(case: &str, graphed: &Run, eager: &Run) {
    if let Some(step) = first_difference(&graphed.losses, &eager.losses) {
        println!(
            "[{case}] losses first differ at step {step} ({:?})",
            graphed.modes.get(step)
        );
    }
    let losses = Diff::of(&graphed.losses, &eager.losses);
    let params = Diff::of(
        graphed.params.iter().flatten(),
        eager.params.iter().flatten(),
    );
    let report = graphed
        .report
        .as_ref()
        .map(|r| serde_json::to_string(r).unwrap());
    println!(
        "graphed vs eager [{case}]: losses {}, params {}; loss {} -> {}; report {}",
        losses.describe(),
        params.describe(),
        eager.losses[0],
        eager.losses[eager.losses.len() - 1],
        report.unwrap_or_default()
    );
    assert!(
        losses.max_rel <= TOLERANCE,
        "{case}: losses {}",
        losses.describe()
    );
    assert!(
        params.max_rel <= TOLERANCE,
        "{case}: params {}",
        params.describe()
    );
}

fn token_batches<G: Stack>(seed: u64) -> impl FnMut(usize) -> TokenBatch<B<G>> {
    let mut task = TokenTask::new(seed, VOCAB);
    move |_| task.next_batch(BATCH, TIME, &device())
}

/// The token model graphs and equals eager training over 200 steps.
fn token_model_graphs_and_equals_eager<G: Stack>() {
    let steps = run_length(200);
    let bytes = lm_bytes();
    let (graphed_run, _) = graphed(lm::<G>(&bytes), steps, token_batches::<G>(5), lm_loss::<G>);
    assert_warmup_capture_replay(&graphed_run.modes);
    let (eager_run, _) = eager(
        lm::<G>(&bytes),
        steps,
        token_batches::<G>(5),
        lm_loss::<G>,
        |m| m,
    );
    assert!(
        eager_run.losses[steps - 1] < eager_run.losses[0],
        "the model did not learn (a vacuous comparison)"
    );
    check(
        &case::<G>("token lm, derived batch"),
        &graphed_run,
        &eager_run,
    );
}

/// Before any step, the trainer lends back exactly the model it was given (the fuzzer's
/// token model once differed here on the GPU, with no step run).
fn trainer_lends_back_its_model_unchanged<G: Stack>() {
    let bytes = lm_bytes();
    let expected = parameter_values(&lm::<G>(&bytes));
    let trainer = GraphTrainer::new(
        lm::<G>(&bytes),
        adam::<G>(),
        lm_loss::<G>,
        GraphTrainerConfig::new(),
    );
    let lent = parameter_values(&trainer.model().expect("model").clone());
    for (index, (lent, expected)) in lent.iter().zip(&expected).enumerate() {
        let first = first_difference(lent, expected);
        assert_eq!(
            first,
            None,
            "parameter {index} ({} values): first difference at {first:?}",
            lent.len()
        );
    }
    assert_eq!(lent.len(), expected.len(), "parameter count");
}

fn masked_loss<G: Stack>(model: &CharLm<B<G>>, batch: &MaskOnly<B<G>>) -> Tensor<B<G>, 1> {
    lm_loss::<G>(model, &batch.tokens) * batch.mask.clone().mean()
}

/// Tokens left out of the batch, new at every step, equal eager. Where graphs read
/// constants through pins that traces fill (`GraphBackend::pins_constants`), the tokens
/// are such a constant: each trace copies them into their pin and the step replays.
/// Elsewhere the step never replays and names the reading op.
fn unlisted_tokens_equal_eager<G: Stack>() {
    let steps = WARMUP + 12;
    let bytes = lm_bytes();
    let masked = || {
        let mut tokens = token_batches::<G>(7);
        move |step| MaskOnly {
            tokens: tokens(step),
            mask: Tensor::ones([BATCH, TIME], &device()),
        }
    };
    let (graphed_run, _) = graphed(lm::<G>(&bytes), steps, masked(), masked_loss::<G>);
    assert_eq!(
        graphed_run.modes[0],
        StepMode::Eager(FallbackReason::Warmup)
    );
    let report = graphed_run.report.as_ref().unwrap();
    if G::pins_constants() {
        assert!(
            report.modes.replayed >= 8,
            "pinned tokens replay: {:?}",
            graphed_run.modes
        );
        assert_eq!(report.traces_matched, report.modes.replayed);
    } else {
        for mode in &graphed_run.modes[1..] {
            let StepMode::Eager(FallbackReason::UnlistedInput { op, shape, dtype }) = mode else {
                panic!(
                    "expected UnlistedInput, got {mode:?} in {:?}",
                    graphed_run.modes
                );
            };
            assert_eq!(
                (op.as_ref(), shape.as_slice()),
                ("embedding", &[BATCH, TIME][..])
            );
            assert!(dtype.is_int());
        }
        assert_eq!(report.modes.replayed + report.modes.captured, 0);
    }
    let (eager_run, _) = eager(lm::<G>(&bytes), steps, masked(), masked_loss::<G>, |m| m);
    check(
        &case::<G>("token lm, unlisted tokens"),
        &graphed_run,
        &eager_run,
    );
}

/// A mask built once, outside the loop, read inside the step: a constant.
fn a_constant_mask_replays_and_equals_eager<G: Stack>() {
    let steps = run_length(200);
    let bytes = lm_bytes();
    let weights: Vec<f32> = (0..BATCH * TIME)
        .map(|i| 0.5 + (i % 3) as f32 * 0.25)
        .collect();
    let mask = Tensor::<B<G>, 2>::from_data(TensorData::new(weights, [BATCH, TIME]), &device());
    let weighted = |mask: Tensor<B<G>, 2>| {
        move |model: &CharLm<B<G>>, batch: &TokenBatch<B<G>>| {
            let logits = model.forward(batch.tokens.clone());
            let per_position = logits.mean_dim(2).squeeze_dim::<2>(2);
            lm_loss::<G>(model, batch) + (per_position * mask.clone()).mean() * 1e-2
        }
    };
    let (graphed_run, _) = graphed(
        lm::<G>(&bytes),
        steps,
        token_batches::<G>(9),
        weighted(mask.clone()),
    );
    assert_warmup_capture_replay(&graphed_run.modes);
    let (eager_run, _) = eager(
        lm::<G>(&bytes),
        steps,
        token_batches::<G>(9),
        weighted(mask),
        |m| m,
    );
    check(
        &case::<G>("token lm, constant mask"),
        &graphed_run,
        &eager_run,
    );
}

/// The first float parameter's tensor, cloned: a single parameter snapshot.
fn first_param<Bk: Backend, M: Module<Bk>>(model: &M) -> Tensor<Bk, 1> {
    struct First<Bk: Backend>(Option<Tensor<Bk, 1>>);
    impl<Bk: Backend> ModuleVisitor<Bk> for First<Bk> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            if self.0.is_none() {
                self.0 = Some(param.val().flatten(0, D - 1));
            }
        }
    }
    let mut first = First(None);
    model.visit(&mut first);
    first.0.expect("a float parameter")
}

fn values<Bk: Backend>(tensor: Tensor<Bk, 1>) -> Vec<u32> {
    tensor
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// Snapshots after capture keep their values over 50 more steps (4.); the trainer keeps
/// replaying meanwhile. Then a model taken out and put back: one verifying eager step,
/// then replays, and the whole run equals eager training.
fn snapshots_keep_their_values<G: Stack>() {
    let later = run_length(50).max(5);
    let steps = WARMUP + 1 + later + 6;
    let bytes = lm_bytes();
    let mut trainer = GraphTrainer::new(
        lm::<G>(&bytes),
        adam::<G>(),
        lm_loss::<G>,
        GraphTrainerConfig::new(),
    );
    let mut batch = token_batches::<G>(13);
    let mut run = Run::default();
    let mut step = |trainer: &mut GraphTrainer<_, _, _, _, _>, run: &mut Run, index: usize| {
        trainer.set_lr(lr_at(LR, index));
        let outcome = trainer.step(batch(index)).expect("step");
        run.modes.push(outcome.mode);
        run.losses.push(outcome.output.into_scalar().elem());
    };
    for index in 0..=WARMUP {
        step(&mut trainer, &mut run, index);
    }
    assert_eq!(run.modes[WARMUP], StepMode::Captured);
    let model = trainer.model().expect("model");
    let clone = model.clone();
    let valid = model.valid();
    let param = first_param(model);
    let record = trainer.optimizer().to_record();
    let record_param = record.params.values().next().expect("state")[0].clone();
    let taken = (
        parameter_values(&clone),
        parameter_values(&valid),
        values(param.clone()),
        values(record_param.clone()),
    );
    for index in WARMUP + 1..WARMUP + 1 + later {
        step(&mut trainer, &mut run, index);
    }
    assert!(
        run.modes[WARMUP + 1..]
            .iter()
            .all(|m| *m == StepMode::Replayed),
        "{:?}",
        run.modes
    );
    assert_ne!(
        parameter_values(trainer.model().unwrap()),
        taken.0,
        "training moved on"
    );
    assert_eq!(
        parameter_values(&clone),
        taken.0,
        "a model clone keeps its values"
    );
    assert_eq!(
        parameter_values(&valid),
        taken.1,
        "a valid() model keeps its values"
    );
    assert_eq!(
        values(param),
        taken.2,
        "a parameter tensor keeps its values"
    );
    assert_eq!(
        values(record_param),
        taken.3,
        "an optimizer record keeps its values"
    );

    // Out and back in: one verifying eager step, then replays again.
    let out = trainer.take_model().expect("model");
    assert!(trainer.model().is_none());
    trainer.put_model(out);
    for index in WARMUP + 1 + later..steps {
        step(&mut trainer, &mut run, index);
    }
    let after_put = &run.modes[WARMUP + 1 + later..];
    assert_eq!(
        after_put[0],
        StepMode::Eager(FallbackReason::ModelReplaced),
        "{after_put:?}"
    );
    assert!(
        after_put[1..].iter().all(|m| *m == StepMode::Replayed),
        "{after_put:?}"
    );
    let report = trainer.report();
    println!(
        "snapshots [{}]: {} copies, {:.3} ms in all; recaptures {}; replayed {} of {steps}",
        case::<G>("token lm"),
        report.snapshot_copies,
        report.snapshot_ms,
        report.recaptures,
        report.modes.replayed
    );
    run.params = parameter_values(&trainer.model().unwrap().valid());
    run.report = Some(report);
    let (eager_run, _) = eager(
        lm::<G>(&bytes),
        steps,
        token_batches::<G>(13),
        lm_loss::<G>,
        |m| m,
    );
    check(
        &case::<G>("token lm, snapshots and put_model"),
        &run,
        &eager_run,
    );
}

fn regression<G: Stack>(step: usize) -> Regression<B<G>> {
    Regression::new(step, 16, &device())
}

/// Prints the first step's loss of both runs next to the CPU's from the same weights:
/// when a graphed run and its eager reference disagree, this says which one is off.
fn print_first_losses(case: &str, graphed: &Run, eager: &Run, cpu: f32) {
    println!(
        "[{case}] step-0 loss: graphed {} eager {} cpu {cpu} (rel to cpu: {:.2e}, {:.2e})",
        graphed.losses[0],
        eager.losses[0],
        ((graphed.losses[0] - cpu) / cpu).abs(),
        ((eager.losses[0] - cpu) / cpu).abs(),
    );
}

fn cpu_regression(step: usize) -> Regression<burn::backend::Flex> {
    Regression::new(step, 16, &Default::default())
}

/// BatchNorm: graphs; losses, parameters, running statistics and `valid()` outputs
/// equal eager training.
fn batch_norm_graphs_and_equals_eager<G: Stack>() {
    let steps = run_length(200);
    let fresh = BnMlp::<burn::backend::Flex>::new(32, &Default::default());
    let model = || on_gpu::<G, _, _>(fresh.clone(), BnMlp::new(32, &device()));
    let loss = |model: &BnMlp<B<G>>, batch: &Regression<B<G>>| model.loss(batch);
    phase("trainer");
    let (graphed_run, trainer) = graphed(model(), steps, regression::<G>, loss);
    assert_warmup_capture_replay(&graphed_run.modes);
    phase("plain");
    let (eager_run, eager_model) = eager(model(), steps, regression::<G>, loss, |m| m);
    println!("digest [batchnorm trainer] {}", digest(&graphed_run.losses));
    println!("digest [batchnorm plain] {}", digest(&eager_run.losses));
    let cpu = fresh.loss(&cpu_regression(0)).into_scalar();
    print_first_losses(&case::<G>("batchnorm mlp"), &graphed_run, &eager_run, cpu);
    check(&case::<G>("batchnorm mlp"), &graphed_run, &eager_run);
    let trained = trainer.model().expect("model");
    assert_eq!(
        trained.running_stats(),
        eager_model.running_stats(),
        "running statistics"
    );
    let probe = Regression::<burn_graph_capture::GraphCapture<G>>::new(999, 16, &device());
    let outputs = |m: &BnMlp<burn_graph_capture::GraphCapture<G>>| {
        values(m.forward(probe.x.clone()).flatten(0, 1))
    };
    assert_eq!(
        outputs(&trained.valid()),
        outputs(&eager_model.valid()),
        "valid() outputs"
    );
    let (mean, _) = trained.running_stats();
    assert!(mean.iter().any(|m| *m != 0.0), "the running mean moved");
}

/// A copy of `fresh` on the GPU, its tie restored (loading fills both fields apart).
fn tied_on_gpu<G: Stack>(fresh: &TiedMlp<burn::backend::Flex>) -> TiedMlp<B<G>> {
    let mut model = on_gpu::<G, _, _>(fresh.clone(), TiedMlp::new(&device()));
    model.retie();
    model
}

/// A parameter tied through two fields: graphs, stays tied, equals eager training.
fn tied_weights_graph_and_equal_eager<G: Stack>() {
    let steps = run_length(200);
    let fresh = TiedMlp::<burn::backend::Flex>::new(&Default::default());
    let model = || tied_on_gpu::<G>(&fresh);
    let loss = |model: &TiedMlp<B<G>>, batch: &Regression<B<G>>| model.loss(batch);
    phase("trainer");
    let (graphed_run, trainer) = graphed(model(), steps, regression::<G>, loss);
    assert_warmup_capture_replay(&graphed_run.modes);
    assert!(trainer.model().unwrap().tied());
    phase("plain");
    let (eager_run, _) = eager(
        model(),
        steps,
        regression::<G>,
        loss,
        |mut m: TiedMlp<B<G>>| {
            m.retie();
            m
        },
    );
    println!("digest [tied trainer] {}", digest(&graphed_run.losses));
    println!("digest [tied plain] {}", digest(&eager_run.losses));
    let cpu = fresh.loss(&cpu_regression(0)).into_scalar();
    print_first_losses(&case::<G>("tied mlp"), &graphed_run, &eager_run, cpu);
    check(&case::<G>("tied mlp"), &graphed_run, &eager_run);
}

/// The references themselves: plain eager training of the MLPs, run twice, gives the same
/// bits (else no comparison with them could be bit for bit).
fn eager_mlp_training_is_deterministic<G: Stack>() {
    let steps = run_length(200);
    let bn = BnMlp::<burn::backend::Flex>::new(32, &Default::default());
    let tied = TiedMlp::<burn::backend::Flex>::new(&Default::default());
    let bn_loss = |model: &BnMlp<B<G>>, batch: &Regression<B<G>>| model.loss(batch);
    let tied_loss = |model: &TiedMlp<B<G>>, batch: &Regression<B<G>>| model.loss(batch);
    let runs = |_: ()| {
        let bn_model = on_gpu::<G, _, _>(bn.clone(), BnMlp::new(32, &device()));
        let mut tied_model = on_gpu::<G, _, _>(tied.clone(), TiedMlp::new(&device()));
        tied_model.retie();
        let (bn_run, _) = eager(bn_model, steps, regression::<G>, bn_loss, |m| m);
        let (tied_run, _) = eager(
            tied_model,
            steps,
            regression::<G>,
            tied_loss,
            |mut m: TiedMlp<B<G>>| {
                m.retie();
                m
            },
        );
        (bn_run, tied_run)
    };
    phase("plain, first run");
    let first = runs(());
    phase("plain, second run");
    let second = runs(());
    println!("digest [batchnorm plain] {}", digest(&first.0.losses));
    println!("digest [tied plain] {}", digest(&first.1.losses));
    for (name, a, b) in [
        ("batchnorm", &first.0, &second.0),
        ("tied", &first.1, &second.1),
    ] {
        let diff = Diff::of(&a.losses, &b.losses);
        println!(
            "eager vs eager [{}]: losses {}, first difference at {:?}",
            case::<G>(name),
            diff.describe(),
            first_difference(&a.losses, &b.losses)
        );
        assert!(
            diff.bit_exact,
            "{name}: eager training is not deterministic"
        );
    }
}

/// How the first steps of `first_steps_vs_plain` are taken.
#[derive(Clone, Copy, Debug)]
enum FirstSteps {
    /// A trainer with capture off: no session, no pins; `Learner::train`, the
    /// write-back and the buffer registration (which resolves fusion tensors) only.
    CaptureOff,
    /// A trainer as configured by default: warmup steps, then a capture.
    CaptureOn,
    /// Plain eager code that also syncs the device after each optimizer step, before
    /// it reads the loss (as the trainer's buffer registration drains fusion there).
    PlainWithSyncs,
    /// Plain eager code that holds a clone of the model across each step (the trainer's
    /// buffer registry holds its parameters so), so no parameter is ever used for the
    /// last time inside the step: fusion may not update it in place.
    PlainHoldingParams,
}

/// What bisected issue 11's cold divergence (`bench/results/inputs-2026-12-01.md`):
/// run each variant first in a fresh process (the `cold` stage of `xtask gpu run`,
/// `COLD_FILTER=inputs::fused::first_steps_<variant>`), so that its first steps meet a
/// cold autotune cache and plain eager code then repeats them warm. A difference names
/// what the variant adds around a step that changes its kernels. (The cause found: plain
/// code's first step fused with the work its model's construction left queued, which the
/// trainer launches when it is built; the references now `materialize` first.)
fn first_steps_vs_plain<G: Stack>(variant: FirstSteps) {
    let steps = 4;
    let fresh = TiedMlp::<burn::backend::Flex>::new(&Default::default());
    let model = || tied_on_gpu::<G>(&fresh);
    let loss = |model: &TiedMlp<B<G>>, batch: &Regression<B<G>>| model.loss(batch);
    let retie = |mut m: TiedMlp<B<G>>| {
        m.retie();
        m
    };
    phase(&format!("{variant:?}"));
    let first: Vec<f32> = match variant {
        FirstSteps::CaptureOff | FirstSteps::CaptureOn => {
            let config =
                GraphTrainerConfig::new().with_capture(matches!(variant, FirstSteps::CaptureOn));
            let mut trainer = GraphTrainer::new(model(), adam::<G>(), loss, config);
            (0..steps)
                .map(|step| {
                    trainer.set_lr(lr_at(LR, step));
                    let outcome = trainer.step(regression::<G>(step)).expect("step");
                    outcome.output.into_scalar().elem::<f32>()
                })
                .collect()
        }
        FirstSteps::PlainWithSyncs => {
            let synced = |m: TiedMlp<B<G>>| {
                let m = retie(m);
                G::sync(&device()).expect("sync");
                m
            };
            eager(model(), steps, regression::<G>, loss, synced)
                .0
                .losses
        }
        FirstSteps::PlainHoldingParams => {
            let start = model();
            let mut held = vec![start.clone()];
            let holding = |m: TiedMlp<B<G>>| {
                let m = retie(m);
                held.push(m.clone());
                m
            };
            eager(start, steps, regression::<G>, loss, holding).0.losses
        }
    };
    phase("plain");
    let (plain, _) = eager(model(), steps, regression::<G>, loss, retie);
    println!("digest [{variant:?}] {}", digest(&first));
    println!("digest [plain] {}", digest(&plain.losses));
    let at = first_difference(&first, &plain.losses);
    println!(
        "{variant:?}: first steps {first:?}, plain {:?}, first difference {at:?}",
        plain.losses
    );
    assert_eq!(
        at, None,
        "{variant:?}: the first steps differ from plain eager code"
    );
}

fn first_steps_without_capture_equal_plain_eager<G: Stack>() {
    first_steps_vs_plain::<G>(FirstSteps::CaptureOff);
}

fn first_steps_with_capture_equal_plain_eager<G: Stack>() {
    first_steps_vs_plain::<G>(FirstSteps::CaptureOn);
}

fn first_steps_of_plain_code_with_syncs_equal_plain_eager<G: Stack>() {
    first_steps_vs_plain::<G>(FirstSteps::PlainWithSyncs);
}

fn first_steps_of_plain_code_holding_params_equal_plain_eager<G: Stack>() {
    first_steps_vs_plain::<G>(FirstSteps::PlainHoldingParams);
}

stack_tests!(
    first_steps_without_capture_equal_plain_eager,
    first_steps_with_capture_equal_plain_eager,
    first_steps_of_plain_code_with_syncs_equal_plain_eager,
    first_steps_of_plain_code_holding_params_equal_plain_eager,
    eager_mlp_training_is_deterministic,
    trainer_lends_back_its_model_unchanged,
    token_model_graphs_and_equals_eager,
    unlisted_tokens_equal_eager,
    a_constant_mask_replays_and_equals_eager,
    snapshots_keep_their_values,
    batch_norm_graphs_and_equals_eager,
    tied_weights_graph_and_equal_eager,
);
