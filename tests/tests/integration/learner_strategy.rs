//! burn-train's `Learner` with `GraphStrategy` (feature `train`), on the CPU: the same
//! training as burn-train's own single-device loop, bit for bit, with checkpoints,
//! resumption, gradient accumulation and interruption.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::backend::Flex;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::train::metric::LossMetric;
use burn::train::renderer::CliMetricsRenderer;
use burn::train::{Learner, LearningComponentsMarker, SupervisedTraining};
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::train::GraphStrategy;
use burn_graph_capture::{GraphCapture, TrainBackend, TrainerReport};
use lstm_example::learner::WindowBatcher;
use lstm_example::sunspots::Sunspots;
use lstm_example::train::{from_bytes, parameter_bits, to_bytes};
use lstm_example::{Batch, LstmRegressor, LstmRegressorConfig};

type B = TrainBackend<Flex>;
type Inner = GraphCapture<Flex>;

type Loader<T> = Arc<dyn DataLoader<T, Batch<T>>>;

const SEQ_LEN: usize = 8;
const BATCH: usize = 8;
const LR: f64 = 1e-2;

/// How a run is set up.
#[derive(Clone, Default)]
struct Setup {
    epochs: usize,
    accumulate: Option<usize>,
    resume_from: Option<usize>,
    interrupt: bool,
}

fn config() -> LstmRegressorConfig {
    LstmRegressorConfig::new(8).with_d_input(1)
}

fn initial_model() -> LstmRegressor<B> {
    use std::sync::OnceLock;
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    let bytes = BYTES.get_or_init(|| to_bytes(config().init::<Flex>(&Default::default())));
    from_bytes::<B>(&config(), bytes.clone(), &Default::default())
}

/// 40 training windows (5 batches) and 16 validation windows, unshuffled, so a resumed
/// run sees the batches an uninterrupted one does.
fn loaders() -> (Loader<B>, Loader<Inner>) {
    let series = Arc::new(Sunspots::load().unwrap());
    let batcher = WindowBatcher::new(Arc::clone(&series), SEQ_LEN);
    let starts = series.window_starts(SEQ_LEN, 16).unwrap();
    let train = DataLoaderBuilder::<B, _, _>::new(batcher.clone())
        .batch_size(BATCH)
        .build(InMemDataset::new(starts[..40].to_vec()));
    let valid = DataLoaderBuilder::<Inner, _, _>::new(batcher)
        .batch_size(BATCH)
        .build(InMemDataset::new(starts[40..56].to_vec()));
    (train, valid)
}

fn builder<O>(
    dir: &Path,
    setup: &Setup,
) -> SupervisedTraining<LearningComponentsMarker<B, f64, LstmRegressor<B>, O>>
where
    O: Optimizer<LstmRegressor<B>, B> + 'static,
{
    let (train, valid) = loaders();
    let mut builder = SupervisedTraining::new(dir, train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .renderer(CliMetricsRenderer::new())
        .with_application_logger(None)
        .with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new())
        .num_epochs(setup.epochs);
    if let Some(every) = setup.accumulate {
        builder = builder.grads_accumulation(every);
    }
    if let Some(epoch) = setup.resume_from {
        builder = builder.checkpoint(epoch);
    }
    if setup.interrupt {
        builder.interrupter().stop(Some("asked by the test"));
    }
    builder
}

/// Trains with `GraphStrategy`; the final parameters' bits and the strategy's report.
fn graphed(dir: &Path, setup: &Setup) -> (Vec<Vec<u32>>, Option<TrainerReport>) {
    let strategy =
        GraphStrategy::<Flex, _>::new(CapturableAdamConfig::new().init::<B>(&Default::default()));
    let result = builder(dir, setup)
        .with_training_strategy(strategy.clone().into())
        .launch(Learner::new(initial_model(), strategy.optimizer(), LR));
    (parameter_bits(&result.model), strategy.report())
}

/// Trains with burn-train's own single-device loop and the same capturable optimizer.
fn stock(dir: &Path, setup: &Setup) -> Vec<Vec<u32>> {
    let optimizer = CapturableAdamConfig::new().init::<B>(&Default::default());
    let result = builder(dir, setup).launch(Learner::new(initial_model(), optimizer, LR));
    parameter_bits(&result.model)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("learner-strategy-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn the_strategy_trains_as_burn_trains_own_loop() {
    let _rng = crate::common::rng::shared();
    let setup = Setup {
        epochs: 2,
        ..Setup::default()
    };
    let (ours, report) = graphed(&temp_dir("ours"), &setup);
    assert_eq!(ours, stock(&temp_dir("stock"), &setup));
    assert_ne!(
        ours,
        parameter_bits(&initial_model()),
        "training changed the model"
    );
    let report = report.expect("a report after training");
    assert_eq!(report.steps, 10, "5 batches in each of 2 epochs");
    assert_eq!(report.fallbacks.get("Warmup"), Some(&3), "{report:?}");
    assert_eq!(
        report.fallbacks.get("NoHardwareGraphs"),
        Some(&7),
        "{report:?}"
    );
}

#[test]
fn checkpoints_hold_the_strategys_optimizer_and_resume_exactly() {
    let _rng = crate::common::rng::shared();
    let straight = graphed(
        &temp_dir("straight"),
        &Setup {
            epochs: 2,
            ..Setup::default()
        },
    )
    .0;
    let dir = temp_dir("resumed");
    let first = graphed(
        &dir,
        &Setup {
            epochs: 1,
            ..Setup::default()
        },
    )
    .0;
    assert!(
        dir.join("checkpoint").join("optim-1.mpk").exists(),
        "the optimizer was checkpointed"
    );
    let resumed = Setup {
        epochs: 2,
        resume_from: Some(1),
        ..Setup::default()
    };
    let (second, report) = graphed(&dir, &resumed);
    assert_ne!(first, second);
    assert_eq!(
        second, straight,
        "epoch 2 resumed from the checkpoint of epoch 1"
    );
    assert_eq!(report.unwrap().steps, 5, "only epoch 2 ran");
}

#[test]
fn gradient_accumulation_falls_back_to_burn_trains_loop_with_its_reason() {
    let _rng = crate::common::rng::shared();
    let setup = Setup {
        epochs: 1,
        accumulate: Some(2),
        ..Setup::default()
    };
    let (ours, report) = graphed(&temp_dir("accumulate"), &setup);
    assert_eq!(ours, stock(&temp_dir("accumulate-stock"), &setup));
    let report = report.unwrap();
    assert_eq!(
        report.fallbacks.get("GradientAccumulation"),
        Some(&5),
        "{report:?}"
    );
    assert_eq!(report.modes.eager, 5);
}

#[test]
fn an_interrupted_training_stops_after_the_step_in_flight() {
    let _rng = crate::common::rng::shared();
    let setup = Setup {
        epochs: 2,
        interrupt: true,
        ..Setup::default()
    };
    let (params, report) = graphed(&temp_dir("interrupt"), &setup);
    assert_eq!(report.unwrap().steps, 1);
    assert_ne!(params, parameter_bits(&initial_model()));
}
