//! Eager LSTM step time and memory: `CudaGraphRuntime` against stock burn-cuda (issue 3).
//!
//! For each reference configuration (b/t/h) it warms both stacks up, then times steps (forward,
//! backward, Adam, loss read back) in interleaved rounds: a few steps on one stack, then as
//! many on the other, the first stack alternating between rounds. Single runs were noisy
//! (ratio 0.975 to 1.263 over two runs, 2026-11-30), so it reports the median and IQR of
//! each stack, the ratio of medians, and the median of per-round ratios, which cancels
//! drift over the run. It then runs 200 steps on this runtime and reports device memory in
//! use at steps 50 and 200.
//!
//! Run on a GPU machine: `runtime_eager_bench [steps] [steps-per-round]` (defaults 60, 5;
//! steps per stack).

#[cfg(feature = "cuda")]
#[path = "../tests/gpu_common/mod.rs"]
mod gpu_common;

#[cfg(feature = "cuda")]
fn main() {
    bench::run();
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("runtime_eager_bench needs `--features cuda`");
}

#[cfg(feature = "cuda")]
mod bench {
    use super::gpu_common::*;
    use burn::{
        backend::Autodiff,
        tensor::{
            ElementConversion,
            backend::{AutodiffBackend, Backend},
        },
    };
    use burn_graph_capture::runtime::CudaGraphRuntime;
    use cubecl_core::Runtime;
    use std::time::Instant;

    const CONFIGS: [(usize, usize, usize); 3] = [(32, 64, 256), (8, 64, 128), (128, 32, 512)];

    /// Linear-interpolated quantile `q` in [0, 1] of `v`.
    fn quantile(v: &[f64], q: f64) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let pos = q * (v.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
    }

    /// Median and interquartile range.
    fn median_iqr(v: &[f64]) -> (f64, f64) {
        (quantile(v, 0.5), quantile(v, 0.75) - quantile(v, 0.25))
    }

    fn timed_step<B: AutodiffBackend>(p: &mut LstmProblem<B>) -> f64 {
        let start = Instant::now();
        let loss: f32 = p.step().into_scalar().elem();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        assert!(loss.is_finite(), "loss diverged");
        ms
    }

    /// Step times of both stacks for one configuration, in interleaved rounds.
    struct Timings {
        ours: Vec<f64>,
        stock: Vec<f64>,
        /// Per round: mean step of ours / mean step of stock (cancels slow drift).
        round_ratios: Vec<f64>,
    }

    /// Times `rounds` rounds of `per_round` steps on each stack. Rounds alternate which
    /// stack goes first (AB, BA, AB, ...), so clock and thermal drift and any cost of
    /// switching stacks fall on both equally.
    fn interleaved<O: AutodiffBackend, S: AutodiffBackend>(
        ours: &mut LstmProblem<O>,
        stock: &mut LstmProblem<S>,
        rounds: usize,
        per_round: usize,
    ) -> Timings {
        let mut t = Timings {
            ours: Vec::new(),
            stock: Vec::new(),
            round_ratios: Vec::new(),
        };
        for round in 0..rounds {
            let (mut o, mut s) = (Vec::new(), Vec::new());
            for first_ours in [round % 2 == 0, round % 2 != 0] {
                for _ in 0..per_round {
                    if first_ours {
                        o.push(timed_step(ours));
                    } else {
                        s.push(timed_step(stock));
                    }
                }
            }
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            t.round_ratios.push(mean(&o) / mean(&s));
            t.ours.extend(o);
            t.stock.extend(s);
        }
        t
    }

    pub fn run() {
        let mut args = std::env::args().skip(1).map(|s| s.parse::<usize>().ok());
        let steps = args.next().flatten().unwrap_or(60).max(4);
        let per_round = args.next().flatten().unwrap_or(5).clamp(1, steps);
        let rounds = steps.div_ceil(per_round);
        let warmup = 10;
        type O = Autodiff<OursFused>;
        type S = Autodiff<StockFused>;
        let (od, sd) = (our_device(), stock_device());

        let mut rows = Vec::new();
        for config in CONFIGS {
            let (b, t, h) = config;
            let mut ours = LstmProblem::<O>::new(b, t, h, &od);
            let mut stock = LstmProblem::<S>::new(b, t, h, &sd);
            // Warmup compiles and autotunes every kernel and grows the pools of both stacks.
            interleaved(&mut ours, &mut stock, 2, warmup / 2);
            let timings = interleaved(&mut ours, &mut stock, rounds, per_round);
            println!("config {b}/{t}/{h}:");
            println!("  per-step ms ours:  {:.1?}", timings.ours);
            println!("  per-step ms stock: {:.1?}", timings.stock);
            println!("  per-round ratios:  {:.3?}", timings.round_ratios);
            rows.push((config, timings));
        }
        // Memory: 200 steps on this runtime at 32/64/256.
        let client = CudaGraphRuntime::client(&od);
        let mut problem = LstmProblem::<O>::new(32, 64, 256, &od);
        let mut at = Vec::new();
        for step in 1..=200 {
            let _: f32 = problem.step().into_scalar().elem();
            if step == 50 || step == 200 {
                O::sync(&od).expect("sync");
                let usage = client.memory_usage().expect("memory usage");
                at.push((step, usage.bytes_in_use, usage.bytes_reserved));
            }
        }

        println!();
        println!(
            "{rounds} rounds of {per_round} steps per stack, interleaved (AB, BA, ...), after {warmup} warmup steps each; ms per step"
        );
        println!(
            "| b/t/h | ours median | ours IQR | ours min | burn-cuda median | burn-cuda IQR | burn-cuda min | ratio of medians | round ratio median | round ratio IQR |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let (mut worst, mut worst_round) = (0f64, 0f64);
        for ((b, t, h), tm) in &rows {
            let (mo, io) = median_iqr(&tm.ours);
            let (ms, is) = median_iqr(&tm.stock);
            let (mr, ir) = median_iqr(&tm.round_ratios);
            let min = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min);
            println!(
                "| {b}/{t}/{h} | {mo:.2} | {io:.2} | {:.2} | {ms:.2} | {is:.2} | {:.2} | {:.3} | {mr:.3} | {ir:.3} |",
                min(&tm.ours),
                min(&tm.stock),
                mo / ms
            );
            worst = worst.max(mo / ms);
            worst_round = worst_round.max(mr);
        }
        println!();
        println!("| step (32/64/256) | bytes in use | bytes reserved |");
        println!("|---|---|---|");
        for (step, used, reserved) in &at {
            println!("| {step} | {used} | {reserved} |");
        }
        let flat = at[0].1 == at[1].1 && at[0].2 == at[1].2;
        println!("MEMORY_FLAT={flat}");
        println!("WORST_RATIO={worst:.3}");
        println!("WORST_ROUND_RATIO={worst_round:.3}");
    }
}
