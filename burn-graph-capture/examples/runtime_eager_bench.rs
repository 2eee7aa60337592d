//! Eager LSTM step time and memory: `CudaGraphRuntime` against stock burn-cuda (issue 3).
//!
//! For each DESIGN configuration (b/t/h) it warms both stacks up, then times single steps
//! (forward, backward, Adam, loss read back) alternately on this runtime and on stock
//! burn-cuda, and reports medians and their ratio. It then runs 200 steps on this runtime
//! and reports device memory in use at steps 50 and 200.
//!
//! Run on a GPU machine: `runtime_eager_bench [steps]` (default 30 timed steps).

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

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    fn timed_step<B: AutodiffBackend>(p: &mut LstmProblem<B>) -> f64 {
        let start = Instant::now();
        let loss: f32 = p.step().into_scalar().elem();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        assert!(loss.is_finite(), "loss diverged");
        ms
    }

    pub fn run() {
        let steps: usize = std::env::args()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(30);
        let warmup = 8;
        type O = Autodiff<OursFused>;
        type S = Autodiff<StockFused>;
        let (od, sd) = (our_device(), stock_device());

        let mut rows = Vec::new();
        for config in CONFIGS {
            let (b, t, h) = config;
            let mut ours = LstmProblem::<O>::new(b, t, h, &od);
            let mut stock = LstmProblem::<S>::new(b, t, h, &sd);
            for _ in 0..warmup {
                timed_step(&mut ours);
                timed_step(&mut stock);
            }
            let (mut to, mut ts) = (Vec::new(), Vec::new());
            for _ in 0..steps {
                to.push(timed_step(&mut ours));
                ts.push(timed_step(&mut stock));
            }
            println!("  per-step ms ours:  {to:.1?}");
            println!("  per-step ms stock: {ts:.1?}");
            let (mo, ms) = (median(to.clone()), median(ts.clone()));
            println!(
                "config {b}/{t}/{h}: ours median {mo:.2} ms (min {:.2}), stock median {ms:.2} ms (min {:.2}), ratio {:.3}",
                to.iter().cloned().fold(f64::MAX, f64::min),
                ts.iter().cloned().fold(f64::MAX, f64::min),
                mo / ms
            );
            rows.push((config, mo, ms));
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
            "| b/t/h | ours eager ms (median, {steps} steps) | burn-cuda eager ms | ratio ours/stock |"
        );
        println!("|---|---|---|---|");
        for ((b, t, h), mo, ms) in &rows {
            println!("| {b}/{t}/{h} | {mo:.2} | {ms:.2} | {:.3} |", mo / ms);
        }
        println!();
        println!("| step (32/64/256) | bytes in use | bytes reserved |");
        println!("|---|---|---|");
        for (step, used, reserved) in &at {
            println!("| {step} | {used} | {reserved} |");
        }
        let flat = at[0].1 == at[1].1 && at[0].2 == at[1].2;
        println!("MEMORY_FLAT={flat}");
        let worst = rows.iter().map(|(_, mo, ms)| mo / ms).fold(0f64, f64::max);
        println!("WORST_RATIO={worst:.3}");
    }
}
