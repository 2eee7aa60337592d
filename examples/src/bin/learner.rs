//! The sunspot LSTM trained through burn-train's `Learner` with this crate's
//! `GraphStrategy`: burn-train's renderer, metrics and checkpoints, graphed steps.
//!
//! `cargo run --release -p lstm-example --bin lstm-learner` (CPU: every step eager, with
//! the reason) or with `--features cuda` (warmup, capture, replays). `--compare` trains a
//! second time with capture off and checks that losses and final parameters are
//! bit-identical; `--stock` trains with stock Burn (burn-cuda on the GPU), burn-train's
//! own loop and Burn's Adam, and reports the largest loss difference and the speeds.

use std::sync::Arc;

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use clap::Parser;
use lstm_example::forecast::{self, Options};
use lstm_example::learner::{LearnerRun, train_with_learner, train_with_stock_learner};
use lstm_example::stacks::{Inner, Stock};
use lstm_example::sunspots::Sunspots;
use lstm_example::train::parameter_values;

/// Largest absolute and relative differences between two sequences.
fn differences(a: &[f32], b: &[f32]) -> (f32, f32) {
    a.iter().zip(b).fold((0.0, 0.0), |(abs, rel), (x, y)| {
        let d = (x - y).abs();
        (
            abs.max(d),
            rel.max(d / x.abs().max(y.abs()).max(f32::MIN_POSITIVE)),
        )
    })
}

fn flat<B: burn::prelude::Backend, M: Module<B>>(model: &M) -> Vec<f32> {
    parameter_values(model).concat()
}

fn describe<B: burn::prelude::Backend>(name: &str, run: &LearnerRun<B>) {
    println!(
        "{name}: {} steps in {:.1} s ({:.1} steps/s, validation included)",
        run.losses.len(),
        run.seconds,
        run.losses.len() as f64 / run.seconds.max(f64::EPSILON)
    );
}

fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    anyhow::ensure!(
        !options.fused,
        "--fused: lstm-learner trains nn::Lstm only, for now"
    );
    let series = Arc::new(Sunspots::load()?);
    let device = Default::default();
    std::fs::create_dir_all(&options.out)?;

    let dir = options.out.join("learner");
    let run = train_with_learner::<Inner>(&options, &series, !options.eager, &dir, &device)?;
    let eval = forecast::evaluate(&run.model, &series, options.seq_len, &device);
    println!(
        "held-out RMSE {:.2} sunspots (naive: {:.2})",
        eval.rmse, eval.naive_rmse
    );
    describe(if options.eager { "eager" } else { "graphed" }, &run);
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

    let mut failures = Vec::new();
    if options.compare {
        let eager_dir = options.out.join("learner-eager");
        let eager = train_with_learner::<Inner>(&options, &series, false, &eager_dir, &device)?;
        describe("eager (this crate)", &eager);
        let same_losses = run
            .losses
            .iter()
            .map(|l| l.to_bits())
            .eq(eager.losses.iter().map(|l| l.to_bits()));
        let same_params = flat(&run.model)
            .iter()
            .map(|p| p.to_bits())
            .eq(flat(&eager.model).iter().map(|p| p.to_bits()));
        println!(
            "graphed vs eager: losses bit-identical {same_losses}, final parameters bit-identical {same_params}"
        );
        if !same_losses {
            // Where the runs part, against the report's modes, says which step to look at.
            let differing: Vec<usize> = (0..run.losses.len().min(eager.losses.len()))
                .filter(|&i| run.losses[i].to_bits() != eager.losses[i].to_bits())
                .collect();
            let (loss_abs, loss_rel) = differences(&run.losses, &eager.losses);
            println!(
                "graphed vs eager: {} of {} logged losses differ, the first at step {:?} \
                 ({} vs {}); largest difference {loss_abs:e} (relative {loss_rel:e})",
                differing.len(),
                run.losses.len(),
                differing.first(),
                differing.first().map_or(f32::NAN, |&i| run.losses[i]),
                differing.first().map_or(f32::NAN, |&i| eager.losses[i]),
            );
        }
        if !(same_losses && same_params) {
            failures.push("the graphed and the eager Learner runs differ");
        }
    }
    if options.stock {
        let stock_dir = options.out.join("learner-stock");
        let stock =
            train_with_stock_learner::<Stock>(&options, &series, &stock_dir, &Default::default())?;
        describe("stock Burn, Burn's Adam", &stock);
        let (loss_abs, loss_rel) = differences(&run.losses, &stock.losses);
        let (param_abs, _) = differences(&flat(&run.model), &flat(&stock.model));
        let stock_eval =
            forecast::evaluate(&stock.model, &series, options.seq_len, &Default::default());
        println!(
            "graphed vs stock: largest loss difference {loss_abs:e} (relative {loss_rel:e}), \
             largest parameter difference {param_abs:e}; stock held-out RMSE {:.2}",
            stock_eval.rmse
        );
    }
    println!(
        "wrote learner-model.mpk, learner-report.json and burn-train's artifacts to {}",
        options.out.display()
    );
    anyhow::ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}
