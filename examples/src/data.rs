//! A deterministic sequence-regression task: forecast the next sample of sine waves.
//!
//! Each sequence is a sine of random frequency and phase. At time step `t` the input is
//! the window of the 32 samples ending at `t`, and the target is the sample after it.
//! Batches come from a seeded RNG, so every backend sees the same data.

use burn::prelude::*;
use burn_graph_capture::StepInput;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// One batch: inputs `[batch, time, d_input]` and targets `[batch, time, 1]`. The
/// trainer keys graphs by, checks and copies both tensors (`StepInput`).
#[derive(Clone, Debug, StepInput)]
pub struct Batch<B: Backend> {
    pub x: Tensor<B, 3>,
    pub y: Tensor<B, 3>,
}

/// Generator of sine-forecasting batches.
#[derive(Debug)]
pub struct SineTask {
    rng: StdRng,
    d_input: usize,
}

impl SineTask {
    /// A task whose batches are fully determined by `seed`.
    pub fn new(seed: u64, d_input: usize) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            d_input,
        }
    }

    /// Draws the next batch as host data: `(x, y)`.
    pub fn next_data(&mut self, batch: usize, time: usize) -> (TensorData, TensorData) {
        let mut x = Vec::with_capacity(batch * time * self.d_input);
        let mut y = Vec::with_capacity(batch * time);
        for _ in 0..batch {
            let frequency = self.rng.random_range(0.05f32..0.4);
            let phase = self.rng.random_range(0.0f32..std::f32::consts::TAU);
            let sample = |i: usize| (frequency * i as f32 + phase).sin();
            for t in 0..time {
                x.extend((0..self.d_input).map(|k| sample(t + k)));
                y.push(sample(t + self.d_input));
            }
        }
        (
            TensorData::new(x, [batch, time, self.d_input]),
            TensorData::new(y, [batch, time, 1]),
        )
    }

    /// Draws the next batch onto `device`.
    pub fn next_batch<B: Backend>(
        &mut self,
        batch: usize,
        time: usize,
        device: &B::Device,
    ) -> Batch<B> {
        let (x, y) = self.next_data(batch, time);
        Batch {
            x: Tensor::from_data(x, device),
            y: Tensor::from_data(y, device),
        }
    }
}
