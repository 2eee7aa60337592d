//! Matmuls through cuBLAS (issue 12, part 2): every layout a step produces (transposed
//! operands, batches, broadcast weights, views at an offset) gives the fp32 product on
//! the decorated stack, and agrees with CubeCL's matmul on the plain stack within its
//! TF32 rounding; so do matmul's and `linear`'s gradients.
//!
//! fp32 accumulation over k = 256 stays near 1e-6 of the f64 product; CubeCL's TF32
//! kernels reach 3e-4 to 7e-4 there (bench/results/lstm-2026-12-01.md). A bound of 2e-5
//! therefore fails when a matmul is not routed to cuBLAS (`BURN_GRAPH_CAPTURE_CUBLAS=off`).

use burn::prelude::*;
use burn::tensor::{Distribution, TensorData, TensorPrimitive};
use burn_graph_capture::GraphCapture;

use crate::common::{Stack, case};

/// Bound on fp32 GEMM error relative to the largest reference magnitude.
const FP32: f64 = 2e-5;
/// Bound on CubeCL's TF32 matmul against cuBLAS.
const TF32: f64 = 5e-3;

/// `a @ b` in f64 over row-major `[batch, m, k]` and `[batch or 1, k, n]`.
fn reference(a: &[f32], b: &[f32], [batch, m, k, n]: [usize; 4], b_batched: bool) -> Vec<f64> {
    let mut c = vec![0.0; batch * m * n];
    for t in 0..batch {
        let bt = if b_batched { t } else { 0 };
        for i in 0..m {
            for j in 0..n {
                c[(t * m + i) * n + j] = (0..k)
                    .map(|p| f64::from(a[(t * m + i) * k + p]) * f64::from(b[(bt * k + p) * n + j]))
                    .sum();
            }
        }
    }
    c
}

fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(1e-30f64, |s, w| s.max(w.abs()));
    got.iter()
        .zip(want)
        .fold(0.0f64, |e, (g, w)| e.max((f64::from(*g) - w).abs()))
        / scale
}

fn values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().to_vec::<f32>().expect("f32 values")
}

type Decorated<G> = GraphCapture<G>;

/// The same tensor on the inner stack (the decorator keeps `G`'s primitives).
fn plain<G: Stack>(tensor: Tensor<Decorated<G>, 3>) -> Tensor<G, 3> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor.into_primitive().tensor()))
}

/// A `[batch, rows, cols]` operand, laid out as `layout` says.
fn operand<G: Stack>(layout: &str, [batch, rows, cols]: [usize; 3]) -> Tensor<Decorated<G>, 3> {
    let device = crate::common::device();
    let random = |shape: [usize; 3]| {
        Tensor::<Decorated<G>, 3>::random(shape, Distribution::Uniform(-1.0, 1.0), &device)
    };
    match layout {
        "packed" => random([batch, rows, cols]),
        // Values stored transposed, multiplied as a transposed view.
        "transposed" => random([batch, cols, rows]).swap_dims(1, 2),
        // A view at an offset into a larger buffer: its rows step past its width.
        "sliced" => {
            random([batch, 2 * rows, 2 * cols]).slice([0..batch, rows..2 * rows, cols..2 * cols])
        }
        other => panic!("unknown layout {other}"),
    }
}

/// `a @ b` for `a: [batch, m, k]` laid out as `layouts.0` and `b: [b_batch, k, n]` as
/// `layouts.1`, on the decorated stack (routed) and the plain one (CubeCL).
fn check<G: Stack>(layouts: (&str, &str), [batch, m, k, n]: [usize; 4], b_batched: bool) {
    let b_batch = if b_batched { batch } else { 1 };
    let a = operand::<G>(layouts.0, [batch, m, k]);
    let b = operand::<G>(layouts.1, [b_batch, k, n]);
    let want = reference(
        &values(a.clone()),
        &values(b.clone()),
        [batch, m, k, n],
        b_batched,
    );
    let routed = values(a.clone().matmul(b.clone()));
    let cubecl = values(plain(a).matmul(plain(b)));

    let name = case::<G>(&format!(
        "{layouts:?} [{batch},{m},{k}]@[{b_batch},{k},{n}]"
    ));
    let routed_error = relative_error(&routed, &want);
    let cubecl_error = relative_error(&cubecl, &want);
    let cubecl_f64: Vec<f64> = cubecl.iter().map(|&v| f64::from(v)).collect();
    let between = relative_error(&routed, &cubecl_f64);
    eprintln!(
        "{name}: cuBLAS {routed_error:.1e}, CubeCL {cubecl_error:.1e}, between {between:.1e}"
    );
    assert!(
        routed_error < FP32,
        "{name}: routed matmul off the fp32 product by {routed_error:e}"
    );
    assert!(
        between < TF32,
        "{name}: cuBLAS and CubeCL differ by {between:e}"
    );
}

pub fn routed_matmuls_give_the_fp32_product<G: Stack>() {
    for lhs in ["packed", "transposed", "sliced"] {
        for rhs in ["packed", "transposed", "sliced"] {
            check::<G>((lhs, rhs), [1, 32, 256, 1024], true);
        }
    }
    // Batched, and a weight broadcast over the batch (`Linear` on a sequence).
    check::<G>(("packed", "packed"), [3, 16, 256, 48], true);
    check::<G>(("packed", "packed"), [4, 16, 256, 40], false);
    check::<G>(("sliced", "transposed"), [4, 33, 256, 7], false);
}

pub fn routed_matmul_gradients_give_the_fp32_product<G: Stack>() {
    use burn::backend::Autodiff;
    type A<G> = Autodiff<GraphCapture<G>>;
    let device = crate::common::device();
    let (m, k, n) = (32, 256, 128);
    let a = Tensor::<G, 2>::random([m, k], Distribution::Uniform(-1.0, 1.0), &device);
    let b = Tensor::<G, 2>::random([k, n], Distribution::Uniform(-1.0, 1.0), &device);
    let (a_values, b_values) = (values(a.clone()), values(b.clone()));
    let a_ad = Tensor::<A<G>, 2>::from_data(TensorData::new(a_values.clone(), [m, k]), &device)
        .require_grad();
    let b_ad = Tensor::<A<G>, 2>::from_data(TensorData::new(b_values.clone(), [k, n]), &device)
        .require_grad();
    let grads = a_ad.clone().matmul(b_ad.clone()).sum().backward();
    // d(sum(AB))/dA = 1 Bᵀ (row sums of B), d/dB = Aᵀ 1 (column sums of A); the ones
    // come from the sum's backward, a broadcast that one GEMM cannot read as it lies.
    let da = values(a_ad.grad(&grads).expect("grad of a"));
    let db = values(b_ad.grad(&grads).expect("grad of b"));
    let row_sums: Vec<f64> = (0..k)
        .map(|p| (0..n).map(|j| f64::from(b_values[p * n + j])).sum())
        .collect();
    let col_sums: Vec<f64> = (0..k)
        .map(|p| (0..m).map(|i| f64::from(a_values[i * k + p])).sum())
        .collect();
    let want_da: Vec<f64> = (0..m * k).map(|idx| row_sums[idx % k]).collect();
    let want_db: Vec<f64> = (0..k * n).map(|idx| col_sums[idx / n]).collect();
    let (ea, eb) = (relative_error(&da, &want_da), relative_error(&db, &want_db));
    eprintln!(
        "{}: gradient errors {ea:.1e}, {eb:.1e}",
        case::<G>("matmul backward")
    );
    assert!(
        ea < FP32 && eb < FP32,
        "matmul gradients off the fp32 values: {ea:e}, {eb:e}"
    );
}

/// `nn::Linear`'s op (`linear`, rank 3 as on a sequence) and its gradients.
pub fn routed_linear_gives_the_fp32_product<G: Stack>() {
    use burn::backend::Autodiff;
    type A<G> = Autodiff<GraphCapture<G>>;
    let device = crate::common::device();
    let (batch, rows, k, n) = (4, 16, 256, 64);
    let x = Tensor::<G, 3>::random([batch, rows, k], Distribution::Uniform(-1.0, 1.0), &device);
    let w = Tensor::<G, 2>::random([k, n], Distribution::Uniform(-1.0, 1.0), &device);
    let b = Tensor::<G, 1>::random([n], Distribution::Uniform(-1.0, 1.0), &device);
    let (xv, wv, bv) = (values(x), values(w), values(b));
    let x = Tensor::<A<G>, 3>::from_data(TensorData::new(xv.clone(), [batch, rows, k]), &device)
        .require_grad();
    let w =
        Tensor::<A<G>, 2>::from_data(TensorData::new(wv.clone(), [k, n]), &device).require_grad();
    let b = Tensor::<A<G>, 1>::from_data(TensorData::new(bv.clone(), [n]), &device);
    let out = burn::tensor::module::linear(x.clone(), w.clone(), Some(b));
    let grads = out.clone().sum().backward();
    let mut want = reference(&xv, &wv, [batch, rows, k, n], false);
    for (i, value) in want.iter_mut().enumerate() {
        *value += f64::from(bv[i % n]);
    }
    let dx = values(x.grad(&grads).expect("grad of x"));
    let dw = values(w.grad(&grads).expect("grad of w"));
    let w_rows: Vec<f64> = (0..k)
        .map(|p| (0..n).map(|j| f64::from(wv[p * n + j])).sum())
        .collect();
    let x_cols: Vec<f64> = (0..k)
        .map(|p| (0..batch * rows).map(|r| f64::from(xv[r * k + p])).sum())
        .collect();
    let want_dx: Vec<f64> = (0..batch * rows * k).map(|i| w_rows[i % k]).collect();
    let want_dw: Vec<f64> = (0..k * n).map(|i| x_cols[i / n]).collect();
    let errors = [
        relative_error(&values(out), &want),
        relative_error(&dx, &want_dx),
        relative_error(&dw, &want_dw),
    ];
    eprintln!(
        "{}: linear, d/dx, d/dw errors {errors:?}",
        case::<G>("linear")
    );
    assert!(
        errors.iter().all(|&e| e < FP32),
        "linear off the fp32 values: {errors:?}"
    );
}

stack_tests!(
    routed_matmuls_give_the_fp32_product,
    routed_matmul_gradients_give_the_fp32_product,
    routed_linear_gives_the_fp32_product
);
