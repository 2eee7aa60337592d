//! A capturable optimizer's step has the same op signature every step, even when the
//! learning rate changes in between: no step-varying host scalar reaches an op (I3).

use burn::backend::{Autodiff, Flex};
use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn_graph_capture::optim::{
    CapturableAdamConfig, CapturableAdamWConfig, CapturableOptimizer, CapturableSgdConfig,
};
use burn_graph_capture::{CaptureSession, GraphCapture, OpSignature};
use lstm_example::train::{from_bytes, to_bytes};
use lstm_example::{LstmRegressor, LstmRegressorConfig, SineTask};

type B = Autodiff<GraphCapture<Flex>>;
type Model = LstmRegressor<B>;

const LRS: [f64; 3] = [1e-2, 5e-3, 2e-3];

/// A model with materialized parameters (Burn initializes them lazily, at random).
fn model() -> Model {
    let config = LstmRegressorConfig::new(8);
    let device = Default::default();
    from_bytes(&config, to_bytes(config.init::<Flex>(&device)), &device)
}

/// Records three whole steps (forward, backward, update); `step` applies the
/// optimizer with the given lr. The batch is built outside the session.
fn signatures(mut step: impl FnMut(f64, Model, GradientsParams) -> Model) -> Vec<OpSignature> {
    let device = Default::default();
    let mut model = model();
    let mut task = SineTask::new(1, 32);
    LRS.iter()
        .map(|&lr| {
            let batch = task.next_batch::<B>(4, 6, &device);
            let (updated, recording) = CaptureSession::record(|| {
                let loss = model.loss(batch.x, batch.y);
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                step(lr, model.clone(), grads)
            });
            model = updated;
            assert!(recording.breakers.is_empty(), "{:?}", recording.breakers);
            recording.signature
        })
        .collect()
}

fn assert_static(name: &str, signatures: &[OpSignature]) {
    assert!(
        signatures[0].len() > 50,
        "{name}: a whole step records many ops"
    );
    for (i, signature) in signatures.iter().enumerate().skip(1) {
        assert_eq!(
            signatures[0].first_difference(signature),
            None,
            "{name}: step {} differs from step 1",
            i + 1
        );
        assert_eq!(signatures[0].fingerprint(), signature.fingerprint());
    }
}

/// Runs three steps of `optim`, setting each step's lr between steps, and checks that
/// the three recorded signatures are equal.
fn assert_capturable(name: &str, mut optim: impl CapturableOptimizer<Model, B>) {
    let device = Default::default();
    let mut model = model();
    optim.init_state(&model);
    let mut task = SineTask::new(1, 32);
    let mut recorded = Vec::new();
    for lr in LRS {
        optim.set_lr(lr);
        let batch = task.next_batch::<B>(4, 6, &device);
        let (updated, recording) = CaptureSession::record(|| {
            let loss = model.loss(batch.x, batch.y);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            CapturableOptimizer::step(&mut optim, model.clone(), grads)
        });
        model = updated;
        assert!(
            recording.breakers.is_empty(),
            "{name}: {:?}",
            recording.breakers
        );
        recorded.push(recording.signature);
    }
    assert_static(name, &recorded);
}

#[test]
fn sgd_with_momentum_steps_are_static() {
    let _rng = crate::common::rng::shared();
    let config = CapturableSgdConfig::new().with_momentum(Some(MomentumConfig::new()));
    assert_capturable("sgd", config.init::<B>(&Default::default()));
}

#[test]
fn adam_steps_are_static() {
    let _rng = crate::common::rng::shared();
    let config = CapturableAdamConfig::new().with_amsgrad(true);
    assert_capturable("adam", config.init::<B>(&Default::default()));
}

#[test]
fn adamw_steps_are_static() {
    let _rng = crate::common::rng::shared();
    let config = CapturableAdamWConfig::new().with_cautious_weight_decay(true);
    assert_capturable("adamw", config.init::<B>(&Default::default()));
}

/// The check above can fail: Burn's SGD passes the lr as a host scalar, and the
/// signature sees it change.
#[test]
fn burn_sgd_steps_change_with_the_lr() {
    let _rng = crate::common::rng::shared();
    let mut optim = SgdConfig::new().init::<B, Model>();
    let recorded = signatures(|lr, model, grads| optim.step(lr, model, grads));
    assert_eq!(recorded[0].len(), recorded[1].len());
    assert!(recorded[0].first_difference(&recorded[1]).is_some());
}

/// Without `init_state`, the first step creates the state and differs from later ones;
/// that is why the step API calls `init_state` before warmup.
#[test]
fn without_init_state_the_first_step_differs() {
    let _rng = crate::common::rng::shared();
    let mut optim = CapturableAdamConfig::new().init::<B>(&Default::default());
    let recorded =
        signatures(|_, model, grads| CapturableOptimizer::step(&mut optim, model, grads));
    assert_ne!(recorded[0], recorded[1]);
    assert_eq!(recorded[1], recorded[2]);
}
