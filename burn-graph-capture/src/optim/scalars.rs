//! Device-side scalars: the learning rate, the step count, and the terms derived from them.
//!
//! A captured step replays the scalar arguments it recorded, so every quantity that
//! changes between steps must be read from a device buffer instead. The learning rate
//! and step count are `[1]`-shaped tensors here; bias corrections and Burn's first-step
//! special cases are computed from the step count with tensor ops, inside the step.
//! Only true constants (betas, epsilon, penalties) enter ops as host scalars.

use burn::optim::LearningRate;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// The learning rate and step count of an optimizer, as `[1]`-shaped device tensors.
#[derive(Clone, Debug)]
pub struct DeviceScalars<B: Backend> {
    /// The learning rate used by the next step.
    pub lr: Tensor<B, 1>,
    /// The number of steps taken so far, as a float (exact up to 2^24 steps in `f32`).
    pub step: Tensor<B, 1>,
}

impl<B: Backend> DeviceScalars<B> {
    /// Learning rate `lr` and step count 0 on `device`.
    pub fn new(lr: LearningRate, device: &B::Device) -> Self {
        Self {
            lr: lr_tensor(lr, device),
            step: Tensor::zeros([1], device),
        }
    }

    /// Replaces the learning-rate tensor (on the device of the current one).
    pub fn set_lr(&mut self, lr: LearningRate) {
        self.lr = lr_tensor(lr, &self.lr.device());
    }

    /// Advances the step count by one on the device; returns `(before, after)`.
    pub fn advance(&mut self) -> (Tensor<B, 1>, Tensor<B, 1>) {
        let before = self.step.clone();
        self.step = before.clone().add_scalar(1.0);
        (before, self.step.clone())
    }
}

/// A `[1]` tensor holding `lr`, rounded to the backend's float type as Burn's
/// `mul_scalar(lr)` rounds it.
fn lr_tensor<B: Backend>(lr: LearningRate, device: &B::Device) -> Tensor<B, 1> {
    Tensor::from_floats([lr as f32], device)
}

/// Longest table of [`BiasCorrection`]: 256 KiB of `f32`.
const MAX_TABLE: usize = 1 << 16;

/// `1 - beta^t`, Adam's bias correction, looked up on the device from the step tensor.
///
/// Burn computes `1.0 - beta.powi(t)` on the host in `f32`. `powi` multiplies by
/// repeated squaring, and its rounding differs from a device `pow` or `exp(t * ln beta)`
/// by an ulp or two of `beta^t`. `1 - beta^t` is small in early steps (1e-3 at `t = 1`
/// for `beta = 0.999`), so that ulp becomes a relative error near 1e-5 in the step size.
///
/// So the values are Burn's own: a table of `1.0 - beta.powi(t)`, computed once on the
/// host by the same call Burn makes and indexed on the device by `t`. The
/// table ends where the correction has reached exactly `1.0` in `f32` (`t = 166` for
/// `beta = 0.9`, about 17k for `0.999`), so clamping `t` to its end stays exact forever.
/// Only for a `beta` so close to 1 that this takes more than 65,536 steps, later steps
/// fall back to [`approximate_bias_correction`] (a `mask_where`, the same ops every
/// step).
///
/// The lookup is a one-hot sum, `sum(table * (positions == t))`, not a `select`: Burn
/// 0.21's fusion mis-indexes a `select` whose `[1]` result is fused into a broadcast
/// (the fused kernel reads the index tensor at every output position; seen on the H200
/// as an out-of-bounds read under compute-sanitizer). The sum adds one table value to
/// zeros, so it is exact.
///
/// The tables are constants: created once, never replaced, and read by every step, so a
/// captured step keeps reading them at the same addresses for the optimizer's lifetime.
#[derive(Clone, Debug)]
pub struct BiasCorrection<B: Backend> {
    beta: f32,
    table: Tensor<B, 1>,
    /// `0, 1, 2, ..` as floats, one per table entry (exact: the table is shorter than 2^24).
    positions: Tensor<B, 1>,
    /// Index of the last entry.
    last: usize,
    /// Whether the table ends at exactly 1.0 (no fallback needed).
    saturated: bool,
}

impl<B: Backend> BiasCorrection<B> {
    /// The table of `beta` on `device`.
    pub fn new(beta: f32, device: &B::Device) -> Self {
        let mut values = Vec::new();
        let mut saturated = false;
        for t in 0..MAX_TABLE as i32 {
            let value = 1.0 - beta.powi(t);
            values.push(value);
            if t > 0 && value == 1.0 {
                saturated = true;
                break;
            }
        }
        let last = values.len() - 1;
        let table = Tensor::from_data(TensorData::new(values, [last + 1]), device);
        let positions: Vec<f32> = (0..=last).map(|t| t as f32).collect();
        let positions = Tensor::from_data(TensorData::new(positions, [last + 1]), device);
        Self {
            beta,
            table,
            positions,
            last,
            saturated,
        }
    }

    /// `1 - beta^t` for the `[1]`-shaped step tensor `t` (a whole number, at least 1).
    pub fn at(&self, t: Tensor<B, 1>) -> Tensor<B, 1> {
        let index = t
            .clone()
            .clamp_max(self.last as f64)
            .expand([self.last + 1]);
        let hit = self.positions.clone().equal(index).float();
        let exact = self.table.clone().mul(hit).sum();
        if self.saturated {
            return exact;
        }
        let in_table = t.clone().lower_equal_elem(self.last as f64);
        approximate_bias_correction(t, self.beta).mask_where(in_table, exact)
    }
}

/// `1 - beta^t` as `1 - exp(t * ln beta)` on the device, within about an ulp of
/// `beta^t`. `t` must be at least 1 when `beta` is 0 (`0 * ln 0` is NaN).
pub fn approximate_bias_correction<B: Backend>(t: Tensor<B, 1>, beta: f32) -> Tensor<B, 1> {
    let ln_beta = (beta as f64).ln();
    t.mul_scalar(ln_beta).exp().neg().add_scalar(1.0)
}

/// `min(t, 1)`: 0 before the first step, 1 afterwards, for branch-free first steps.
pub fn started<B: Backend>(t: Tensor<B, 1>) -> Tensor<B, 1> {
    t.clamp_max(1.0)
}
