//! CubeCL's autotuned matmul against cuBLAS at the GEMM shapes of the LSTM step
//! (issue 12, part 2: measure before routing any matmul).
//!
//! For each shape `[m, k] @ [k, n]` (fp32, row-major), one process times:
//! - CubeCL's matmul on this crate's plain stack (`CudaCube`), autotuned first;
//! - cuBLAS `sgemm` (cudarc, loaded dynamically; default math mode, so no TF32) on a
//!   stream of its own;
//! - the runtime's own route, `RoutedMatmul::matmul` (cuBLAS on the runtime's stream,
//!   each GEMM queued on the device's server like a kernel launch);
//!
//! each as the median over rounds of `ITERS` launches queued back to back and one sync,
//! divided by `ITERS` (per-GEMM device throughput, launch overhead included). Both run on
//! the same inputs, and both results are compared with an f64 reference computed on the
//! host: the maximum error relative to the reference's largest magnitude. A markdown
//! table goes to stdout.
//!
//! `cargo bench --features cuda -p integration-tests --bench gpu_matmul` on a GPU machine
//! (`xtask gpu run matmul`).

use std::time::Instant;

use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::TensorPrimitive;
use burn_graph_capture::runtime::CudaGraphDevice;
use burn_graph_capture::{CudaCube, RoutedMatmul};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// `(m, k, n, what)`: the GEMMs of the b32/t64/h256 step (`nn::Lstm` runs the small
/// ones per time step; the batched form runs the large ones once), and one larger step.
const SHAPES: &[(usize, usize, usize, &str)] = &[
    (32, 256, 256, "one gate's Linear, per step (nn::Lstm)"),
    (32, 256, 1024, "h @ W_h, all four gates, per step"),
    (256, 32, 256, "a gate's weight gradient for one step"),
    (2048, 256, 1024, "x @ W_x for all 64 steps"),
    (256, 2048, 1024, "a whole-sequence weight gradient"),
    (2048, 32, 1024, "issue 12's [2048,32]@[32,1024]"),
    (128, 512, 2048, "h @ W_h at b128/h512"),
];

/// Launches per timed round, and rounds per measurement.
const ITERS: usize = 200;
const ROUNDS: usize = 7;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Microseconds per call of `run`, which queues one GEMM; `sync` waits for the device.
fn time_us(mut run: impl FnMut(), mut sync: impl FnMut()) -> f64 {
    for _ in 0..20 {
        run();
    }
    sync();
    let rounds = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..ITERS {
                run();
            }
            sync();
            start.elapsed().as_secs_f64() * 1e6 / ITERS as f64
        })
        .collect();
    median(rounds)
}

/// `a @ b` in f64, row-major.
fn reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = f64::from(a[i * k + p]);
            let row = &b[p * n..(p + 1) * n];
            for (out, &y) in c[i * n..(i + 1) * n].iter_mut().zip(row) {
                *out += x * f64::from(y);
            }
        }
    }
    c
}

/// Largest error of `got` relative to the largest magnitude of `want`.
fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0.0f64, |s, w| s.max(w.abs())).max(1e-30);
    let error = got
        .iter()
        .zip(want)
        .fold(0.0f64, |e, (g, w)| e.max((f64::from(*g) - w).abs()));
    error / scale
}

/// cuBLAS on its own stream: `c = a @ b` for row-major operands, as the column-major
/// product `c^T = b^T a^T`.
struct Cublas {
    stream: std::sync::Arc<CudaStream>,
    blas: CudaBlas,
}

impl Cublas {
    fn new() -> Self {
        let context = CudaContext::new(0).expect("CUDA context");
        let stream = context.new_stream().expect("stream");
        let blas = CudaBlas::new(stream.clone()).expect("cuBLAS (libcublas) could not be loaded");
        Self { stream, blas }
    }

    fn gemm(
        &self,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
        mkn: [usize; 3],
    ) {
        let [m, k, n] = mkn.map(|d| i32::try_from(d).expect("dimension fits an int"));
        let config = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n,
            n: m,
            k,
            alpha: 1.0f32,
            lda: n,
            ldb: k,
            beta: 0.0f32,
            ldc: n,
        };
        // SAFETY: `b` holds k x n, `a` m x k and `c` m x n floats, as the config reads.
        unsafe { self.blas.gemm(config, b, a, c) }.expect("sgemm");
    }
}

struct Row {
    shape: (usize, usize, usize, &'static str),
    cube_us: f64,
    cublas_us: f64,
    routed_us: f64,
    cube_error: f64,
    cublas_error: f64,
    routed_error: f64,
}

/// `lhs @ rhs` as the decorator runs it: `RoutedMatmul::matmul`, which this runtime
/// routes to cuBLAS on its own stream.
fn routed(lhs: &Tensor<CudaCube, 2>, rhs: &Tensor<CudaCube, 2>) -> Tensor<CudaCube, 2> {
    let product = <CudaCube as RoutedMatmul>::matmul(
        lhs.clone().into_primitive().tensor(),
        rhs.clone().into_primitive().tensor(),
    );
    Tensor::from_primitive(TensorPrimitive::Float(product))
}

fn measure(shape: (usize, usize, usize, &'static str), blas: &Cublas) -> Row {
    let (m, k, n, _) = shape;
    let mut rng = StdRng::seed_from_u64((m * 31 + k * 7 + n) as u64);
    let a: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let b: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let want = reference(&a, &b, m, k, n);

    let device = CudaGraphDevice::new(0);
    let lhs = Tensor::<CudaCube, 2>::from_data(TensorData::new(a.clone(), [m, k]), &device);
    let rhs = Tensor::<CudaCube, 2>::from_data(TensorData::new(b.clone(), [k, n]), &device);
    let cube_out = lhs.clone().matmul(rhs.clone());
    let cube_got = cube_out.into_data().to_vec::<f32>().expect("f32 data");
    let cube_us = time_us(
        || drop(lhs.clone().matmul(rhs.clone())),
        || CudaCube::sync(&device).expect("sync"),
    );

    let routed_got = routed(&lhs, &rhs)
        .into_data()
        .to_vec::<f32>()
        .expect("f32 data");
    let routed_us = time_us(
        || drop(routed(&lhs, &rhs)),
        || CudaCube::sync(&device).expect("sync"),
    );

    let a_dev = blas.stream.clone_htod(&a).expect("upload");
    let b_dev = blas.stream.clone_htod(&b).expect("upload");
    let mut c_dev = blas.stream.alloc_zeros::<f32>(m * n).expect("alloc");
    blas.gemm(&a_dev, &b_dev, &mut c_dev, [m, k, n]);
    let cublas_got = blas.stream.clone_dtoh(&c_dev).expect("download");
    let cublas_us = time_us(
        || blas.gemm(&a_dev, &b_dev, &mut c_dev, [m, k, n]),
        || blas.stream.synchronize().expect("sync"),
    );

    let cublas_error = relative_error(&cublas_got, &want);
    // fp32 sgemm must match the f64 product to well within this; more means the harness
    // multiplies the wrong operands (a transposition), and no row of the table means
    // anything.
    assert!(
        cublas_error < 1e-4,
        "[{m},{k}]@[{k},{n}]: cuBLAS differs from the reference by {cublas_error:e}"
    );
    let routed_error = relative_error(&routed_got, &want);
    assert!(
        routed_error < 1e-4,
        "[{m},{k}]@[{k},{n}]: the runtime's cuBLAS matmul differs from the reference by \
         {routed_error:e}"
    );
    Row {
        shape,
        cube_us,
        cublas_us,
        routed_us,
        cube_error: relative_error(&cube_got, &want),
        cublas_error,
        routed_error,
    }
}

fn main() {
    let blas = Cublas::new();
    let rows: Vec<Row> = SHAPES.iter().map(|&shape| measure(shape, &blas)).collect();
    println!(
        "| [m,k]@[k,n] | what | CubeCL µs | cuBLAS µs | runtime's cuBLAS µs | CubeCL / runtime's | CubeCL error | cuBLAS error | runtime's error |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let (m, k, n, what) = row.shape;
        println!(
            "| [{m},{k}]@[{k},{n}] | {what} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1e} | {:.1e} | {:.1e} |",
            row.cube_us,
            row.cublas_us,
            row.routed_us,
            row.cube_us / row.routed_us,
            row.cube_error,
            row.cublas_error,
            row.routed_error
        );
    }
    println!(
        "\nTimes: median of {ROUNDS} rounds of {ITERS} GEMMs queued back to back and one sync, \
         per GEMM. Errors: largest |result - f64 reference| over the reference's largest \
         magnitude; fp32 accumulation over k gives about 1e-7 * sqrt(k), TF32 about 1e-3."
    );
}
