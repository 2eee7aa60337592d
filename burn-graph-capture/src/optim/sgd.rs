//! Capturable SGD with momentum and weight decay, with the arithmetic of `burn_optim::Sgd`.
//!
//! Burn's first momentum step is a different program (`velocity = grad`, no state yet).
//! Here the velocity starts at zero and the first step is folded into the common one:
//! `velocity = grad * keep + velocity * decay` with `s = min(step, 1)` on the device,
//! `keep = s * (1 - dampening) + (1 - s)` and `decay = s * momentum`. Since `s` is 0 or
//! 1, both are exact: for `s = 0` the update is `grad * 1 + 0 * 0`, exactly `grad`; for
//! `s = 1` it is Burn's update with Burn's `f32` constants. Every step runs the same ops.

use burn::config::Config;
use burn::optim::LearningRate;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::optim::momentum::MomentumConfig;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use super::scalars::started;
use super::{Capturable, UpdateRule};

/// Configuration of [`CapturableSgd`]: the fields of Burn's `SgdConfig`, plus the initial
/// learning rate (Burn passes it to every `step`; here it lives in a device tensor).
#[derive(Config, Debug)]
pub struct CapturableSgdConfig {
    /// The learning rate until [`set_lr`](super::CapturableOptimizer::set_lr) changes it.
    #[config(default = 1e-3)]
    pub learning_rate: LearningRate,
    /// [Weight decay](WeightDecayConfig) config.
    pub weight_decay: Option<WeightDecayConfig>,
    /// [Momentum](MomentumConfig) config.
    pub momentum: Option<MomentumConfig>,
    /// [Gradient clipping](GradientClippingConfig) config.
    pub gradient_clipping: Option<GradientClippingConfig>,
}

/// SGD whose learning rate and step count live on the device.
pub type CapturableSgd<B> = Capturable<SgdRule, B>;

impl CapturableSgdConfig {
    /// Builds the optimizer with its scalars on `device`.
    pub fn init<B: AutodiffBackend>(&self, device: &B::Device) -> CapturableSgd<B> {
        let rule = SgdRule {
            weight_decay: self.weight_decay.as_ref().map(|config| config.penalty),
            momentum: self.momentum.as_ref().map(|config| SgdMomentum {
                momentum: config.momentum as f32,
                dampening: config.dampening,
                nesterov: config.nesterov,
            }),
        };
        let clipping = self.gradient_clipping.as_ref().map(|config| config.init());
        Capturable::new(rule, clipping, self.learning_rate, device)
    }
}

/// The constants of SGD. State: the velocity (one slot) when momentum is on.
#[derive(Clone, Debug)]
pub struct SgdRule {
    weight_decay: Option<f32>,
    momentum: Option<SgdMomentum>,
}

#[derive(Clone, Debug)]
struct SgdMomentum {
    /// Rounded to `f32` as Burn's `Momentum` stores it.
    momentum: f32,
    dampening: f64,
    nesterov: bool,
}

/// This step's device terms of SGD.
#[derive(Debug)]
pub struct SgdTerms<B: Backend> {
    lr: Tensor<B, 1>,
    /// `decay` and `keep` (see the module docs).
    momentum: Option<(Tensor<B, 1>, Tensor<B, 1>)>,
}

impl<B: Backend> UpdateRule<B> for SgdRule {
    type Terms = SgdTerms<B>;

    fn slots(&self) -> usize {
        usize::from(self.momentum.is_some())
    }

    fn terms(
        &self,
        lr: &Tensor<B, 1>,
        before: &Tensor<B, 1>,
        _after: &Tensor<B, 1>,
    ) -> SgdTerms<B> {
        let momentum = self.momentum.as_ref().map(|config| {
            let s = started(before.clone());
            let decay = s.clone().mul_scalar(config.momentum);
            let keep = s
                .clone()
                .mul_scalar(1.0 - config.dampening)
                .add(s.neg().add_scalar(1.0));
            (decay, keep)
        });
        SgdTerms {
            lr: lr.clone(),
            momentum,
        }
    }

    fn apply(
        &self,
        terms: &SgdTerms<B>,
        param: Tensor<B, 1>,
        mut grad: Tensor<B, 1>,
        state: &mut [Tensor<B, 1>],
    ) -> Tensor<B, 1> {
        if let Some(penalty) = self.weight_decay {
            grad = param.clone().mul_scalar(penalty).add(grad);
        }
        if let (Some(config), Some((decay, keep))) = (&self.momentum, &terms.momentum) {
            let velocity = grad
                .clone()
                .mul(keep.clone())
                .add(state[0].clone().mul(decay.clone()));
            grad = if config.nesterov {
                velocity.clone().mul_scalar(config.momentum).add(grad)
            } else {
                velocity.clone()
            };
            state[0] = velocity;
        }
        param - grad.mul(terms.lr.clone())
    }
}
