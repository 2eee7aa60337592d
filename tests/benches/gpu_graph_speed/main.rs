//! GPU benchmark of one LSTM training step (issue 5: "Speed" and "Capture cost"): the stock
//! `nn::Lstm` + `Linear` model of lstm-example, MSE loss, Adam, on
//! - `fused`: `CudaFused` (this crate's runtime with Burn's fusion), graphed through
//!   `GraphTrainer` and eager with the same capturable Adam;
//! - `stock`: `Autodiff<burn_cuda::Cuda>` with Burn's own Adam, eager;
//! - `cube`: `CudaCube` (no fusion), graphed;
//! - `fused-lstm`: `CudaFused` with `FusedLstm` in place of `nn::Lstm` (same weights),
//!   graphed and eager; `fused-lstm-stepwise` and `fused-lstm-persistent` the same with
//!   either recurrence forced (`fused-lstm` takes the library's choice);
//! - `ddp1`, `fused-lstm-ddp1`: `fused` and `fused-lstm` graphed by the one rank of a
//!   data-parallel group (issue 16: the NCCL all-reduce and the agreement in the step);
//!   `ddp2`, `fused-lstm-ddp2`: rank 0 of a group of two on GPUs 0 and 1, each with the
//!   row's batch (two GPUs needed; not in the default list);
//! - `fused-gru`: `CudaFused` with a `FusedGru` of the row's sizes and a head (fresh
//!   weights), graphed and eager; `fused-gru-stepwise` and `fused-gru-persistent` with
//!   either recurrence forced (issue 28; none in the default list);
//! - `trace-nn-lstm`, `trace-fused-lstm`, `trace-transformer`: what tracing every
//!   replay costs on `CudaCube` (`nn::Lstm`, `FusedLstm`, a two-layer Transformer encoder
//!   of width `h` with four heads), traced against untraced and against the same step
//!   run eagerly, side by side (none in the default list); with `HOST_PROFILE=DIR`, two
//!   more seconds of traced steps are sampled into `DIR/trace-MODEL-B-T-H.folded`
//!   (`host_profile`); `trace-fusion-fused-lstm` and `trace-fusion-transformer` the
//!   same on `CudaFused`;
//! - `dropout`, `no-dropout`: `CudaFused`, two `FusedLstm` layers (the first with the
//!   same weights) with dropout 0.3 between them, or none, graphed and eager (issue 15;
//!   not in the default list).
//!
//! Built by `xtask gpu pack`; run by its `speed`, `ncu` and `racecheck` stages.
//! - `gpu_graph_speed [SIZES] [STACKS]`: SIZES is `all` (default) or `b/t/h,b/t/h`;
//!   STACKS a comma list of the stacks above (default all). Prints one JSON line per
//!   measurement as soon as it is taken (`{"bench":"speed",..}`), then a table.
//! - `gpu_graph_speed profile TARGET b/t/h`: runs one step between `cuProfilerStart` and
//!   `cuProfilerStop` for `ncu --profile-from-start off`. TARGET `fused`, `stock`, `cube`,
//!   `fused-lstm` or `fused-gru` profiles the eager step after the trainer's warmup count
//!   of eager steps (the step a graph captures); `fused-replay`, `cube-replay`,
//!   `fused-lstm-replay`, `fused-gru-replay` or `dropout-replay` profiles one replay of the
//!   graph. `BURN_GRAPH_CAPTURE_RECURRENCE` picks the recurrence of `fused-lstm` and
//!   `fused-gru`.

mod host_profile;
mod memory;
mod ours;
mod profile;
mod setup;
mod stock;
mod timing;

use burn_graph_capture::nn::set_recurrence_preference;
use burn_graph_capture::nn::{RecurrencePreference, persistent_launches};
use burn_graph_capture::runtime::CudaGraphDevice;
use burn_graph_capture::{CudaCube, CudaFused, GraphTrainerConfig};
use lstm_example::LstmRegressor;
use lstm_example::model::{DropoutLstmRegressor, FusedLstmRegressor, GruRegressor};
use serde_json::{Value, json};

use setup::{Size, Workload, parse_sizes};
use timing::Timing;

fn timing_json(t: &Timing) -> Value {
    json!({
        "per_step_ms": t.per_step_ms,
        "pipelined_ms": t.pipelined_ms,
        "min_step_ms": t.min_step_ms,
    })
}

/// Prints one measurement as a JSON line, with the row's size and stack.
fn emit(size: Size, stack: &str, mode: &str, timing: &Timing, extra: Value) {
    let mut line =
        json!({"bench": "speed", "size": size.to_string(), "stack": stack, "mode": mode});
    let fields = line.as_object_mut().expect("object");
    fields.extend(timing_json(timing).as_object().expect("object").clone());
    fields.extend(extra.as_object().expect("object").clone());
    println!("{line}");
}

/// The graphed and eager rows of `stack`, the model `M` with its recurrence run under
/// `preference` (the persistent kernels' launches in the graphed row's JSON).
fn recurrent<M: ours::Model<CudaFused>>(
    size: Size,
    stack: &'static str,
    preference: RecurrencePreference,
    work: &Workload,
    device: &CudaGraphDevice,
) -> [Row; 2] {
    set_recurrence_preference(preference);
    let launches = persistent_launches();
    let run = ours::graphed::<CudaFused, M>(work, device);
    let mut extra = graphed_json(&run);
    extra["persistent_launches"] = json!(persistent_launches() - launches);
    emit(size, stack, "graphed", &run.timing, extra);
    let (timing, pools) = ours::eager::<CudaFused, M>(work, device);
    let extra = json!({"reserved_bytes": pools.reserved, "in_use_bytes": pools.in_use});
    emit(size, stack, "eager", &timing, extra);
    set_recurrence_preference(RecurrencePreference::Auto);
    [
        Row {
            size,
            stack,
            mode: "graphed",
            timing: run.timing,
        },
        Row {
            size,
            stack,
            mode: "eager",
            timing,
        },
    ]
}

fn graphed_json(run: &ours::Graphed) -> Value {
    let graph = run.graphs.first();
    json!({
        "capture_ms": run.report.capture_ms,
        "check_ms_per_step": run.report.check_ms / run.report.steps.max(1) as f64,
        "pinned_bytes": run.report.pinned_bytes,
        "arena_reserved_bytes": run.arena_reserved,
        "graphs_alive": run.graphs.len(),
        "graph_launches": graph.map(|g| g.launches),
        "retained_bytes": run.graphs.iter().map(|g| g.retained_device_bytes).sum::<u64>(),
        "pool_bytes": run.graphs.iter().map(|g| g.pool_bytes).sum::<u64>(),
        "retained_buffers": graph.map(|g| g.retained_buffers),
        "retained_staging_bytes": graph.map(|g| g.retained_staging_bytes),
        "modes": serde_json::to_value(&run.report.modes).expect("modes"),
        "timed_not_replayed": run.not_replayed,
        "last_fallback": run.report.last_fallback,
    })
}

/// The stock `nn::Lstm` model on stack `G`.
type Nn<G> = LstmRegressor<burn_graph_capture::TrainBackend<G>>;
/// The same weights with `FusedLstm`.
type Batched<G> = FusedLstmRegressor<burn_graph_capture::TrainBackend<G>>;

/// A `FusedGru` of the row's hidden size and a head (fresh weights).
type Gru<G> = GruRegressor<burn_graph_capture::TrainBackend<G>>;

/// A small Transformer encoder of width `h`.
type Encoder<G> = setup::TransformerRegressor<burn_graph_capture::TrainBackend<G>>;

/// Two `FusedLstm` layers with dropout between them.
type Dropped<G> = DropoutLstmRegressor<burn_graph_capture::TrainBackend<G>>;

/// One row of the closing table.
struct Row {
    size: Size,
    stack: &'static str,
    mode: &'static str,
    timing: Timing,
}

fn speed(sizes: &[Size], stacks: &[String]) {
    let device = CudaGraphDevice::new(0);
    let wants = |s: &str| stacks.iter().any(|x| x == s);
    let mut rows = Vec::new();
    for &size in sizes {
        let mut work = Workload::new(size);
        if wants("fused") {
            let run = ours::graphed::<CudaFused, Nn<CudaFused>>(&work, &device);
            emit(size, "fused", "graphed", &run.timing, graphed_json(&run));
            rows.push(Row {
                size,
                stack: "fused",
                mode: "graphed",
                timing: run.timing,
            });
            let (timing, pools) = ours::eager::<CudaFused, Nn<CudaFused>>(&work, &device);
            let extra = json!({"reserved_bytes": pools.reserved, "in_use_bytes": pools.in_use});
            emit(size, "fused", "eager", &timing, extra);
            rows.push(Row {
                size,
                stack: "fused",
                mode: "eager",
                timing,
            });
        }
        // `fused-lstm` as the library chooses its recurrence (persistent where it fits),
        // `fused-lstm-stepwise` with the per-step GEMMs forced; the same for `FusedGru`,
        // whose forced stepwise recurrence is its plain ops (issue 28: all, one run).
        use RecurrencePreference::{Auto, Persistent, Stepwise};
        for (stack, preference) in [
            ("fused-lstm", Auto),
            ("fused-lstm-stepwise", Stepwise),
            ("fused-lstm-persistent", Persistent),
        ] {
            if wants(stack) {
                rows.extend(recurrent::<Batched<CudaFused>>(
                    size, stack, preference, &work, &device,
                ));
            }
        }
        for (stack, preference) in [
            ("fused-gru", Auto),
            ("fused-gru-stepwise", Stepwise),
            ("fused-gru-persistent", Persistent),
        ] {
            if wants(stack) {
                rows.extend(recurrent::<Gru<CudaFused>>(
                    size, stack, preference, &work, &device,
                ));
            }
        }
        // Two `FusedLstm` layers with dropout 0.3 between them, and the same model
        // without it (issue 15: what drawing the masks on the device costs).
        for (stack, p) in [("dropout", 0.3), ("no-dropout", 0.0)] {
            if !wants(stack) {
                continue;
            }
            work.dropout = p;
            let run = ours::graphed::<CudaFused, Dropped<CudaFused>>(&work, &device);
            emit(size, stack, "graphed", &run.timing, graphed_json(&run));
            rows.push(Row {
                size,
                stack,
                mode: "graphed",
                timing: run.timing,
            });
            let (timing, pools) = ours::eager::<CudaFused, Dropped<CudaFused>>(&work, &device);
            let extra = json!({"reserved_bytes": pools.reserved, "in_use_bytes": pools.in_use});
            emit(size, stack, "eager", &timing, extra);
            rows.push(Row {
                size,
                stack,
                mode: "eager",
                timing,
            });
        }
        // Issue 16: the step of one data-parallel rank (its gradient all-reduce through
        // NCCL, one rank, and the ranks' agreement), beside the plain step above.
        // With two GPUs, `ddp2` and `fused-lstm-ddp2`: rank 0's step in a group of two
        // (GPUs 0 and 1, each with this size's batch), timed as the others are.
        for stack in ["ddp1", "fused-lstm-ddp1", "ddp2", "fused-lstm-ddp2"] {
            if !wants(stack) {
                continue;
            }
            let run = match stack {
                "ddp1" => ours::graphed_ranks::<CudaFused, Nn<CudaFused>>(
                    &work,
                    &device,
                    ours::Ranks::One,
                ),
                "fused-lstm-ddp1" => ours::graphed_ranks::<CudaFused, Batched<CudaFused>>(
                    &work,
                    &device,
                    ours::Ranks::One,
                ),
                "ddp2" => ours::graphed_two::<CudaFused, Nn<CudaFused>>(&work),
                _ => ours::graphed_two::<CudaFused, Batched<CudaFused>>(&work),
            };
            emit(size, stack, "graphed", &run.timing, graphed_json(&run));
            rows.push(Row {
                size,
                stack,
                mode: "graphed",
                timing: run.timing,
            });
        }
        // Issue 27: what the periodic check of a graph against an eager step costs
        // (`verify_every`, default 100), on `FusedLstm`'s step.
        if wants("check") {
            let every = GraphTrainerConfig::new().verify_every;
            let cost = ours::check_cost::<CudaFused, Batched<CudaFused>>(&work, &device, every);
            let overhead = cost.checked_ms / cost.unchecked_ms - 1.0;
            println!(
                "{}",
                json!({
                    "bench": "graph_speed", "size": size.to_string(), "stack": "fused-lstm",
                    "mode": "check-cost", "verify_every": cost.verify_every,
                    "steps_per_round": cost.steps_per_round, "rounds": cost.rounds,
                    "checked_ms": cost.checked_ms, "unchecked_ms": cost.unchecked_ms,
                    "overhead": overhead, "checks": cost.checks,
                })
            );
            println!(
                "| {size} | fused-lstm | replay checks every {} steps: {:.3} ms against {:.3} ms per step ({:+.2} %, {} checks) |",
                cost.verify_every,
                cost.checked_ms,
                cost.unchecked_ms,
                overhead * 100.0,
                cost.checks
            );
        }
        // What tracing every replay costs (`TrainerReport::trace_ms`): `nn::Lstm`,
        // `FusedLstm` and a small Transformer encoder (`h` wide) on the plain stack,
        // `FusedLstm` and the encoder on the fused one, traced and untraced side by side.
        if stacks.iter().any(|s| s.starts_with("trace-")) {
            let mut costs = Vec::new();
            if wants("trace-nn-lstm") {
                let cost = ours::trace_cost::<CudaCube, Nn<CudaCube>>("nn-lstm", &work, &device);
                costs.push(("cube-nn-lstm", cost));
            }
            if wants("trace-fused-lstm") {
                let cost =
                    ours::trace_cost::<CudaCube, Batched<CudaCube>>("fused-lstm", &work, &device);
                costs.push(("cube-fused-lstm", cost));
            }
            if wants("trace-transformer") {
                let cost =
                    ours::trace_cost::<CudaCube, Encoder<CudaCube>>("transformer", &work, &device);
                costs.push(("cube-transformer", cost));
            }
            if wants("trace-fusion-fused-lstm") {
                let cost = ours::trace_cost::<CudaFused, Batched<CudaFused>>(
                    "fusion-fused-lstm",
                    &work,
                    &device,
                );
                costs.push(("fused-fused-lstm", cost));
            }
            if wants("trace-fusion-transformer") {
                let cost = ours::trace_cost::<CudaFused, Encoder<CudaFused>>(
                    "fusion-transformer",
                    &work,
                    &device,
                );
                costs.push(("fused-transformer", cost));
            }
            for (model, cost) in costs {
                let overhead = cost.traced_ms / cost.untraced_ms - 1.0;
                println!(
                    "{}",
                    json!({
                        "bench": "graph_speed", "size": size.to_string(), "stack": model,
                        "mode": "trace-cost", "steps_per_round": cost.steps_per_round,
                        "rounds": cost.rounds, "traced_ms": cost.traced_ms,
                        "untraced_ms": cost.untraced_ms, "overhead": overhead,
                        "trace_ms_per_step": cost.trace_ms_per_step,
                        "check_ms_traced": cost.check_ms.0, "check_ms_untraced": cost.check_ms.1,
                        "launch_ms_traced": cost.launch_ms.0,
                        "launch_ms_untraced": cost.launch_ms.1,
                        "host_ms_traced": cost.host_ms.0, "host_ms_untraced": cost.host_ms.1,
                        "traces_matched": cost.traces_matched,
                        "not_replayed": cost.not_replayed,
                        "eager_ms": cost.eager_ms, "host_ms_eager": cost.eager_host_ms,
                    })
                );
                println!(
                    "| {size} | {model} | traced {:.3} ms against untraced {:.3} ms per step ({:+.2} %); trace {:.3} ms of host time per step; checks {:.3} / {:.3}, launches {:.3} / {:.3} ms; step calls {:.3} / {:.3} ms of host time; eager {:.3} ms per step, {:.3} ms of host time; {} traces matched, {} steps not replayed |",
                    cost.traced_ms,
                    cost.untraced_ms,
                    overhead * 100.0,
                    cost.trace_ms_per_step,
                    cost.check_ms.0,
                    cost.check_ms.1,
                    cost.launch_ms.0,
                    cost.launch_ms.1,
                    cost.host_ms.0,
                    cost.host_ms.1,
                    cost.eager_ms,
                    cost.eager_host_ms,
                    cost.traces_matched,
                    cost.not_replayed
                );
            }
        }
        if wants("cube") {
            let run = ours::graphed::<CudaCube, Nn<CudaCube>>(&work, &device);
            emit(size, "cube", "graphed", &run.timing, graphed_json(&run));
            rows.push(Row {
                size,
                stack: "cube",
                mode: "graphed",
                timing: run.timing,
            });
        }
        if wants("stock") {
            let (timing, pools) = stock::eager(&work);
            let extra = json!({"reserved_bytes": pools.reserved, "in_use_bytes": pools.in_use});
            emit(size, "stock", "eager", &timing, extra);
            rows.push(Row {
                size,
                stack: "stock",
                mode: "eager",
                timing,
            });
        }
    }
    println!();
    println!(
        "| b/t/h | stack | mode | per-step ms (host read each) | pipelined ms (N, one read) | min ms |"
    );
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            r.size,
            r.stack,
            r.mode,
            r.timing.per_step_ms,
            r.timing.pipelined_ms,
            r.timing.min_step_ms
        );
    }
}

fn profile(target: &str, size: Size) {
    let device = CudaGraphDevice::new(0);
    let work = Workload::new(size);
    let wall_ms = match target {
        "fused" => ours::profile_eager::<CudaFused, Nn<CudaFused>>(&work, &device),
        "fused-replay" => ours::profile_replay::<CudaFused, Nn<CudaFused>>(&work, &device),
        "cube" => ours::profile_eager::<CudaCube, Nn<CudaCube>>(&work, &device),
        "cube-replay" => ours::profile_replay::<CudaCube, Nn<CudaCube>>(&work, &device),
        "fused-lstm" => ours::profile_eager::<CudaFused, Batched<CudaFused>>(&work, &device),
        "fused-lstm-replay" => {
            ours::profile_replay::<CudaFused, Batched<CudaFused>>(&work, &device)
        }
        "dropout-replay" => ours::profile_replay::<CudaFused, Dropped<CudaFused>>(&work, &device),
        "fused-gru" => ours::profile_eager::<CudaFused, Gru<CudaFused>>(&work, &device),
        "fused-gru-replay" => ours::profile_replay::<CudaFused, Gru<CudaFused>>(&work, &device),
        "stock" => stock::profile(&work),
        other => panic!("unknown profile target {other:?}"),
    };
    println!(
        "{}",
        json!({"bench": "profile", "target": target, "size": size.to_string(), "wall_ms": wall_ms})
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args[..] {
        ["profile", target, size] => profile(target, size.parse().expect("size")),
        _ => {
            let sizes = parse_sizes(args.first().copied().unwrap_or("all")).expect("sizes");
            let stacks = args
                .get(1)
                .copied()
                .unwrap_or("fused,stock,cube,fused-lstm");
            let stacks: Vec<String> = stacks.split(',').map(str::to_string).collect();
            speed(&sizes, &stacks);
        }
    }
}
