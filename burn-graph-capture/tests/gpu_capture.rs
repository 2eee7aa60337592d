//! GPU tests of capture windows, retention, the arena and replay (issue 5, runtime part).
//!
//! Every GPU test is `#[ignore]`d: it never passes vacuously on a machine without a GPU,
//! and fails there (the server cannot start). Run with `--ignored` on the GPU machine.

#![cfg(feature = "cuda")]

mod gpu_common;

use burn::tensor::{Tensor, TensorPrimitive};
use burn_cubecl::{CubeBackend, tensor::CubeTensor};
use burn_graph_capture::{
    AnyTensor, BufferId, GraphError,
    backend::GraphBackend,
    runtime::{
        CaptureError, CudaGraphDevice, CudaGraphRuntime, capture_begin, capture_end, with_server,
    },
};

use gpu_common::host_values;

type B = CubeBackend<CudaGraphRuntime, f32, i32, u8>;
type Prim = CubeTensor<CudaGraphRuntime>;

const N: usize = 4096;

fn dev() -> CudaGraphDevice {
    CudaGraphDevice::new(0)
}

fn prim(t: Tensor<B, 1>) -> Prim {
    t.into_primitive().tensor()
}

fn pin(p: Prim) -> Result<Prim, GraphError> {
    B::pin(AnyTensor::Float(p)).map(|t| t.into_float().expect("a float tensor"))
}

fn copy_into(dst: &Prim, src: &Prim) -> Result<(), GraphError> {
    B::copy_into(
        &AnyTensor::Float(dst.clone()),
        &AnyTensor::Float(src.clone()),
    )
}

fn buffer_id(p: &Prim) -> Option<BufferId> {
    B::buffer_id(&AnyTensor::Float(p.clone()))
}

fn wrap(p: Prim) -> Tensor<B, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

fn host(t: Tensor<B, 1>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().expect("f32 data")
}

fn input(seed: u64) -> Tensor<B, 1> {
    Tensor::from_floats(host_values(seed, N).as_slice(), &dev())
}

/// The captured computation.
fn step(x: Tensor<B, 1>) -> Tensor<B, 1> {
    ((x * 2.0) + 1.0).exp()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Eager work that allocates and frees: what corrupted replays in cubecl#1612 when a
/// graph's intermediates went back to the pool.
fn eager_churn(seed: u64) {
    for k in 0..4 {
        let a = input(seed * 31 + k);
        let b = (a.clone() * 3.0 - 0.5).tanh() + a;
        let _ = host(b.sum());
    }
}

/// Pinned input `x`, pinned output `out`, and a graph of `out <- step(x)`.
fn captured() -> (Prim, Prim, <B as GraphBackend>::Graph) {
    let x = pin(prim(input(1))).expect("pin x");
    let out = pin(prim(Tensor::zeros([N], &dev()))).expect("pin out");
    // Warmup: compile every kernel of the step and fill the pools.
    for _ in 0..2 {
        let y = step(wrap(x.clone()));
        copy_into(&out, &prim(y)).expect("eager copy_into");
        let _ = host(wrap(out.clone()));
    }
    let ((), graph) = B::capture(&dev(), || {
        let y = step(wrap(x.clone()));
        copy_into(&out, &prim(y)).expect("recorded copy_into");
    })
    .recorded()
    .expect("a recorded graph");
    (x, out, graph)
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn c1_replays_match_eager_bit_for_bit_with_eager_churn_between() {
    let (x, out, graph) = captured();
    let info = graph.info();
    println!("graph: {info:?}");
    // The step's intermediates live in the graph's private pool; only the pinned input
    // and output (arena) need retention of their own.
    assert!(info.launches >= 1 && info.retained_buffers >= 2, "{info:?}");
    assert!(
        info.pool_bytes > 0,
        "intermediates in the private pool: {info:?}"
    );
    let x_id = buffer_id(&x).expect("buffer id");
    let out_id = buffer_id(&out).expect("buffer id");
    let mut worst = 0usize;
    for i in 0..100u64 {
        let xi = input(1000 + i);
        copy_into(&x, &prim(xi.clone())).expect("eager copy_into");
        eager_churn(i);
        B::replay(&graph).expect("replay");
        // Eager allocations between the replay and the read (the hazard).
        eager_churn(i + 7);
        let got = host(wrap(out.clone()));
        let want = host(step(xi));
        let diff = bits(&got)
            .iter()
            .zip(bits(&want))
            .filter(|(a, b)| **a != *b)
            .count();
        worst = worst.max(diff);
        assert_eq!(
            diff, 0,
            "replay {i}: {diff} of {N} values differ from eager"
        );
    }
    // Pinned buffers kept their identity.
    assert_eq!(buffer_id(&x), Some(x_id));
    assert_eq!(buffer_id(&out), Some(out_id));
    println!("capture c1: 100 replays, bit-exact vs eager, worst differing values {worst}");
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn c2_window_allocates_new_pages_and_a_host_read_fails_cleanly() {
    // Warm the zeros kernel at the window's size (a small tensor launches another
    // variant, which the window would meet first when this test runs in a process of its
    // own), and hold the warm tensor so that its page cannot serve the window.
    let warm = Tensor::<B, 1>::zeros([64 << 20], &dev());
    let _ = host(warm.clone().narrow(0, 0, 16));
    capture_begin(&dev()).expect("capture_begin");
    // 256 MiB: no page reserved before the window can serve it; the window allocates one
    // (plain cuMemAlloc in relaxed capture mode) and the graph retains it.
    let big = Tensor::<B, 1>::zeros([64 << 20], &dev());
    let graph = capture_end(&dev()).expect("a window may allocate new pages");
    drop(warm);
    graph.replay().expect("replay");
    let head = host(big.clone().narrow(0, 0, 1024));
    assert!(head.iter().all(|v| *v == 0.0), "the replay wrote the zeros");
    drop(big);
    drop(graph);
    assert!(!with_server(&dev(), |s| s.is_capturing()).unwrap());
    // The stream works eagerly afterwards, and a second window still captures.
    let got = host(step(input(5)));
    let want: Vec<f32> = host_values(5, N)
        .iter()
        .map(|v| (v * 2.0 + 1.0).exp())
        .collect();
    let max_rel = got
        .iter()
        .zip(&want)
        .map(|(a, b)| ((a - b) / b).abs())
        .fold(0f32, f32::max);
    assert!(
        max_rel < 1e-5,
        "eager after a failed window: max rel err {max_rel}"
    );
    // A host read inside a window is refused with a typed error, too.
    capture_begin(&dev()).expect("capture_begin");
    let t = input(6);
    let read = t.clone().into_data_async();
    let read = burn::tensor::try_read_sync(read);
    let err = capture_end(&dev()).expect_err("a read breaks the window");
    assert!(
        matches!(err, CaptureError::HostSync(_)),
        "{err:?} / {read:?}"
    );
    let _ = host(t);
    println!(
        "capture c2: a 256 MiB page allocated inside a window; HostSync window failed cleanly; eager ok (max rel {max_rel:e})"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn c3_memory_in_use_is_flat_over_1000_replays() {
    let (x, out, graph) = captured();
    for _ in 0..10 {
        B::replay(&graph).expect("replay");
    }
    let _ = host(wrap(out.clone()));
    let before = with_server(&dev(), |s| s.pool_usage()).unwrap();
    let arena = with_server(&dev(), |s| s.arena_usage()).unwrap();
    for _ in 0..1000 {
        B::replay(&graph).expect("replay");
    }
    let _ = host(wrap(out.clone()));
    let after = with_server(&dev(), |s| s.pool_usage()).unwrap();
    println!(
        "capture c3: in use {} -> {} bytes, reserved {} -> {} bytes over 1000 replays; arena {} bytes in use; graph retains {} device bytes",
        before.bytes_in_use,
        after.bytes_in_use,
        before.bytes_reserved,
        after.bytes_reserved,
        arena.bytes_in_use,
        graph.info().retained_device_bytes
    );
    assert_eq!(before.bytes_in_use, after.bytes_in_use);
    assert_eq!(before.bytes_reserved, after.bytes_reserved);
    drop((x, graph));
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn c4_dropping_a_graph_right_after_queued_replays_is_safe() {
    let (x, out, graph) = captured();
    let graphs_before = with_server(&dev(), |s| s.graph_count()).unwrap();
    let pools_before = with_server(&dev(), |s| s.graph_pool_count()).unwrap();
    copy_into(&x, &prim(input(77))).unwrap();
    for _ in 0..50 {
        B::replay(&graph).expect("replay");
    }
    drop(graph);
    // Eager work right after: reuses nothing the in-flight replays still touch.
    eager_churn(3);
    let got = host(wrap(out.clone()));
    assert_eq!(bits(&got), bits(&host(step(input(77)))));
    let graphs_after = with_server(&dev(), |s| s.graph_count()).unwrap();
    assert_eq!(graphs_after + 1, graphs_before);
    // The graph's private pool went with it (nothing else held its memory).
    let pools_after = with_server(&dev(), |s| s.graph_pool_count()).unwrap();
    assert_eq!(pools_after + 1, pools_before);
    println!(
        "capture c4: graph dropped behind 50 queued replays; output bit-exact; graphs {graphs_before} -> {graphs_after}"
    );
}
