//! `GraphBackend` on the CPU: honest answers, no graphs, real buffer identities.

use burn::backend::Flex;
use burn::prelude::*;
use burn_graph_capture::{AnyTensor, Captured, GraphBackend, GraphCapture, GraphError};

type B = GraphCapture<Flex>;

#[test]
fn flex_has_no_hardware_graphs_and_no_arena() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    assert!(!B::supports_hardware_graphs(&device));
    let mut ran = false;
    assert!(matches!(
        B::capture(&device, || ran = true),
        Captured::Refused(GraphError::NoHardwareGraphs)
    ));
    assert!(!ran, "no window, so the step does not run");
    let x = AnyTensor::Float(Tensor::<B, 1>::ones([3], &device).into_primitive().tensor());
    assert!(matches!(B::pin(x.clone()), Err(GraphError::NoArena)));
    assert_eq!(B::copy_into(&x, &x), Err(GraphError::NoArena));
}

#[test]
fn buffer_identity_follows_storage() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let a = Tensor::<B, 1>::ones([3], &device);
    let b = Tensor::<B, 1>::ones([3], &device);
    let id = |t: &Tensor<B, 1>| {
        B::buffer_id(&AnyTensor::Float(t.clone().into_primitive().tensor())).unwrap()
    };
    assert_eq!(id(&a), id(&a.clone()), "a clone shares storage");
    assert_ne!(id(&a), id(&b), "equal values, distinct storage");
    assert_ne!(
        id(&a),
        id(&(a.clone() + 1.0)),
        "a new result is a new buffer"
    );
}
