//! The sunspot LSTM trained through burn-train's `Learner` with this crate's
//! `GraphStrategy`: burn-train's renderer, metrics and checkpoints, graphed steps.
//!
//! `cargo run --release -p lstm-example --bin lstm-learner` (CPU: every step eager, with
//! the reason) or with `--features cuda` (warmup, capture, replays). `--compare` trains a
//! second time with capture off and checks that both final models are bit-identical.

use std::sync::Arc;

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use clap::Parser;
use lstm_example::forecast::{self, Options};
use lstm_example::learner::train_with_learner;
use lstm_example::sunspots::Sunspots;
use lstm_example::train::parameter_bits;

#[cfg(not(feature = "cuda"))]
type Inner = burn::backend::Flex;
#[cfg(feature = "cuda")]
type Inner = burn_graph_capture::CudaFused;

fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    let series = Arc::new(Sunspots::load()?);
    let device = Default::default();
    std::fs::create_dir_all(&options.out)?;

    let graphed_dir = options.out.join("learner");
    let run =
        train_with_learner::<Inner>(&options, &series, !options.eager, &graphed_dir, &device)?;
    let eval = forecast::evaluate(&run.model, &series, options.seq_len, &device);
    println!(
        "held-out RMSE {:.2} sunspots (naive: {:.2}); training took {:.1} s",
        eval.rmse, eval.naive_rmse, run.seconds
    );
    if let Some(report) = &run.report {
        println!(
            "steps: {} captured, {} replayed, {} eager; fallbacks {:?}",
            report.modes.captured, report.modes.replayed, report.modes.eager, report.fallbacks
        );
        std::fs::write(
            options.out.join("learner-report.json"),
            serde_json::to_string_pretty(report)?,
        )?;
    }
    run.model.clone().save_file(
        options.out.join("learner-model"),
        &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
    )?;

    if options.compare {
        let eager = train_with_learner::<Inner>(
            &options,
            &series,
            false,
            &options.out.join("learner-eager"),
            &device,
        )?;
        let same = parameter_bits(&run.model) == parameter_bits(&eager.model);
        println!(
            "eager Learner run: {:.1} s; final parameters bit-identical to the graphed run: {same}",
            eager.seconds
        );
        anyhow::ensure!(same, "the graphed and the eager Learner runs differ");
    }
    println!(
        "wrote learner-model.mpk, learner-report.json and burn-train's artifacts to {}",
        options.out.display()
    );
    Ok(())
}
