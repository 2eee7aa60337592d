//! The sunspot model trained through burn-train's `Learner`, with this crate's
//! [`GraphStrategy`] running each step.
//!
//! The model keeps ordinary burn-train code: a `TrainStep` and an `InferenceStep`
//! returning `RegressionOutput`, a `Batcher`, dataloaders, metrics and a checkpointer.
//! Switching to graphs takes the backend type, the capturable optimizer the strategy
//! shares with the `Learner`, and the strategy.

use std::path::Path;
use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::optim::AdamConfig;
use burn::prelude::*;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::AutodiffBackend;
use burn::train::metric::{LearningRateMetric, LossMetric};
use burn::train::{
    InferenceStep, Learner, RegressionOutput, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::train::GraphStrategy;
use burn_graph_capture::{
    GraphBackend, GraphCapture, GraphTrainerConfig, TrainBackend, TrainerReport,
};

use crate::forecast::Options;
use crate::sunspots::Sunspots;
use crate::train::from_bytes;
use crate::{Batch, LstmRegressor};

impl<B: Backend> LstmRegressor<B> {
    /// Predictions and targets flattened to `[batch * time, 1]`, with the MSE loss.
    pub fn regression(&self, batch: Batch<B>) -> RegressionOutput<B> {
        let [batch_size, time, _] = batch.y.dims();
        let output = self.forward(batch.x).reshape([batch_size * time, 1]);
        let targets = batch.y.reshape([batch_size * time, 1]);
        let loss = (output.clone() - targets.clone()).powi_scalar(2).mean();
        RegressionOutput::new(loss, output, targets)
    }
}

impl<B: AutodiffBackend> TrainStep for LstmRegressor<B> {
    type Input = Batch<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Batch<B>) -> TrainOutput<RegressionOutput<B>> {
        let item = self.regression(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for LstmRegressor<B> {
    type Input = Batch<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Batch<B>) -> RegressionOutput<B> {
        self.regression(batch)
    }
}

/// Builds batches of windows from their start months.
#[derive(Clone)]
pub struct WindowBatcher {
    series: Arc<Sunspots>,
    seq_len: usize,
}

impl WindowBatcher {
    /// Batches windows of `seq_len` months of `series`.
    pub fn new(series: Arc<Sunspots>, seq_len: usize) -> Self {
        Self { series, seq_len }
    }
}

impl<B: Backend> Batcher<B, usize, Batch<B>> for WindowBatcher {
    fn batch(&self, starts: Vec<usize>, device: &B::Device) -> Batch<B> {
        self.series.batch(&starts, self.seq_len, device)
    }
}

/// What a `Learner` run gives back.
pub struct LearnerRun<B: Backend> {
    /// The training loss of every step, as burn-train's metric logger wrote it.
    pub losses: Vec<f32>,
    /// The trained model (inference backend).
    pub model: LstmRegressor<B>,
    /// What the strategy's trainer did.
    pub report: Option<TrainerReport>,
    /// Wall time of `launch`, in seconds (validation included).
    pub seconds: f64,
}

/// Trains the sunspot model on `G` through burn-train's `Learner` and [`GraphStrategy`]
/// (`capture = false` runs the same strategy eagerly); artifacts go to `dir`.
pub fn train_with_learner<G: GraphBackend>(
    options: &Options,
    series: &Arc<Sunspots>,
    capture: bool,
    dir: &Path,
    device: &G::Device,
) -> anyhow::Result<LearnerRun<GraphCapture<G>>>
where
    LstmRegressor<TrainBackend<G>>: std::fmt::Display,
{
    type B<G> = TrainBackend<G>;
    let (train, valid) = loaders::<B<G>>(options, series)?;
    let model = from_bytes::<B<G>>(&options.model_config(), options.initial_weights(), device);
    let strategy = GraphStrategy::<G, _>::new(CapturableAdamConfig::new().init::<B<G>>(device))
        .with_config(GraphTrainerConfig::new().with_capture(capture));
    let started = std::time::Instant::now();
    let result = SupervisedTraining::new(dir, train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .metric_train_numeric(LearningRateMetric::new())
        .with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new())
        .num_epochs(options.epochs)
        .summary()
        .with_training_strategy(strategy.clone().into())
        .launch(Learner::new(model, strategy.optimizer(), options.lr));
    Ok(LearnerRun {
        losses: logged_losses(dir, options.epochs)?,
        model: result.model,
        report: strategy.report(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The same training with stock Burn on `S`: burn-train's own loop and Burn's Adam.
pub fn train_with_stock_learner<S: AutodiffBackend>(
    options: &Options,
    series: &Arc<Sunspots>,
    dir: &Path,
    device: &S::Device,
) -> anyhow::Result<LearnerRun<S::InnerBackend>>
where
    LstmRegressor<S>: std::fmt::Display,
{
    let (train, valid) = loaders::<S>(options, series)?;
    let model = from_bytes::<S>(&options.model_config(), options.initial_weights(), device);
    let started = std::time::Instant::now();
    let result = SupervisedTraining::new(dir, train, valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .num_epochs(options.epochs)
        .summary()
        .launch(Learner::new(model, AdamConfig::new().init(), options.lr));
    Ok(LearnerRun {
        losses: logged_losses(dir, options.epochs)?,
        model: result.model,
        report: None,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A dataloader of window batches on backend `B`.
type Loader<B> = Arc<dyn DataLoader<B, Batch<B>>>;

/// Training windows (shuffled by the seed) and held-out validation windows.
fn loaders<S: AutodiffBackend>(
    options: &Options,
    series: &Arc<Sunspots>,
) -> anyhow::Result<(Loader<S>, Loader<S::InnerBackend>)> {
    let batcher = WindowBatcher::new(Arc::clone(series), options.seq_len);
    let train_starts = series.window_starts(options.seq_len, 1)?;
    let valid_starts = series.held_out_starts(options.seq_len, options.seq_len)?;
    let train = DataLoaderBuilder::<S, _, _>::new(batcher.clone())
        .batch_size(options.batch)
        .shuffle(options.seed)
        .build(InMemDataset::new(train_starts));
    let valid = DataLoaderBuilder::<S::InnerBackend, _, _>::new(batcher)
        .batch_size(options.batch)
        .build(InMemDataset::new(valid_starts));
    Ok((train, valid))
}

/// The per-step training losses burn-train's file logger wrote under `dir`, in order.
pub fn logged_losses(dir: &Path, epochs: usize) -> anyhow::Result<Vec<f32>> {
    let mut losses = Vec::new();
    for epoch in 1..=epochs {
        let path = dir
            .join("train")
            .join(format!("epoch-{epoch}"))
            .join("Loss.log");
        let Ok(text) = std::fs::read_to_string(&path) else {
            break; // training stopped before this epoch
        };
        for line in text.lines() {
            let value = line.split(',').next().unwrap_or_default();
            let value: f64 = value
                .parse()
                .map_err(|_| anyhow::anyhow!("{}: unexpected line {line:?}", path.display()))?;
            losses.push(value as f32);
        }
    }
    Ok(losses)
}
