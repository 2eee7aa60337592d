//! The sunspot example's training run: options, the graphed (or eager) training loop,
//! evaluation and the files it writes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use burn::module::AutodiffModule;
use burn::nn::DropoutConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::prelude::*;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::AutodiffBackend;
use burn_graph_capture::nn::{GruBackend, LstmBackend};
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{
    GraphBackend, GraphCapture, GraphTrainer, GraphTrainerConfig, StepMode, TrainBackend,
    TrainerReport,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::model::{DropoutLstmRegressor, Forecaster, GruRegressor, GruRegressorConfig};
use crate::sunspots::{Evaluation, Sunspots, shuffler};
use crate::train::{from_bytes, load_bytes, to_bytes};
use crate::{Batch, LstmRegressor, LstmRegressorConfig};

/// Command-line options shared by the example's binaries.
#[derive(clap::Parser, Clone, Debug, Serialize)]
#[command(about = "Forecast monthly sunspot numbers with an LSTM trained as CUDA graphs")]
pub struct Options {
    /// Passes over the training windows.
    #[arg(long, default_value_t = 3)]
    pub epochs: usize,
    /// Windows per batch (a partial last batch is dropped).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Months per training window (time steps the LSTM unrolls).
    #[arg(long, default_value_t = 64)]
    pub seq_len: usize,
    /// Hidden size of the LSTM.
    #[arg(long, default_value_t = 32)]
    pub hidden: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Seeds the weights and the window order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Where the model, the plot and the JSON files go.
    #[arg(long, default_value = "target/sunspots")]
    pub out: PathBuf,
    /// Run every step eagerly (no capture).
    #[arg(long)]
    pub eager: bool,
    /// Also train eagerly from the same start and overlay both loss curves.
    #[arg(long, conflicts_with = "eager")]
    pub compare: bool,
    /// Also train with stock Burn (burn-cuda with `--features cuda`, else Flex) and
    /// Burn's own Adam, from the same start on the same batches.
    #[arg(long)]
    pub stock: bool,
    /// Train the model with `FusedLstm` (the batched LSTM) in place of `nn::Lstm`, from
    /// the same weights.
    #[arg(long)]
    pub fused: bool,
    /// Train two `FusedLstm` layers with this dropout probability between them (the
    /// first layer and the head from the same weights; masks drawn on the device, so the
    /// steps still graph). Stock Burn (`--stock`) still trains one `nn::Lstm` layer.
    #[arg(long, conflicts_with = "fused")]
    pub dropout: Option<f64>,
    /// Train a `FusedGru` of the same hidden size (and a head) in place of the LSTM, with
    /// weights drawn from the seed. Stock Burn (`--stock`) still trains `nn::Lstm`.
    #[arg(long, conflicts_with_all = ["fused", "dropout"])]
    pub gru: bool,
}

impl Options {
    /// The model these options describe (one input feature: the standardized month).
    pub fn model_config(&self) -> LstmRegressorConfig {
        LstmRegressorConfig::new(self.hidden).with_d_input(1)
    }

    /// Initial weights drawn from `seed`, as record bytes, so every run starts equal.
    pub fn initial_weights(&self) -> Vec<u8> {
        use burn::backend::Flex;
        Flex::seed(&Default::default(), self.seed);
        to_bytes(self.model_config().init::<Flex>(&Default::default()))
    }
}

/// One training run's outcome; `M` is the trained model.
pub struct Run<M> {
    /// How it trained, for legends and logs.
    pub label: String,
    /// The trained model.
    pub model: M,
    /// The loss of every step, in order.
    pub losses: Vec<f32>,
    /// Held-out errors.
    pub eval: Evaluation,
    /// Wall time of the training loop (evaluation excluded).
    pub seconds: f64,
    /// Steps after the first [`UNTIMED_STEPS`], and their wall time: the speed.
    pub timed: (usize, f64),
    /// What the trainer did, step by step (`None` for stock Burn).
    pub report: Option<TrainerReport>,
}

/// Steps left out of the speed: the trainer's warmup, capture and first replay, and the
/// kernel compiles and autotuning that the first run of a process pays for later ones.
pub const UNTIMED_STEPS: usize = 8;

impl<M> Run<M> {
    /// Training steps per second after the first [`UNTIMED_STEPS`] (over the whole loop
    /// when it is shorter).
    pub fn steps_per_second(&self) -> f64 {
        let (steps, seconds) = match self.timed {
            (0, _) => (self.losses.len(), self.seconds),
            timed => timed,
        };
        steps as f64 / seconds.max(f64::EPSILON)
    }
}

/// The model these options start from, on `B`: `nn::Lstm`, or (`--fused`) the same
/// weights in `FusedLstm`.
pub fn initial_model<B: Backend>(options: &Options, device: &B::Device) -> LstmRegressor<B> {
    from_bytes::<B>(&options.model_config(), options.initial_weights(), device)
}

/// `--dropout p`'s model: `initial`'s layer (as `FusedLstm`) and head, dropout `p`, and a
/// second layer drawn from the options' seed.
pub fn with_dropout<B: LstmBackend>(
    options: &Options,
    initial: LstmRegressor<B>,
    p: f64,
    device: &B::Device,
) -> anyhow::Result<DropoutLstmRegressor<B>> {
    use burn::backend::Flex;
    let first = initial.to_fused()?;
    let config = LstmRegressorConfig::new(options.hidden).with_d_input(options.hidden);
    Flex::seed(&Default::default(), options.seed.wrapping_add(1));
    let second = to_bytes(config.init::<Flex>(&Default::default()));
    let second = from_bytes::<B>(&config, second, device).to_fused()?;
    Ok(DropoutLstmRegressor {
        first: first.lstm,
        dropout: DropoutConfig::new(p).init(),
        second: second.lstm,
        head: first.head,
    })
}

/// `--gru`'s model: a `FusedGru` of the options' hidden size and a head, drawn from the
/// options' seed (through record bytes, as [`Options::initial_weights`]).
pub fn gru_model<B: GruBackend>(options: &Options, device: &B::Device) -> GruRegressor<B> {
    use burn::backend::Flex;
    let config = GruRegressorConfig::new(options.hidden).with_d_input(1);
    Flex::seed(&Default::default(), options.seed);
    let bytes = to_bytes(config.init::<Flex>(&Default::default()));
    load_bytes(config.init(device), bytes, device)
}

/// Trains `model` with `GraphTrainer` on `G` (graphed unless `capture` is false).
pub fn train<G, M>(
    options: &Options,
    series: &Sunspots,
    model: M,
    capture: bool,
    label: &str,
) -> anyhow::Result<Run<M>>
where
    G: GraphBackend,
    M: AutodiffModule<TrainBackend<G>> + Forecaster<TrainBackend<G>>,
    M::InnerModule: Forecaster<GraphCapture<G>>,
{
    let device = model.devices().into_iter().next().unwrap_or_default();
    let device = &device;
    let optimizer = CapturableAdamConfig::new()
        .with_learning_rate(options.lr)
        .init::<TrainBackend<G>>(device);
    let loss =
        |model: &M, batch: &Batch<TrainBackend<G>>| model.mse(batch.x.clone(), batch.y.clone());
    let config = GraphTrainerConfig::new().with_capture(capture);
    // Every run's trainer takes the same generator stream (dropout masks): the first after
    // this seeding.
    TrainBackend::<G>::seed(device, options.seed);
    let mut trainer = GraphTrainer::new(model, optimizer, loss, config);

    let (losses, seconds, timed) = epochs(options, series, label, device, |batch| {
        let outcome = trainer.step(batch)?;
        if let StepMode::Eager(reason) = &outcome.mode {
            tracing::debug!(%reason, "eager step");
        }
        let loss: f32 = outcome.output.into_scalar().elem();
        Ok((loss, format!(" ({})", outcome.mode.kind())))
    })?;

    let model = trainer
        .model()
        .context("the trainer holds the model")?
        .clone();
    let eval = evaluate(&model.valid(), series, options.seq_len, device);
    Ok(Run {
        label: label.to_owned(),
        model,
        losses,
        eval,
        seconds,
        timed,
        report: Some(trainer.report()),
    })
}

/// Trains `nn::Lstm` with stock Burn on `S` and Burn's own Adam: the same initial
/// weights, batches and learning rate as [`train`], no graphs, no capturable optimizer.
pub fn train_stock<S: AutodiffBackend>(
    options: &Options,
    series: &Sunspots,
    device: &S::Device,
) -> anyhow::Result<Run<LstmRegressor<S>>> {
    let mut model = initial_model::<S>(options, device);
    let mut optimizer = AdamConfig::new().init::<S, LstmRegressor<S>>();
    let (losses, seconds, timed) = epochs(options, series, "stock", device, |batch| {
        let loss = model.loss(batch.x, batch.y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(options.lr, model.clone(), grads);
        Ok((loss.into_scalar().elem(), String::new()))
    })?;
    let eval = evaluate(&model.valid(), series, options.seq_len, device);
    Ok(Run {
        label: "stock".to_owned(),
        model,
        losses,
        eval,
        seconds,
        timed,
        report: None,
    })
}

/// `options.epochs` epochs of shuffled full batches, each trained by `step`, which returns
/// the step's loss and a note for the progress bar. Returns every loss, the loop's wall
/// time, and the steps after the first [`UNTIMED_STEPS`] with their wall time.
fn epochs<B: Backend>(
    options: &Options,
    series: &Sunspots,
    label: &str,
    device: &B::Device,
    mut step: impl FnMut(Batch<B>) -> anyhow::Result<(f32, String)>,
) -> anyhow::Result<(Vec<f32>, f64, (usize, f64))> {
    let mut rng = shuffler(options.seed);
    let per_epoch = series
        .epoch(options.seq_len, options.batch, &mut shuffler(0))?
        .len();
    anyhow::ensure!(
        per_epoch > 0,
        "no full batch of {} windows fits the training split",
        options.batch
    );
    let progress = progress_bar((per_epoch * options.epochs) as u64, label);
    let mut losses = Vec::new();
    let start = Instant::now();
    let mut timed_from = None;
    for _ in 0..options.epochs {
        for starts in series.epoch(options.seq_len, options.batch, &mut rng)? {
            if losses.len() == UNTIMED_STEPS {
                timed_from = Some(Instant::now());
            }
            // Each step returns its loss on the host, so a step's time is its own.
            let (loss, note) = step(series.batch(&starts, options.seq_len, device))?;
            losses.push(loss);
            progress.set_message(format!("loss {loss:.4}{note}"));
            progress.inc(1);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let timed = timed_from.map_or((0, 0.0), |from| {
        (losses.len() - UNTIMED_STEPS, from.elapsed().as_secs_f64())
    });
    progress.finish();
    Ok((losses, seconds, timed))
}

/// Forecasts every held-out month (with `context` months of warm-up before the split).
pub fn evaluate<B: Backend, M: Forecaster<B>>(
    model: &M,
    series: &Sunspots,
    context: usize,
    device: &B::Device,
) -> Evaluation {
    let input = series.held_out_input::<B>(context, device);
    let changes = model.predict(input).into_data().convert::<f32>();
    series.evaluate(context, &changes.to_vec::<f32>().expect("converted to f32"))
}

fn progress_bar(steps: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    let style = ProgressStyle::with_template(
        "{prefix:>8} [{elapsed_precise}] {bar:30} {pos}/{len} {per_sec} {msg}",
    )
    .expect("a valid template");
    bar.set_style(style);
    bar.set_prefix(label.to_owned());
    bar
}

/// What `summary.json` holds: the options, the held-out metric and the speed.
#[derive(Debug, Serialize)]
pub struct Summary<'a> {
    /// The run's options.
    pub options: &'a Options,
    /// The inner backend's type name.
    pub backend: &'a str,
    /// Held-out errors of the trained model.
    pub eval: Evaluation,
    /// Training steps run.
    pub steps: usize,
    /// Training steps per second.
    pub steps_per_second: f64,
    /// The last step's loss.
    pub final_loss: Option<f32>,
    /// With `--compare`: the eager run against the graphed one.
    pub eager_comparison: Option<Comparison>,
    /// With `--stock`: stock Burn with Burn's Adam against the graphed run.
    pub stock_comparison: Option<Comparison>,
}

/// The graphed run against another run of the same training.
#[derive(Debug, Serialize)]
pub struct Comparison {
    /// The other run's training steps per second.
    pub steps_per_second: f64,
    /// The graphed run's speed over the other's.
    pub speedup: f64,
    /// Largest difference between the two loss curves.
    pub max_loss_difference: f32,
    /// Largest difference relative to the loss, `|a - b| / max(|a|, |b|)`.
    pub max_relative_loss_difference: f32,
    /// Whether every loss is bit-identical.
    pub bit_exact: bool,
    /// The other run's held-out errors.
    pub eval: Evaluation,
}

impl Comparison {
    /// Compares `graphed` with `other`.
    pub fn of<M, N>(graphed: &Run<M>, other: &Run<N>) -> Self {
        let pairs = || graphed.losses.iter().zip(&other.losses);
        let relative =
            |(a, b): (&f32, &f32)| (a - b).abs() / a.abs().max(b.abs()).max(f32::MIN_POSITIVE);
        Self {
            steps_per_second: other.steps_per_second(),
            speedup: graphed.steps_per_second() / other.steps_per_second().max(f64::EPSILON),
            max_loss_difference: pairs().map(|(a, b)| (a - b).abs()).fold(0.0, f32::max),
            max_relative_loss_difference: pairs().map(relative).fold(0.0, f32::max),
            bit_exact: graphed.losses.len() == other.losses.len()
                && pairs().all(|(a, b)| a.to_bits() == b.to_bits()),
            eval: other.eval,
        }
    }
}

/// Writes `model.mpk`, `report.json` and `summary.json` into `out`.
pub fn save<B: Backend, M: Module<B>>(
    out: &Path,
    run: &Run<M>,
    summary: &Summary<'_>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
    run.model
        .clone()
        .save_file(out.join("model"), &recorder)
        .context("saving the model")?;
    if let Some(report) = &run.report {
        write_json(&out.join("report.json"), report)?;
    }
    write_json(&out.join("summary.json"), summary)
}

fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(value)?;
    std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))
}
