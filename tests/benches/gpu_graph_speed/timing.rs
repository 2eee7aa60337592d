//! Two timings of a step, both medians:
//! - per step: each step runs to a host read of its loss (latency, sync included);
//! - pipelined: a round of steps is queued back to back and only the last loss is read
//!   (throughput, as PyTorch's anchor measures: N launches, one sync, divided by N).
//!
//! The summary's ratios use the pipelined value; both are printed.

use std::time::Instant;

/// How many steps each timing takes.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Steps timed one by one.
    pub per_step: usize,
    /// Rounds of the pipelined timing.
    pub rounds: usize,
    /// Steps per round.
    pub round_len: usize,
}

/// Replays cost ~20 ms: many samples are cheap.
pub const GRAPHED: Plan = Plan {
    per_step: 30,
    rounds: 5,
    round_len: 20,
};

/// Eager steps cost ~100-180 ms: keep the stage short.
pub const EAGER: Plan = Plan {
    per_step: 20,
    rounds: 3,
    round_len: 10,
};

/// Milliseconds per step.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    /// Median of steps each timed to a host read of its loss.
    pub per_step_ms: f64,
    /// Median over rounds of (round wall time / steps in the round).
    pub pipelined_ms: f64,
    /// Fastest single step, to show the spread.
    pub min_step_ms: f64,
}

/// The median of `samples`.
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn elapsed_ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// Times `step` (which returns the step's loss) under `plan`; `read` waits for a loss on
/// the host.
pub fn time<L>(plan: Plan, mut step: impl FnMut() -> L, read: impl Fn(L)) -> Timing {
    let per_step: Vec<f64> = (0..plan.per_step)
        .map(|_| {
            let start = Instant::now();
            read(step());
            elapsed_ms(start)
        })
        .collect();
    let rounds: Vec<f64> = (0..plan.rounds)
        .map(|_| {
            let start = Instant::now();
            let mut last = step();
            for _ in 1..plan.round_len {
                last = step();
            }
            read(last);
            elapsed_ms(start) / plan.round_len as f64
        })
        .collect();
    Timing {
        min_step_ms: per_step.iter().copied().fold(f64::INFINITY, f64::min),
        per_step_ms: median(per_step),
        pipelined_ms: median(rounds),
    }
}
