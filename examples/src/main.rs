//! Forecasts monthly sunspot numbers with an LSTM trained by `GraphTrainer`.
//!
//! `cargo run --release -p lstm-example` trains on the CPU (Flex): every step runs
//! eagerly, and the report says why (`NoHardwareGraphs` after warmup).
//! `cargo run --release -p lstm-example --features cuda` trains on an NVIDIA GPU through
//! this crate's runtime with Burn's fusion on top (`CudaFused`): warmup, one captured
//! step, then replays. `--compare` also trains eagerly through this crate, `--stock`
//! with stock Burn and Burn's Adam; the plot overlays every curve. `--fused` trains the
//! same weights with `FusedLstm` in place of `nn::Lstm`; `--dropout P` trains two
//! `FusedLstm` layers with dropout P between them, and still graphs; `--gru` trains a
//! `FusedGru` of the same hidden size (weights drawn from the seed) instead.
//!
//! It writes `model.mpk`, `loss.svg`, `report.json` and `summary.json` into `--out`.

use burn::module::AutodiffModule;
use burn_graph_capture::{GraphCapture, TrainBackend};
use clap::Parser;
use lstm_example::forecast::{self, Comparison, Options, Summary, UNTIMED_STEPS};
use lstm_example::model::Forecaster;
use lstm_example::plot::{self, Curve};
use lstm_example::stacks::{Inner, Stock};
use lstm_example::sunspots::Sunspots;

fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    let series = Sunspots::load()?;
    let device = Default::default();
    println!(
        "sunspots: {} months ({} train, {} held out); {} hidden {}, windows of {} months, \
         batch {}, {} epochs, on {}",
        series.raw.len(),
        series.split,
        series.raw.len() - series.split,
        match (options.dropout, options.fused, options.gru) {
            (Some(_), _, _) => "two FusedLstm layers with dropout between them,",
            (None, _, true) => "FusedGru",
            (None, true, _) => "FusedLstm",
            (None, false, false) => "nn::Lstm",
        },
        options.hidden,
        options.seq_len,
        options.batch,
        options.epochs,
        std::any::type_name::<Inner>(),
    );
    if options.gru {
        let gru = forecast::gru_model::<TrainBackend<Inner>>(&options, &device);
        return run(&options, &series, gru);
    }
    let initial = forecast::initial_model::<TrainBackend<Inner>>(&options, &device);
    match options.dropout {
        Some(p) => run(
            &options,
            &series,
            forecast::with_dropout(&options, initial, p, &device)?,
        ),
        None if options.fused => run(&options, &series, initial.to_fused()?),
        None => run(&options, &series, initial),
    }
}

/// Trains `initial` graphed (and, as asked, eagerly and with stock Burn), then plots,
/// saves and prints.
fn run<M>(options: &Options, series: &Sunspots, initial: M) -> anyhow::Result<()>
where
    M: AutodiffModule<TrainBackend<Inner>> + Forecaster<TrainBackend<Inner>>,
    M::InnerModule: Forecaster<GraphCapture<Inner>>,
{
    let label = if options.eager { "eager" } else { "graphed" };
    let capture = !options.eager;
    let graphed = forecast::train::<Inner, M>(options, series, initial.clone(), capture, label)?;
    let eager = options
        .compare
        .then(|| forecast::train::<Inner, M>(options, series, initial, false, "eager"))
        .transpose()?;
    let stock = options
        .stock
        .then(|| forecast::train_stock::<Stock>(options, series, &Default::default()))
        .transpose()?;

    let mut curves = vec![Curve {
        label,
        losses: &graphed.losses,
    }];
    if let Some(eager) = &eager {
        curves.push(Curve {
            label: "eager",
            losses: &eager.losses,
        });
    }
    if let Some(stock) = &stock {
        curves.push(Curve {
            label: "stock Burn, nn::Lstm, Burn's Adam",
            losses: &stock.losses,
        });
    }
    std::fs::create_dir_all(&options.out)?;
    plot::loss_curves(
        &options.out.join("loss.svg"),
        "sunspots LSTM: training loss",
        &curves,
    )?;
    let summary = Summary {
        options,
        backend: std::any::type_name::<Inner>(),
        eval: graphed.eval,
        steps: graphed.losses.len(),
        steps_per_second: graphed.steps_per_second(),
        final_loss: graphed.losses.last().copied(),
        eager_comparison: eager.as_ref().map(|eager| Comparison::of(&graphed, eager)),
        stock_comparison: stock.as_ref().map(|stock| Comparison::of(&graphed, stock)),
    };
    forecast::save::<TrainBackend<Inner>, M>(&options.out, &graphed, &summary)?;

    println!(
        "held-out RMSE {:.2} sunspots (naive, last month repeated: {:.2}) over {} months",
        graphed.eval.rmse, graphed.eval.naive_rmse, graphed.eval.months
    );
    let modes = graphed
        .report
        .as_ref()
        .map(|r| r.modes.clone())
        .unwrap_or_default();
    println!(
        "{} steps in {:.1} s ({:.1} steps/s after the first {UNTIMED_STEPS}); modes: {} captured, \
         {} replayed, {} eager",
        graphed.losses.len(),
        graphed.seconds,
        graphed.steps_per_second(),
        modes.captured,
        modes.replayed,
        modes.eager,
    );
    let comparisons = [
        ("eager", &summary.eager_comparison),
        ("stock", &summary.stock_comparison),
    ];
    for (name, comparison) in comparisons {
        if let Some(c) = comparison {
            println!(
                "{name}: {:.1} steps/s (graphed is {:.2}x); largest loss difference {:e} \
                 (relative {:e}, bit-exact: {}); held-out RMSE {:.2}",
                c.steps_per_second,
                c.speedup,
                c.max_loss_difference,
                c.max_relative_loss_difference,
                c.bit_exact,
                c.eval.rmse
            );
        }
    }
    println!(
        "wrote model.mpk, loss.svg, report.json, summary.json to {}",
        options.out.display()
    );
    Ok(())
}
