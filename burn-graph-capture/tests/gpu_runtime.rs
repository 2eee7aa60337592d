//! GPU checks of `CudaGraphRuntime` against stock burn-cuda (issue 3).
//!
//! Every GPU test is `#[ignore]`d: it never passes vacuously on a machine without a GPU.
//! On the GPU machine run them with `--ignored`; they fail if the GPU or driver is absent.
//! Names carry a `tN_` prefix so libtest (alphabetical) runs the quick checks first.
#![cfg(feature = "cuda")]

mod gpu_common;

use burn::tensor::{
    Bool, Distribution, Int, Tensor, TensorData,
    activation::{gelu, relu, sigmoid, softmax, tanh},
    backend::Backend,
};
use burn_graph_capture::runtime::{CudaGraphRuntime, InitError};
use gpu_common::child::{self, Children, Output, as_child, output, values, write_outputs};
use gpu_common::*;

/// Runs on any machine: without libcuda the client is a typed error naming it.
#[test]
fn missing_driver_is_a_typed_error() {
    // SAFETY: only tries to dlopen libcuda.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        return; // GPU machine: the ignored tests cover the other branch.
    }
    let Err(err) = CudaGraphRuntime::try_client(&our_device()) else {
        panic!("client started without libcuda");
    };
    assert_eq!(err, InitError::DriverLibraryMissing);
    assert!(err.to_string().contains("libcuda"), "{err}");
}

/// Runs on any machine: seeding one runtime's autotune cache from the other's copies the
/// other's results under the first one's tuner id, and never lets the first one's own
/// earlier results overwrite them.
#[test]
fn seeding_copies_stock_choices_under_our_id() {
    let root = std::env::temp_dir().join(format!("gpu-seed-test-{}", std::process::id()));
    let (from, to) = (root.join("from"), root.join("to"));
    let version = from.join("autotune").join("0.10.0");
    for (dir, body) in [("device-0-0-cuda", "stock"), ("device-7-0-ours", "ours")] {
        std::fs::create_dir_all(version.join(dir)).unwrap();
        std::fs::write(version.join(dir).join("matmul.json.log"), body).unwrap();
    }
    let rename = Some(("device-0-0-cuda", "device-7-0-ours"));
    let copied = child::copy_renaming(&from, &to, rename);
    let seeded = to.join("autotune/0.10.0/device-7-0-ours/matmul.json.log");
    let body = std::fs::read_to_string(&seeded);
    let stale = to.join("autotune/0.10.0/device-0-0-cuda").exists();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(copied, 1);
    assert_eq!(body.unwrap(), "stock");
    assert!(!stale, "stock's directory copied under its own name");
}

/// Runs on any machine: publishing a child's autotune cache replaces each shared file
/// whole with the child's (the file its stock twin is seeded from), adds the child's
/// new ones, keeps the shared ones it lacks, and leaves no temporary file behind; a
/// copy of the shared cache leaves out a file another test is publishing.
#[test]
fn publishing_replaces_shared_files_whole() {
    let root = std::env::temp_dir().join(format!("gpu-publish-test-{}", std::process::id()));
    let (child_dir, shared) = (
        root.join("child/0.10.0/ours"),
        root.join("shared/0.10.0/ours"),
    );
    std::fs::create_dir_all(&child_dir).unwrap();
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(
        shared.join("matmul.json.log"),
        "other test's longer choices",
    )
    .unwrap();
    std::fs::write(shared.join("reduce.json.log"), "kept").unwrap();
    std::fs::write(child_dir.join("matmul.json.log"), "child's").unwrap();
    std::fs::write(child_dir.join("conv.json.log"), "new").unwrap();
    child::copy_renaming(&root.join("child"), &root.join("shared"), None);
    std::fs::write(shared.join(".999-0.part"), "half of another test's file").unwrap();
    let copied = child::copy_renaming(&root.join("shared"), &root.join("copy"), None);
    std::fs::remove_file(shared.join(".999-0.part")).unwrap();
    let read = |name: &str| std::fs::read_to_string(shared.join(name)).unwrap_or_default();
    let (matmul, reduce, conv) = (
        read("matmul.json.log"),
        read("reduce.json.log"),
        read("conv.json.log"),
    );
    let mut names: Vec<_> = std::fs::read_dir(&shared)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(
        (matmul.as_str(), reduce.as_str(), conv.as_str()),
        ("child's", "kept", "new")
    );
    assert_eq!(
        names,
        ["conv.json.log", "matmul.json.log", "reduce.json.log"]
    );
    assert_eq!(copied, 3, "the copy took the file being published");
}

/// Runs on any machine: a child process of this test hands its outputs back bit for bit
/// (NaN included), which the parity tests rely on.
#[test]
fn child_outputs_round_trip() {
    let sent = [1.5f32, -0.0, f32::NAN, f32::MIN_POSITIVE];
    if let Some(stack) = as_child() {
        return write_outputs(&[output(stack, true, &sent)]);
    }
    let run = Children::new("child_outputs_round_trip").fresh("probe");
    assert_eq!(run.outputs.len(), 1);
    let (name, exact, bits) = &run.outputs[0];
    assert_eq!((name.as_str(), *exact), ("probe", true));
    let expected: Vec<u32> = sent.iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, &expected);
}

fn floats<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}
fn ints<B: Backend, const D: usize>(t: Tensor<B, D, Int>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}
fn bools<B: Backend, const D: usize>(t: Tensor<B, D, Bool>) -> Vec<f32> {
    floats(t.float())
}

fn tensor<B: Backend, const D: usize>(
    seed: u64,
    shape: [usize; D],
    dev: &B::Device,
) -> Tensor<B, D> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(host_values(seed, n), shape), dev)
}

fn int_tensor<B: Backend, const D: usize>(
    seed: u64,
    shape: [usize; D],
    dev: &B::Device,
) -> Tensor<B, D, Int> {
    let n = shape.iter().product();
    let values: Vec<i32> = host_values(seed, n)
        .into_iter()
        .map(|v| (v * 50.0) as i32)
        .collect();
    Tensor::from_data(TensorData::new(values, shape), dev)
}

/// The op suite: each entry is (name, output as f32, exact?).
fn op_suite<B: Backend>(dev: &B::Device) -> Vec<(&'static str, Vec<f32>, bool)> {
    let mut out = Vec::new();
    let a = tensor::<B, 2>(10, [37, 53], dev);
    let b = tensor::<B, 2>(11, [37, 53], dev);
    // Elementwise.
    out.push(("add", floats(a.clone() + b.clone()), false));
    out.push(("sub", floats(a.clone() - b.clone()), false));
    out.push(("mul", floats(a.clone() * b.clone()), false));
    out.push(("div", floats(a.clone() / (b.clone().abs() + 0.5)), false));
    out.push(("exp", floats(a.clone().exp()), false));
    out.push(("log", floats((a.clone().abs() + 1.0).log()), false));
    out.push(("sqrt", floats(a.clone().abs().sqrt()), false));
    out.push(("powf", floats(a.clone().abs().powf_scalar(1.7)), false));
    out.push(("neg_scalar", floats(-a.clone() * 3.0 + 1.5), false));
    out.push(("clamp", floats(a.clone().clamp(-0.3, 0.4)), false));
    // Broadcasting.
    let c = tensor::<B, 3>(12, [4, 1, 5], dev);
    let d = tensor::<B, 3>(13, [1, 3, 5], dev);
    out.push(("broadcast_add", floats(c.clone() + d.clone()), false));
    out.push(("broadcast_mul", floats(c * d), false));
    // Matmul, including sizes that are not multiples of 16.
    for (i, (m, k, n)) in [
        (17, 33, 19),
        (64, 64, 64),
        (1, 256, 1024),
        (129, 7, 65),
        (256, 512, 128),
    ]
    .into_iter()
    .enumerate()
    {
        let x = tensor::<B, 2>(20 + i as u64, [m, k], dev);
        let y = tensor::<B, 2>(30 + i as u64, [k, n], dev);
        out.push(("matmul", floats(x.matmul(y)), false));
    }
    let bx = tensor::<B, 3>(40, [3, 7, 129], dev);
    let by = tensor::<B, 3>(41, [3, 129, 5], dev);
    out.push(("matmul_batched", floats(bx.matmul(by)), false));
    let tx = tensor::<B, 2>(42, [48, 31], dev);
    let ty = tensor::<B, 2>(43, [48, 23], dev);
    out.push((
        "matmul_transposed",
        floats(tx.transpose().matmul(ty)),
        false,
    ));
    // Reductions.
    let r = tensor::<B, 3>(50, [6, 77, 45], dev);
    out.push(("sum", floats(r.clone().sum()), false));
    out.push(("mean", floats(r.clone().mean()), false));
    out.push(("max", floats(r.clone().max()), true));
    out.push(("sum_dim", floats(r.clone().sum_dim(1)), false));
    out.push(("mean_dim", floats(r.clone().mean_dim(2)), false));
    out.push(("max_dim", floats(r.clone().max_dim(0)), true));
    out.push(("min_dim", floats(r.clone().min_dim(1)), true));
    out.push(("argmax", ints(r.clone().argmax(2)), true));
    out.push(("argmin", ints(r.clone().argmin(1)), true));
    // Slicing.
    out.push((
        "slice",
        floats(r.clone().slice([1..4, 10..60, 3..40])),
        true,
    ));
    let patch = tensor::<B, 3>(51, [2, 5, 7], dev);
    out.push((
        "slice_assign",
        floats(r.clone().slice_assign([2..4, 20..25, 8..15], patch)),
        true,
    ));
    // Cat and stack.
    let p = tensor::<B, 2>(52, [5, 9], dev);
    let q = tensor::<B, 2>(53, [3, 9], dev);
    let s = tensor::<B, 2>(54, [5, 9], dev);
    out.push((
        "cat0",
        floats(Tensor::cat(vec![p.clone(), q.clone()], 0)),
        true,
    ));
    out.push((
        "cat1",
        floats(Tensor::cat(vec![p.clone(), s.clone()], 1)),
        true,
    ));
    out.push((
        "stack",
        floats(Tensor::stack::<3>(vec![p.clone(), s.clone()], 1)),
        true,
    ));
    // Activations.
    out.push(("relu", floats(relu(a.clone())), true));
    out.push(("sigmoid", floats(sigmoid(a.clone())), false));
    out.push(("tanh", floats(tanh(a.clone())), false));
    out.push(("gelu", floats(gelu(a.clone())), false));
    out.push(("softmax", floats(softmax(a.clone(), 1)), false));
    // Int ops.
    let ia = int_tensor::<B, 2>(60, [13, 29], dev);
    let ib = int_tensor::<B, 2>(61, [13, 29], dev);
    out.push(("int_add", ints(ia.clone() + ib.clone()), true));
    out.push(("int_mul", ints(ia.clone() * ib.clone()), true));
    out.push(("int_div", ints(ia.clone() / (ib.clone().abs() + 1)), true));
    out.push(("int_sum_dim", ints(ia.clone().sum_dim(1)), true));
    out.push(("int_to_float", floats(ia.clone().float() * 0.5), true));
    // Bool ops.
    let ga = a.clone().greater(b.clone());
    let gb = a.clone().lower_elem(0.1);
    out.push(("greater", bools(ga.clone()), true));
    out.push(("equal", bools(ia.clone().equal(ib.clone())), true));
    out.push(("bool_and", bools(ga.clone().bool_and(gb.clone())), true));
    out.push(("bool_or", bools(ga.clone().bool_or(gb.clone())), true));
    out.push(("bool_not", bools(ga.clone().bool_not()), true));
    out.push((
        "mask_where",
        floats(a.clone().mask_where(ga.clone(), b.clone())),
        true,
    ));
    out.push(("mask_fill", floats(a.clone().mask_fill(gb, 7.0)), true));
    out.push((
        "any_all",
        bools(Tensor::cat(
            vec![ga.clone().any().reshape([1]), ga.all().reshape([1])],
            0,
        )),
        true,
    ));
    out
}

/// Worst relative error over the suite (`"{err:e} ({op})"`, for the log: `sum` may
/// autotune to `shared_sum`, whose atomic adds sum in no fixed order, so it can differ
/// between two processes under the same choices), and the cases over their limit (exact
/// ones 0, the others 1e-5).
fn compare_suites(ours: &[Output], stock: &[Output]) -> (String, Vec<String>) {
    assert_eq!(ours.len(), stock.len(), "suites of different lengths");
    let mut failures = Vec::new();
    let mut worst = (0f64, "none");
    for (a, b) in ours.iter().zip(stock) {
        let (name, exact) = (&a.0, a.1);
        let err = rel_err(&values(a), &values(b));
        if err > worst.0 {
            worst = (err, name);
        }
        let limit = if exact { 0.0 } else { 1e-5 };
        if err > limit {
            failures.push(format!("{name}: rel err {err:e} > {limit:e}"));
        }
    }
    (format!("{:e} ({})", worst.0, worst.1), failures)
}

/// A child measuring the op suite on one stack.
fn op_suite_outputs(stack: &str) -> Vec<Output> {
    let suite = match stack {
        "ours" => op_suite::<Ours>(&our_device()),
        "ours-fused" => op_suite::<OursFused>(&our_device()),
        "stock" => op_suite::<Stock>(&stock_device()),
        "stock-fused" => op_suite::<StockFused>(&stock_device()),
        other => panic!("unknown stack {other}"),
    };
    suite
        .into_iter()
        .map(|(name, values, exact)| output(name, exact, &values))
        .collect()
}

/// Op parity of `ours` with `stock` under the same kernel choices: ours runs first in a
/// child process, then stock in another, its autotune cache seeded with ours' results
/// (see `gpu_common::child`: autotune's choice of f32 matmul kernel moves results by up
/// to 7.8e-4 even between two stock processes). Stock with its own choices runs too, for
/// the log only.
fn op_parity(test: &'static str, ours: &str, stock: &str) {
    if let Some(stack) = as_child() {
        return write_outputs(&op_suite_outputs(&stack));
    }
    let children = Children::new(test);
    let ours_run = children.ours(ours);
    let pinned = children.stock_with_choices_of(&ours_run, stock);
    let own = children.fresh(stock);
    let (own_worst, _) = compare_suites(&ours_run.outputs, &own.outputs);
    let (worst, failures) = compare_suites(&ours_run.outputs, &pinned.outputs);
    println!(
        "op parity {ours} vs {stock}: {} ops, worst rel err {worst} with the same kernel \
         choices (stock tuned {} keys afresh); {own_worst} against stock's own choices \
         (not asserted)",
        pinned.outputs.len(),
        pinned.choices.len()
    );
    assert!(
        failures.is_empty(),
        "op parity failures:\n{}",
        failures.join("\n")
    );
}

/// A child's add + matmul on one stack.
fn smoke_add_matmul(stack: &str) -> Vec<f32> {
    fn run<B: Backend>(dev: &B::Device) -> Vec<f32> {
        let a = tensor::<B, 2>(1, [33, 47], dev);
        let b = tensor::<B, 2>(2, [47, 21], dev);
        floats((a.clone() + a).matmul(b))
    }
    match stack {
        "ours" => run::<Ours>(&our_device()),
        "stock" => run::<Stock>(&stock_device()),
        other => panic!("unknown stack {other}"),
    }
}

/// The first check: the runtime starts, and add + matmul equal stock burn-cuda's under
/// the same kernel choice. Stock runs in a child seeded with ours' autotune results, as
/// in `op_parity`: with choices of its own, the two stacks may time different matmul
/// kernels fastest and one of them round to TF32 (H200, 2026-12-05: failed twice beside
/// other GPU work, where it had passed alone).
#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn t1_smoke_add_matmul_matches_burn_cuda() {
    const TEST: &str = "t1_smoke_add_matmul_matches_burn_cuda";
    if let Some(stack) = as_child() {
        return write_outputs(&[output(TEST, false, &smoke_add_matmul(&stack))]);
    }
    let client = CudaGraphRuntime::try_client(&our_device()).expect("GPU runtime starts");
    drop(client);
    let children = Children::new(TEST);
    let ours = children.ours("ours");
    let stock = children.stock_with_choices_of(&ours, "stock");
    let err = rel_err(&values(&ours.outputs[0]), &values(&stock.outputs[0]));
    println!("smoke: add+matmul rel err {err:e} under the same kernel choice");
    assert!(err <= 1e-5, "rel err {err}");
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn t2_random_and_sync_work() {
    let dev = our_device();
    let t = Tensor::<Ours, 2>::random([256, 256], Distribution::Uniform(0.0, 1.0), &dev);
    let mean: f32 = floats(t.mean())[0];
    assert!((mean - 0.5).abs() < 0.01, "uniform mean {mean}");
    Ours::sync(&dev).expect("sync succeeds");
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn t3_op_parity_plain() {
    op_parity("t3_op_parity_plain", "ours", "stock");
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn t4_op_parity_fused() {
    op_parity("t4_op_parity_fused", "ours-fused", "stock-fused");
}

/// Losses of `steps` Adam steps, ours (fused) against burn-cuda running ours' kernel
/// choices (as `op_parity`); relative error ≤ 1e-5 at every step.
fn lstm_parity(test: &'static str, config: (usize, usize, usize), steps: usize) {
    use burn::backend::Autodiff;
    if let Some(stack) = as_child() {
        let losses = match stack.as_str() {
            "ours-fused" => lstm_losses::<Autodiff<OursFused>>(&our_device(), config, steps),
            "stock-fused" => lstm_losses::<Autodiff<StockFused>>(&stock_device(), config, steps),
            other => panic!("unknown stack {other}"),
        };
        return write_outputs(&[output("losses", false, &losses)]);
    }
    let children = Children::new(test);
    let ours_run = children.ours("ours-fused");
    let pinned = children.stock_with_choices_of(&ours_run, "stock-fused");
    let ours = values(&ours_run.outputs[0]);
    let stock = values(&pinned.outputs[0]);
    assert_eq!(ours.len(), steps, "ours measured {} losses", ours.len());
    let worst = ours
        .iter()
        .zip(&stock)
        .map(|(a, b)| ((a - b) / b).abs() as f64)
        .fold(0f64, f64::max);
    println!(
        "lstm {config:?}: loss[0] {} / {}, loss[last] {} / {}, worst step rel err {worst:e} \
         (stock with ours' kernel choices; it tuned {} keys afresh)",
        ours[0],
        stock[0],
        ours[steps - 1],
        stock[steps - 1],
        pinned.choices.len()
    );
    assert!(worst <= 1e-5, "ours {ours:?}\nstock {stock:?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn t6_lstm_parity_32_64_256() {
    lstm_parity("t6_lstm_parity_32_64_256", (32, 64, 256), 50);
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn t7_lstm_parity_8_64_128() {
    lstm_parity("t7_lstm_parity_8_64_128", (8, 64, 128), 50);
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn t8_lstm_parity_128_32_512() {
    lstm_parity("t8_lstm_parity_128_32_512", (128, 32, 512), 50);
}

/// Small enough for compute-sanitizer: a few steps of a tiny LSTM.
#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn t5_lstm_parity_small() {
    lstm_parity("t5_lstm_parity_small", (4, 8, 16), 5);
}
