//! Op signatures: equal for identical steps, different when the step changes.

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use burn_graph_capture::{CaptureSession, GraphCapture, OpSignature};
use lstm_example::train::{from_bytes, to_bytes};
use lstm_example::{LstmRegressor, LstmRegressorConfig, SineTask};

type B = Autodiff<GraphCapture<Flex>>;

/// Runs one SGD step on a fresh batch of `shape`; the batch is built outside the session,
/// as the step API does, and the step itself is recorded.
fn sgd_step_signature(
    model: &mut LstmRegressor<B>,
    task: &mut SineTask,
    (batch, time): (usize, usize),
) -> OpSignature {
    let device = Default::default();
    let batch = task.next_batch::<B>(batch, time, &device);
    let mut optim = SgdConfig::new().init::<B, LstmRegressor<B>>();
    let (updated, recording) = CaptureSession::record(|| {
        let loss = model.loss(batch.x, batch.y);
        let grads = GradientsParams::from_grads(loss.backward(), model);
        optim.step(0.01, model.clone(), grads)
    });
    *model = updated;
    assert!(recording.breakers.is_empty(), "{:?}", recording.breakers);
    recording.signature
}

/// A model with materialized parameters: Burn initializes parameters lazily, with
/// random draws, on their first use.
fn model() -> LstmRegressor<B> {
    let config = LstmRegressorConfig::new(8);
    let device = Default::default();
    from_bytes(&config, to_bytes(config.init::<Flex>(&device)), &device)
}

#[test]
fn identical_steps_have_equal_signatures() {
    let _rng = crate::common::rng::shared();
    let mut model = model();
    let mut task = SineTask::new(1, 32);
    let first = sgd_step_signature(&mut model, &mut task, (4, 6));
    let second = sgd_step_signature(&mut model, &mut task, (4, 6));
    assert!(first.len() > 50, "a whole step records many ops");
    assert_eq!(first, second);
    assert_eq!(first.fingerprint(), second.fingerprint());
}

#[test]
fn the_backward_pass_is_recorded() {
    let _rng = crate::common::rng::shared();
    let model = model();
    let device = Default::default();
    let batch = SineTask::new(1, 32).next_batch::<B>(4, 6, &device);
    let (_, forward) = CaptureSession::record(|| model.loss(batch.x.clone(), batch.y.clone()));
    let (_, with_backward) = CaptureSession::record(|| model.loss(batch.x, batch.y).backward());
    assert!(with_backward.signature.len() > 2 * forward.signature.len());
}

#[test]
fn batch_size_changes_the_signature() {
    let _rng = crate::common::rng::shared();
    let mut model = model();
    let mut task = SineTask::new(1, 32);
    let a = sgd_step_signature(&mut model, &mut task, (4, 6));
    let b = sgd_step_signature(&mut model, &mut task, (3, 6));
    assert_ne!(a, b);
    assert_eq!(
        a.first_difference(&b),
        Some(0),
        "the first op sees the batch"
    );
}

#[test]
fn sequence_length_changes_the_signature() {
    let _rng = crate::common::rng::shared();
    let mut model = model();
    let mut task = SineTask::new(1, 32);
    let a = sgd_step_signature(&mut model, &mut task, (4, 6));
    let b = sgd_step_signature(&mut model, &mut task, (4, 7));
    assert_ne!(a, b);
    assert!(b.len() > a.len(), "one more unrolled time step");
}

#[test]
fn a_host_dependent_branch_changes_the_signature() {
    let _rng = crate::common::rng::shared();
    let model = model();
    let device = Default::default();
    let batch = SineTask::new(1, 32).next_batch::<B>(4, 6, &device);
    let step = |clip: bool| {
        CaptureSession::record(|| {
            let out = model.forward(batch.x.clone());
            let out = if clip { out.clamp(-1.0, 1.0) } else { out };
            (out - batch.y.clone()).powi_scalar(2).mean().backward()
        })
        .1
        .signature
    };
    assert_eq!(step(false), step(false));
    assert_ne!(step(false), step(true));
}

/// Burn's own Adam passes its bias corrections as host scalars that change every step.
/// The signature sees them, so such a step is never mistaken for a static one. (Its
/// first step also differs in structure: the moment buffers do not exist yet.)
#[test]
fn step_varying_host_scalars_change_the_signature() {
    let _rng = crate::common::rng::shared();
    let mut model = model();
    let device = Default::default();
    let mut task = SineTask::new(1, 32);
    let mut optim = AdamConfig::new().init::<B, LstmRegressor<B>>();
    let mut signatures = Vec::new();
    for _ in 0..3 {
        let batch = task.next_batch::<B>(4, 6, &device);
        let (updated, recording) = CaptureSession::record(|| {
            let loss = model.loss(batch.x, batch.y);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            optim.step(0.01, model.clone(), grads)
        });
        model = updated;
        signatures.push(recording.signature);
    }
    assert_ne!(signatures[0].len(), signatures[1].len());
    let index = signatures[1]
        .first_difference(&signatures[2])
        .expect("Adam's bias correction differs between steps");
    let (a, b) = (&signatures[1].ops()[index], &signatures[2].ops()[index]);
    assert_eq!(
        (a.op, &a.inputs),
        (b.op, &b.inputs),
        "only a host scalar differs"
    );
    assert_ne!(a.attrs, b.attrs);
    let _ = model.valid();
}
