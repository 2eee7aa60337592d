//! Sessions nest and overlap on one thread, and stay apart across threads.

use std::sync::{Arc, Barrier};

use burn::backend::Flex;
use burn::prelude::*;
use burn_graph_capture::{CaptureSession, GraphCapture};

type B = GraphCapture<Flex>;

fn ones(n: usize) -> Tensor<B, 1> {
    Tensor::ones([n], &Default::default())
}

fn op_names(recording: &burn_graph_capture::Recording) -> Vec<&'static str> {
    recording.signature.ops().iter().map(|op| op.op).collect()
}

#[test]
fn ops_outside_a_session_are_not_recorded() {
    let _rng = crate::common::rng::shared();
    let x = ones(3);
    let _ = x.clone().exp();
    let (_, recording) = CaptureSession::record(|| x.clone().log());
    assert_eq!(op_names(&recording), ["float_log"]);
}

#[test]
fn nested_sessions_see_their_own_scope() {
    let _rng = crate::common::rng::shared();
    let x = ones(3);
    let outer = CaptureSession::begin();
    let _ = x.clone().exp();
    let (_, inner) = CaptureSession::record(|| x.clone().log());
    let _ = x.clone().sqrt();
    let outer = outer.finish();
    assert_eq!(op_names(&inner), ["float_log"]);
    assert_eq!(op_names(&outer), ["float_exp", "float_log", "float_sqrt"]);
}

#[test]
fn overlapping_sessions_close_in_any_order() {
    let _rng = crate::common::rng::shared();
    let x = ones(3);
    let first = CaptureSession::begin();
    let _ = x.clone().exp();
    let second = CaptureSession::begin();
    let _ = x.clone().log();
    let first = first.finish();
    let _ = x.clone().sqrt();
    let second = second.finish();
    assert_eq!(op_names(&first), ["float_exp", "float_log"]);
    assert_eq!(op_names(&second), ["float_log", "float_sqrt"]);

    let (_, after) = CaptureSession::record(|| x.clone().cos());
    assert_eq!(op_names(&after), ["float_cos"]);
}

#[test]
fn a_panicking_step_leaves_no_session_open() {
    let _rng = crate::common::rng::shared();
    let result = std::panic::catch_unwind(|| {
        let _session = CaptureSession::begin();
        let _ = ones(2).exp();
        panic!("user step failed");
    });
    assert!(result.is_err());
    let (_, recording) = CaptureSession::record(|| ones(2).log());
    assert_eq!(op_names(&recording), ["float_ones", "float_log"]);
}

#[test]
fn threads_do_not_see_each_other() {
    let _rng = crate::common::rng::shared();
    let barrier = Arc::new(Barrier::new(2));
    let run = |op: fn(Tensor<B, 1>) -> Tensor<B, 1>, barrier: Arc<Barrier>| {
        std::thread::spawn(move || {
            let x = ones(4);
            let session = CaptureSession::begin();
            barrier.wait();
            for _ in 0..50 {
                let _ = op(x.clone());
            }
            barrier.wait();
            session.finish()
        })
    };
    let a = run(|x| x.exp(), barrier.clone());
    let b = run(|x| x.log(), barrier);
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!(op_names(&a), vec!["float_exp"; 50]);
    assert_eq!(op_names(&b), vec!["float_log"; 50]);
}
