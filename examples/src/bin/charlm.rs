//! A character-level language model (`Embedding` + `nn::Lstm` + `Linear`, int token
//! inputs) trained on Shakespeare's Sonnets with `GraphTrainer`.
//!
//! `cargo run --release -p lstm-example --bin charlm` (CPU) or with `--features cuda`
//! (graphed). Prints held-out bits per character against the unigram baseline, and
//! writes `charlm-model.mpk` and `charlm-report.json` into `--out`.

use std::path::PathBuf;
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::prelude::*;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::{GraphTrainer, GraphTrainerConfig, TrainBackend};
use clap::Parser;
use indicatif::ProgressBar;
use lstm_example::stacks::Inner;
use lstm_example::text::{Corpus, sampler};
use lstm_example::train::{load_bytes, to_bytes};
use lstm_example::{CharLm, CharLmConfig, TokenBatch};

type B = TrainBackend<Inner>;

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "Train a character-level LSTM language model on Shakespeare's Sonnets")]
struct Options {
    /// Optimizer steps.
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Windows per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Characters per window (time steps the LSTM unrolls).
    #[arg(long, default_value_t = 64)]
    seq_len: usize,
    /// Hidden size of the LSTM.
    #[arg(long, default_value_t = 128)]
    hidden: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seeds the weights and the windows.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Where the model and the report go.
    #[arg(long, default_value = "target/charlm")]
    out: PathBuf,
    /// Run every step eagerly (no capture).
    #[arg(long)]
    eager: bool,
}

fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    let corpus = Corpus::sonnets();
    let device = Default::default();
    println!(
        "sonnets: {} characters, vocabulary {}; LSTM hidden {}, windows of {}, batch {}, {} steps, on {}",
        corpus.ids.len(),
        corpus.vocab.len(),
        options.hidden,
        options.seq_len,
        options.batch,
        options.steps,
        std::any::type_name::<Inner>()
    );

    let config = CharLmConfig::new(corpus.vocab.len(), options.hidden);
    burn::backend::Flex::seed(&Default::default(), options.seed);
    let weights = to_bytes(config.init::<burn::backend::Flex>(&Default::default()));
    let model = load_bytes(config.init::<B>(&device), weights, &device);
    let optimizer = CapturableAdamConfig::new()
        .with_learning_rate(options.lr)
        .init::<B>(&device);
    let loss = |model: &CharLm<B>, batch: &TokenBatch<B>| {
        model.loss(batch.tokens.clone(), batch.targets.clone())
    };
    let trainer_config = GraphTrainerConfig::new().with_capture(!options.eager);
    let mut trainer = GraphTrainer::new(model, optimizer, loss, trainer_config);

    let mut rng = sampler(options.seed);
    let progress = ProgressBar::new(options.steps as u64);
    let started = Instant::now();
    for _ in 0..options.steps {
        let batch = corpus.batch::<B>(&mut rng, options.batch, options.seq_len, &device);
        let outcome = trainer.step(batch)?;
        let loss: f32 = outcome.output.into_scalar().elem();
        progress.set_message(format!("loss {loss:.3} ({})", outcome.mode.kind()));
        progress.inc(1);
    }
    let seconds = started.elapsed().as_secs_f64();
    progress.finish();

    let model = trainer
        .model()
        .expect("the trainer holds the model")
        .valid();
    let eval = corpus.evaluate(&model, options.seq_len, &device);
    let report = trainer.report();
    println!(
        "held-out: {:.3} bits per character (unigram baseline {:.3}) over {} characters",
        eval.bits_per_char, eval.unigram_bits_per_char, eval.chars
    );
    println!(
        "{} steps in {seconds:.1} s ({:.1} steps/s); {} captured, {} replayed, {} eager",
        options.steps,
        options.steps as f64 / seconds,
        report.modes.captured,
        report.modes.replayed,
        report.modes.eager
    );
    std::fs::create_dir_all(&options.out)?;
    model.save_file(
        options.out.join("charlm-model"),
        &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
    )?;
    std::fs::write(
        options.out.join("charlm-report.json"),
        serde_json::to_string_pretty(&serde_json::json!({ "eval": eval, "report": report }))?,
    )?;
    println!(
        "wrote charlm-model.mpk and charlm-report.json to {}",
        options.out.display()
    );
    Ok(())
}
