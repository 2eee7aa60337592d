//! Capturable Adam and AdamW, with the arithmetic of `burn_optim::{Adam, AdamW}`.
//!
//! Burn keeps the step count per parameter on the host and passes `beta^t` terms as host
//! scalars, different every step. Here the bias corrections are looked up on the device
//! from the step tensor ([`BiasCorrection`], bit-equal to Burn's). The moments start at
//! zero, which makes the first step Burn's first step: `0 * beta + grad * (1 - beta)` is
//! exactly `grad * (1 - beta)`, and for AMSGrad `max(0, v)` is exactly `v` as `v >= 0`.

use burn::config::Config;
use burn::optim::LearningRate;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use super::scalars::BiasCorrection;
use super::{Capturable, UpdateRule};

/// Configuration of [`CapturableAdam`]: the fields and defaults of Burn's `AdamConfig`,
/// plus the initial learning rate (Burn passes it to every `step`).
#[derive(Config, Debug)]
pub struct CapturableAdamConfig {
    /// The learning rate until [`set_lr`](super::CapturableOptimizer::set_lr) changes it.
    #[config(default = 1e-3)]
    pub learning_rate: LearningRate,
    /// Decay of the first moment.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Decay of the second moment.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// A value required for numerical stability.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// Whether to use the AMSGrad variant (one more state tensor per parameter).
    #[config(default = false)]
    pub amsgrad: bool,
    /// [Weight decay](WeightDecayConfig) config (L2 penalty added to the gradient).
    pub weight_decay: Option<WeightDecayConfig>,
    /// [Gradient clipping](GradientClippingConfig) config.
    pub grad_clipping: Option<GradientClippingConfig>,
}

/// Configuration of [`CapturableAdamW`]: the fields and defaults of Burn's `AdamWConfig`,
/// plus the initial learning rate.
#[derive(Config, Debug)]
pub struct CapturableAdamWConfig {
    /// The learning rate until [`set_lr`](super::CapturableOptimizer::set_lr) changes it.
    #[config(default = 1e-3)]
    pub learning_rate: LearningRate,
    /// Decay of the first moment.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Decay of the second moment.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// A value required for numerical stability.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// Decoupled weight decay, scaled by the learning rate.
    #[config(default = 1e-4)]
    pub weight_decay: f32,
    /// Cautious weight decay (<https://arxiv.org/abs/2510.12402>).
    #[config(default = false)]
    pub cautious_weight_decay: bool,
    /// Whether to use the AMSGrad variant (one more state tensor per parameter).
    #[config(default = false)]
    pub amsgrad: bool,
    /// [Gradient clipping](GradientClippingConfig) config.
    pub grad_clipping: Option<GradientClippingConfig>,
}

/// Adam whose learning rate, step count and bias corrections live on the device.
pub type CapturableAdam<B> = Capturable<AdamRule<<B as AutodiffBackend>::InnerBackend>, B>;

/// AdamW whose learning rate, step count and bias corrections live on the device.
pub type CapturableAdamW<B> = Capturable<AdamWRule<<B as AutodiffBackend>::InnerBackend>, B>;

impl CapturableAdamConfig {
    /// Builds the optimizer with its scalars on `device`.
    pub fn init<B: AutodiffBackend>(&self, device: &B::Device) -> CapturableAdam<B> {
        let rule = AdamRule {
            moments: Moments::new(self.beta_1, self.beta_2, self.amsgrad, device),
            epsilon: self.epsilon,
            weight_decay: self.weight_decay.as_ref().map(|config| config.penalty),
        };
        let clipping = self.grad_clipping.as_ref().map(|config| config.init());
        Capturable::new(rule, clipping, self.learning_rate, device)
    }
}

impl CapturableAdamWConfig {
    /// Builds the optimizer with its scalars on `device`.
    pub fn init<B: AutodiffBackend>(&self, device: &B::Device) -> CapturableAdamW<B> {
        let rule = AdamWRule {
            moments: Moments::new(self.beta_1, self.beta_2, self.amsgrad, device),
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            cautious: self.cautious_weight_decay,
        };
        let clipping = self.grad_clipping.as_ref().map(|config| config.init());
        Capturable::new(rule, clipping, self.learning_rate, device)
    }
}

/// The moment estimates shared by Adam and AdamW. State slots: first moment, second
/// moment, and with AMSGrad the running maximum of the second moment.
#[derive(Clone, Debug)]
struct Moments<B: Backend> {
    beta_1: f32,
    beta_2: f32,
    amsgrad: bool,
    correction_1: BiasCorrection<B>,
    correction_2: BiasCorrection<B>,
}

impl<B: Backend> Moments<B> {
    fn new(beta_1: f32, beta_2: f32, amsgrad: bool, device: &B::Device) -> Self {
        Self {
            beta_1,
            beta_2,
            amsgrad,
            correction_1: BiasCorrection::new(beta_1, device),
            correction_2: BiasCorrection::new(beta_2, device),
        }
    }

    fn slots(&self) -> usize {
        2 + usize::from(self.amsgrad)
    }

    /// Updates the moments in `state`; returns the first moment and the second moment to
    /// divide by.
    fn update(
        &self,
        grad: Tensor<B, 1>,
        state: &mut [Tensor<B, 1>],
    ) -> (Tensor<B, 1>, Tensor<B, 1>) {
        state[0] = state[0]
            .clone()
            .mul_scalar(self.beta_1)
            .add(grad.clone().mul_scalar(1.0 - self.beta_1));
        state[1] = state[1]
            .clone()
            .mul_scalar(self.beta_2)
            .add(grad.square().mul_scalar(1.0 - self.beta_2));
        if self.amsgrad {
            state[2] = state[2].clone().max_pair(state[1].clone());
        }
        (state[0].clone(), state[self.slots() - 1].clone())
    }
}

/// The constants of Adam.
#[derive(Clone, Debug)]
pub struct AdamRule<B: Backend> {
    moments: Moments<B>,
    epsilon: f32,
    weight_decay: Option<f32>,
}

/// This step's device terms of Adam.
#[derive(Debug)]
pub struct AdamTerms<B: Backend> {
    lr: Tensor<B, 1>,
    /// `sqrt(1 - beta_2^t) / (1 - beta_1^t)`.
    step_size: Tensor<B, 1>,
    /// `epsilon * sqrt(1 - beta_2^t)`.
    epsilon: Tensor<B, 1>,
}

impl<B: Backend> UpdateRule<B> for AdamRule<B> {
    type Terms = AdamTerms<B>;

    fn slots(&self) -> usize {
        self.moments.slots()
    }

    fn terms(
        &self,
        lr: &Tensor<B, 1>,
        _before: &Tensor<B, 1>,
        after: &Tensor<B, 1>,
    ) -> AdamTerms<B> {
        let correction_1 = self.moments.correction_1.at(after.clone());
        let correction_2_sqrt = self.moments.correction_2.at(after.clone()).sqrt();
        AdamTerms {
            lr: lr.clone(),
            step_size: correction_2_sqrt.clone().div(correction_1),
            epsilon: correction_2_sqrt.mul_scalar(self.epsilon),
        }
    }

    fn apply(
        &self,
        terms: &AdamTerms<B>,
        param: Tensor<B, 1>,
        mut grad: Tensor<B, 1>,
        state: &mut [Tensor<B, 1>],
    ) -> Tensor<B, 1> {
        if let Some(penalty) = self.weight_decay {
            grad = param.clone().mul_scalar(penalty).add(grad);
        }
        let (moment_1, moment_2) = self.moments.update(grad, state);
        let update = moment_1
            .mul(terms.step_size.clone())
            .div(moment_2.sqrt().add(terms.epsilon.clone()));
        param - update.mul(terms.lr.clone())
    }
}

/// The constants of AdamW.
#[derive(Clone, Debug)]
pub struct AdamWRule<B: Backend> {
    moments: Moments<B>,
    epsilon: f32,
    weight_decay: f32,
    cautious: bool,
}

/// This step's device terms of AdamW.
#[derive(Debug)]
pub struct AdamWTerms<B: Backend> {
    lr: Tensor<B, 1>,
    correction_1: Tensor<B, 1>,
    correction_2: Tensor<B, 1>,
    /// `lr * weight_decay` (cautious) or `1 - lr * weight_decay`; `None` without decay.
    decay: Option<Tensor<B, 1>>,
}

impl<B: Backend> UpdateRule<B> for AdamWRule<B> {
    type Terms = AdamWTerms<B>;

    fn slots(&self) -> usize {
        self.moments.slots()
    }

    fn terms(
        &self,
        lr: &Tensor<B, 1>,
        _before: &Tensor<B, 1>,
        after: &Tensor<B, 1>,
    ) -> AdamWTerms<B> {
        // Burn skips the decay when `lr * weight_decay == 0`. With a zero weight decay the
        // skip is static; with a zero learning rate the multiply by exactly 1 (or the
        // subtraction of exactly 0) below changes nothing, so no step-varying branch is
        // needed.
        let decay = (self.weight_decay != 0.0).then(|| {
            let rate = lr.clone().mul_scalar(self.weight_decay);
            if self.cautious {
                rate
            } else {
                rate.neg().add_scalar(1.0)
            }
        });
        AdamWTerms {
            lr: lr.clone(),
            correction_1: self.moments.correction_1.at(after.clone()),
            correction_2: self.moments.correction_2.at(after.clone()),
            decay,
        }
    }

    fn apply(
        &self,
        terms: &AdamWTerms<B>,
        param: Tensor<B, 1>,
        grad: Tensor<B, 1>,
        state: &mut [Tensor<B, 1>],
    ) -> Tensor<B, 1> {
        let (moment_1, moment_2) = self.moments.update(grad, state);
        let update = moment_1.clone().div(terms.correction_1.clone()).div(
            moment_2
                .div(terms.correction_2.clone())
                .sqrt()
                .add_scalar(self.epsilon),
        );
        let decayed = match &terms.decay {
            None => param,
            Some(rate) if self.cautious => {
                // Zero the decay where it works against the update direction.
                let differ = param
                    .clone()
                    .greater_equal_elem(0.0)
                    .not_equal(moment_1.greater_equal_elem(0.0));
                param.clone() - param.mul(rate.clone()).mask_fill(differ, 0.0)
            }
            Some(keep) => param.mul(keep.clone()),
        };
        decayed - update.mul(terms.lr.clone())
    }
}
