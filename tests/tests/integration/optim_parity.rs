//! Each capturable optimizer trains like Burn's own optimizer of the same config.
//!
//! 50 steps of LSTM training on `Autodiff<Flex>`, from identical parameters and batches:
//! the losses of every step and the final parameters agree within 1e-5 relative.
//!
//! Largest difference observed (Flex, debug build, every case): 0, bit-identical losses
//! and parameters. Nothing in the arithmetic forces a difference:
//! - SGD's first step, folded into the common one, computes `grad * 1 + 0 * 0`, exactly
//!   Burn's `velocity = grad`, and uses Burn's `f32` roundings of `1 - dampening`.
//! - Adam's bias corrections are Burn's own `1 - beta.powi(t)` values, looked up on the
//!   device from the step count. A device `exp(t * ln beta)` (or `powf`) instead differs
//!   from `powi` by an ulp of `beta^t`; in early steps, where `1 - beta_2^t` is about
//!   1e-3, that gave up to 1.5e-5 relative on the losses, over the 1e-5 bound
//!   (`approximate_corrections_are_not_burns` below shows the ulps).
//! - AdamW's decay factor `1 - lr * weight_decay` is rounded in `f32` on the device and
//!   in `f64` (then `f32`) by Burn: it can differ by one ulp of 1 for some `lr`; it did
//!   not for the rates used here. The tolerance covers that case.

use burn::backend::{Autodiff, Flex};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::lr_scheduler::LrScheduler;
use burn::optim::lr_scheduler::linear::LinearLrSchedulerConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, AdamWConfig, GradientsParams, LearningRate, Optimizer, SgdConfig};
use burn::prelude::*;
use burn_graph_capture::optim::{
    BiasCorrection, CapturableAdamConfig, CapturableAdamWConfig, CapturableOptimizer,
    CapturableSgdConfig, approximate_bias_correction,
};
use lstm_example::train::{from_bytes, parameter_values, to_bytes};
use lstm_example::{LstmRegressor, LstmRegressorConfig, SineTask};

type B = Autodiff<Flex>;
type Model = LstmRegressor<B>;

const STEPS: usize = 50;
const SHAPE: (usize, usize) = (4, 8);
const HIDDEN: usize = 16;
const TOLERANCE: f64 = 1e-5;

/// The learning rate of each step.
#[derive(Clone, Copy)]
enum Schedule {
    Constant(LearningRate),
    /// Burn's linear scheduler from 1e-2 down to 1e-4 over the run: a new lr every step.
    Linear,
}

impl Schedule {
    fn lrs(self) -> Vec<LearningRate> {
        match self {
            Schedule::Constant(lr) => vec![lr; STEPS],
            Schedule::Linear => {
                let mut scheduler = LinearLrSchedulerConfig::new(1e-2, 1e-4, STEPS)
                    .init()
                    .expect("valid scheduler");
                (0..STEPS).map(|_| scheduler.step()).collect()
            }
        }
    }
}

struct Run {
    losses: Vec<f32>,
    params: Vec<Vec<f32>>,
}

fn model(bytes: &[u8]) -> Model {
    let config = LstmRegressorConfig::new(HIDDEN);
    from_bytes(&config, bytes.to_vec(), &Default::default())
}

fn initial_bytes() -> Vec<u8> {
    let config = LstmRegressorConfig::new(HIDDEN);
    to_bytes(config.init::<Flex>(&Default::default()))
}

/// One training run; `step` applies the optimizer with the given lr.
fn train(
    mut model: Model,
    mut step: impl FnMut(LearningRate, Model, GradientsParams) -> Model,
    schedule: Schedule,
) -> Run {
    let device = Default::default();
    let mut task = SineTask::new(11, 32);
    let mut losses = Vec::with_capacity(STEPS);
    for lr in schedule.lrs() {
        let batch = task.next_batch::<B>(SHAPE.0, SHAPE.1, &device);
        let loss = model.loss(batch.x, batch.y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = step(lr, model, grads);
        losses.push(loss.into_scalar().elem::<f32>());
    }
    Run {
        losses,
        params: parameter_values(&model),
    }
}

fn train_burn(bytes: &[u8], mut optim: impl Optimizer<Model, B>, schedule: Schedule) -> Run {
    train(
        model(bytes),
        |lr, model, grads| optim.step(lr, model, grads),
        schedule,
    )
}

/// Ours, the capturable way: state created up front, lr written into its tensor.
fn train_ours(
    bytes: &[u8],
    mut optim: impl CapturableOptimizer<Model, B>,
    schedule: Schedule,
) -> Run {
    let model = model(bytes);
    optim.init_state(&model);
    train(
        model,
        |lr, model, grads| {
            optim.set_lr(lr);
            CapturableOptimizer::step(&mut optim, model, grads)
        },
        schedule,
    )
}

/// Largest relative difference of the losses (per step) and of the parameters (per
/// tensor, relative to that tensor's largest magnitude: an element-wise relative error
/// means nothing for the elements that happen to pass near zero).
fn max_relative_difference(burn: &Run, ours: &Run) -> (f64, f64) {
    assert_eq!(burn.losses.len(), ours.losses.len());
    let loss = burn
        .losses
        .iter()
        .zip(&ours.losses)
        .map(|(&a, &b)| ((a - b).abs() / a.abs().max(b.abs())) as f64)
        .fold(0.0, f64::max);
    assert_eq!(burn.params.len(), ours.params.len());
    let params = burn
        .params
        .iter()
        .zip(&ours.params)
        .map(|(a, b)| {
            assert_eq!(a.len(), b.len());
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
            let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            (diff / scale) as f64
        })
        .fold(0.0, f64::max);
    (loss, params)
}

fn assert_parity(
    name: &str,
    burn: impl Optimizer<Model, B>,
    ours: impl CapturableOptimizer<Model, B>,
    schedule: Schedule,
) {
    let bytes = initial_bytes();
    let burn = train_burn(&bytes, burn, schedule);
    let ours = train_ours(&bytes, ours, schedule);
    let mean = |losses: &[f32]| losses.iter().sum::<f32>() / losses.len() as f32;
    assert!(
        mean(&burn.losses[STEPS - 10..]) < mean(&burn.losses[..10]),
        "{name}: training should make progress: {:?}",
        burn.losses
    );
    assert!(
        burn.params != parameter_values(&model(&bytes)),
        "{name}: parameters should move"
    );
    let (loss, params) = max_relative_difference(&burn, &ours);
    println!("{name}: max relative difference: losses {loss:e}, parameters {params:e}");
    assert!(
        loss <= TOLERANCE && params <= TOLERANCE,
        "{name}: losses differ by {loss:e}, parameters by {params:e} (relative)"
    );
}

fn momentum() -> MomentumConfig {
    MomentumConfig::new().with_momentum(0.9).with_dampening(0.1)
}

#[test]
fn sgd_with_momentum() {
    let _rng = crate::common::rng::shared();
    let momentum = Some(momentum());
    assert_parity(
        "sgd momentum",
        SgdConfig::new().with_momentum(momentum.clone()).init(),
        CapturableSgdConfig::new()
            .with_momentum(momentum)
            .init::<B>(&Default::default()),
        Schedule::Constant(0.05),
    );
}

#[test]
fn sgd_with_nesterov_momentum() {
    let _rng = crate::common::rng::shared();
    let momentum = Some(momentum().with_dampening(0.0).with_nesterov(true));
    assert_parity(
        "sgd nesterov",
        SgdConfig::new().with_momentum(momentum.clone()).init(),
        CapturableSgdConfig::new()
            .with_momentum(momentum)
            .init::<B>(&Default::default()),
        Schedule::Constant(0.05),
    );
}

#[test]
fn sgd_with_weight_decay() {
    let _rng = crate::common::rng::shared();
    let decay = Some(WeightDecayConfig::new(0.05));
    let momentum = Some(momentum());
    assert_parity(
        "sgd weight decay",
        SgdConfig::new()
            .with_weight_decay(decay.clone())
            .with_momentum(momentum.clone())
            .init(),
        CapturableSgdConfig::new()
            .with_weight_decay(decay)
            .with_momentum(momentum)
            .init::<B>(&Default::default()),
        Schedule::Constant(0.05),
    );
}

#[test]
fn sgd_with_a_schedule() {
    let _rng = crate::common::rng::shared();
    let momentum = Some(momentum());
    assert_parity(
        "sgd schedule",
        SgdConfig::new().with_momentum(momentum.clone()).init(),
        CapturableSgdConfig::new()
            .with_momentum(momentum)
            .init::<B>(&Default::default()),
        Schedule::Linear,
    );
}

#[test]
fn adam() {
    let _rng = crate::common::rng::shared();
    assert_parity(
        "adam",
        AdamConfig::new().init(),
        CapturableAdamConfig::new().init::<B>(&Default::default()),
        Schedule::Constant(1e-2),
    );
}

#[test]
fn adam_with_weight_decay() {
    let _rng = crate::common::rng::shared();
    let decay = Some(WeightDecayConfig::new(0.01));
    assert_parity(
        "adam weight decay",
        AdamConfig::new().with_weight_decay(decay.clone()).init(),
        CapturableAdamConfig::new()
            .with_weight_decay(decay)
            .init::<B>(&Default::default()),
        Schedule::Constant(1e-2),
    );
}

#[test]
fn adam_amsgrad_with_a_schedule() {
    let _rng = crate::common::rng::shared();
    assert_parity(
        "adam amsgrad schedule",
        AdamConfig::new().with_amsgrad(true).init(),
        CapturableAdamConfig::new()
            .with_amsgrad(true)
            .init::<B>(&Default::default()),
        Schedule::Linear,
    );
}

#[test]
fn adamw() {
    let _rng = crate::common::rng::shared();
    assert_parity(
        "adamw",
        AdamWConfig::new().with_weight_decay(0.05).init(),
        CapturableAdamWConfig::new()
            .with_weight_decay(0.05)
            .init::<B>(&Default::default()),
        Schedule::Constant(1e-2),
    );
}

#[test]
fn adamw_with_a_schedule() {
    let _rng = crate::common::rng::shared();
    assert_parity(
        "adamw schedule",
        AdamWConfig::new().with_weight_decay(0.05).init(),
        CapturableAdamWConfig::new()
            .with_weight_decay(0.05)
            .init::<B>(&Default::default()),
        Schedule::Linear,
    );
}

#[test]
fn adamw_cautious_weight_decay() {
    let _rng = crate::common::rng::shared();
    assert_parity(
        "adamw cautious",
        AdamWConfig::new()
            .with_weight_decay(0.05)
            .with_cautious_weight_decay(true)
            .init(),
        CapturableAdamWConfig::new()
            .with_weight_decay(0.05)
            .with_cautious_weight_decay(true)
            .init::<B>(&Default::default()),
        Schedule::Constant(1e-2),
    );
}

/// The device table returns Burn's host values for every step until saturation.
#[test]
fn bias_corrections_equal_burns_host_values() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    for beta in [0.9f32, 0.99, 0.999] {
        let correction = BiasCorrection::<Flex>::new(beta, &device);
        for t in (1..200).chain((200..20_000).step_by(97)) {
            let step = Tensor::<Flex, 1>::from_floats([t as f32], &device);
            let ours = correction.at(step).into_scalar();
            assert_eq!(
                ours.to_bits(),
                (1.0 - beta.powi(t)).to_bits(),
                "beta {beta}, t {t}"
            );
        }
    }
}

/// For a `beta` whose table does not saturate, later steps use the approximation.
#[test]
fn bias_corrections_beyond_the_table_are_approximate() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let beta = 0.99999f32;
    let correction = BiasCorrection::<Flex>::new(beta, &device);
    let at = |t: i32| {
        let step = Tensor::<Flex, 1>::from_floats([t as f32], &device);
        correction.at(step).into_scalar()
    };
    for t in [1, 1_000, 65_535] {
        assert_eq!(at(t).to_bits(), (1.0 - beta.powi(t)).to_bits(), "t {t}");
    }
    for t in [65_536, 100_000, 1_000_000] {
        let exact = 1.0 - (beta as f64).powi(t);
        let relative = (at(t) as f64 - exact).abs() / exact;
        assert!(relative <= 1e-6, "t {t}: {} vs {exact}", at(t));
    }
}

/// Why the table: `exp(t * ln beta)` on the device is not `powi` on the host.
#[test]
fn approximate_corrections_are_not_burns() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let differing = (1..=50)
        .filter(|&t| {
            let step = Tensor::<Flex, 1>::from_floats([t as f32], &device);
            let ours = approximate_bias_correction(step, 0.999).into_scalar();
            ours.to_bits() != (1.0 - 0.999f32.powi(t)).to_bits()
        })
        .count();
    println!("exp(t ln beta) differs from powi at {differing} of 50 steps");
    assert!(differing > 0);
}
