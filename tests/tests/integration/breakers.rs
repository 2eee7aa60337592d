//! Every capture-breaker kind is detected and reported with its typed reason.

use burn::backend::{Autodiff, Flex};
use burn::nn::{Dropout, DropoutConfig};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_graph_capture::{BreakerKind, CaptureBreaker, CaptureSession, GraphCapture};

type B = GraphCapture<Flex>;

fn breakers_of(f: impl FnOnce()) -> Vec<CaptureBreaker> {
    CaptureSession::record(f).1.breakers
}

fn kinds(breakers: &[CaptureBreaker]) -> Vec<(BreakerKind, &str)> {
    breakers.iter().map(|b| (b.kind, b.op.as_ref())).collect()
}

fn tensor() -> Tensor<B, 2> {
    Tensor::from_floats([[1.0, -2.0], [0.0, 4.0]], &Default::default())
}

#[test]
fn plain_compute_breaks_nothing() {
    let _rng = crate::common::rng::shared();
    let x = tensor();
    let breakers = breakers_of(|| {
        let _ = (x.clone() * 2.0)
            .exp()
            .matmul(x.clone().transpose())
            .sum_dim(1);
    });
    assert!(breakers.is_empty(), "{breakers:?}");
}

#[test]
fn host_reads_are_breakers() {
    let _rng = crate::common::rng::shared();
    let x = tensor();
    let breakers = breakers_of(|| {
        let _ = x.clone().into_data();
    });
    assert_eq!(
        kinds(&breakers),
        [(BreakerKind::HostRead, "float_into_data")]
    );

    let ints = x.clone().int();
    let breakers = breakers_of(|| {
        let _ = ints.clone().into_data();
    });
    assert_eq!(kinds(&breakers), [(BreakerKind::HostRead, "int_into_data")]);

    let breakers = breakers_of(|| B::sync(&Default::default()).unwrap());
    assert_eq!(kinds(&breakers), [(BreakerKind::HostRead, "sync")]);
}

#[test]
fn scalar_reads_are_host_reads() {
    let _rng = crate::common::rng::shared();
    let x = tensor();
    let breakers = breakers_of(|| {
        let _ = x.clone().sum().into_scalar();
    });
    assert!(
        breakers.iter().any(|b| b.kind == BreakerKind::HostRead),
        "{breakers:?}"
    );
}

/// A move to the device a tensor already sits on returns it unchanged (BatchNorm does
/// this with its running statistics every step): recorded as an op, not a breaker.
/// (Flex has a single device, so a real transfer cannot happen here.)
#[test]
fn a_same_device_transfer_is_not_a_breaker() {
    let _rng = crate::common::rng::shared();
    let x = tensor();
    let (_, recording) = CaptureSession::record(|| {
        let _ = x.clone().to_device(&Default::default());
    });
    assert!(recording.breakers.is_empty(), "{:?}", recording.breakers);
    let ops: Vec<_> = recording.signature.ops().iter().map(|op| op.op).collect();
    assert_eq!(ops, ["float_to_device"]);
}

#[test]
fn random_ops_and_reseeding_are_breakers() {
    let _rng = crate::common::rng::exclusive();
    let device = Default::default();
    let breakers = breakers_of(|| {
        let _ = Tensor::<B, 2>::random([2, 2], Distribution::Default, &device);
    });
    assert_eq!(kinds(&breakers), [(BreakerKind::Rng, "float_random")]);

    let breakers = breakers_of(|| B::seed(&device, 1));
    assert_eq!(kinds(&breakers), [(BreakerKind::Rng, "seed")]);
}

#[test]
fn dropout_masks_are_rng_breakers() {
    let _rng = crate::common::rng::shared();
    let dropout: Dropout = DropoutConfig::new(0.5).init();
    let x = Tensor::<Autodiff<B>, 2>::ones([4, 4], &Default::default());
    let breakers = breakers_of(|| {
        let _ = dropout.forward(x.clone());
    });
    assert!(
        breakers.iter().any(|b| b.kind == BreakerKind::Rng),
        "{breakers:?}"
    );
}

#[test]
fn data_dependent_shapes_are_breakers() {
    let _rng = crate::common::rng::shared();
    let x = tensor();
    let breakers = breakers_of(|| {
        let _ = x.clone().greater_elem(0.5).argwhere();
    });
    assert!(
        kinds(&breakers).contains(&(BreakerKind::DataDependentShape, "bool_argwhere")),
        "{breakers:?}"
    );
}

#[test]
fn breakers_serialize_with_their_reason() {
    let _rng = crate::common::rng::shared();
    let breaker = CaptureBreaker {
        kind: BreakerKind::Rng,
        op: "float_random".into(),
    };
    let json = serde_json::to_string(&breaker).unwrap();
    assert_eq!(json, r#"{"kind":"Rng","op":"float_random"}"#);
    assert_eq!(
        serde_json::from_str::<CaptureBreaker>(&json).unwrap(),
        breaker
    );
}
