//! Matmul and reduction precision of this runtime and of stock burn-cuda, each against an
//! f64 host reference (issue 3: op parity found matmul 7.8e-4 and sum 1.007e-5 relative
//! off burn-cuda, limit 1e-5).
//!
//! Autotune picks kernels by timing, and cubek-matmul's accelerated kernels stage f32
//! operands as TF32, so two stacks, or two processes of one stack, may run kernels of
//! different precision. Each stack therefore runs in a fresh child process of this binary
//! with an empty autotune cache (`gpu_common::child`), and stock runs twice to show how
//! far stock is from itself. The log lists the kernel autotune chose for each op.
//!
//! `#[ignore]`d like every GPU test: run with `--ignored` on the GPU machine, where it fails
//! if the GPU is missing (the children cannot start a client).
#![cfg(feature = "cuda")]

mod gpu_common;

use burn::tensor::{Tensor, TensorData, backend::Backend};
use gpu_common::child::{Children, as_child, output, values, write_outputs};
use gpu_common::*;

const TEST_NAME: &str = "t1_precision_against_f64";

/// Matmul shapes (m, k, n): non-multiples of 16, op-parity shapes, LSTM gate shapes.
const MATMULS: [(usize, usize, usize); 9] = [
    (33, 65, 17),
    (17, 33, 19),
    (129, 7, 65),
    (64, 256, 256),
    (128, 512, 512),
    (256, 512, 128),
    (1, 256, 1024),
    (32, 256, 1024),
    (128, 512, 2048),
];
/// Shapes reduced by `sum`/`mean` (the first is op parity's).
const REDUCED: [[usize; 3]; 2] = [[6, 77, 45], [4, 256, 1024]];

/// The stacks, in child order; stock ones run twice.
const STACKS: [&str; 6] = [
    "ours",
    "stock",
    "stock",
    "ours-fused",
    "stock-fused",
    "stock-fused",
];

fn matmul_inputs(i: usize, (m, k, n): (usize, usize, usize)) -> (Vec<f32>, Vec<f32>) {
    (
        host_values(100 + i as u64, m * k),
        host_values(200 + i as u64, k * n),
    )
}

fn reduced_input(i: usize, shape: [usize; 3]) -> Vec<f32> {
    host_values(300 + i as u64, shape.iter().product())
}

/// Every case's f32 output on backend `B`, in `case_names` order.
fn run_cases<B: Backend>(dev: &B::Device) -> Vec<Vec<f32>> {
    let read = |t: Tensor<B, 2>| t.into_data().to_vec::<f32>().expect("f32 output");
    let mut out = Vec::new();
    for (i, (m, k, n)) in MATMULS.into_iter().enumerate() {
        let (a, b) = matmul_inputs(i, (m, k, n));
        let a = Tensor::<B, 2>::from_data(TensorData::new(a, [m, k]), dev);
        let b = Tensor::<B, 2>::from_data(TensorData::new(b, [k, n]), dev);
        out.push(read(a.matmul(b)));
    }
    for (i, shape) in REDUCED.into_iter().enumerate() {
        let x = Tensor::<B, 3>::from_data(TensorData::new(reduced_input(i, shape), shape), dev);
        out.push(read(x.clone().sum().reshape([1, 1])));
        out.push(read(x.clone().mean().reshape([1, 1])));
        out.push(read(x.sum_dim(1).reshape([shape[0], shape[2]])));
    }
    out
}

/// The same cases in f64 on the host, from the same f32 inputs.
fn reference() -> Vec<Vec<f64>> {
    let mut out = Vec::new();
    for (i, (m, k, n)) in MATMULS.into_iter().enumerate() {
        let (a, b) = matmul_inputs(i, (m, k, n));
        let mut c = vec![0f64; m * n];
        for r in 0..m {
            for p in 0..k {
                let x = a[r * k + p] as f64;
                for (q, cq) in c[r * n..(r + 1) * n].iter_mut().enumerate() {
                    *cq += x * b[p * n + q] as f64;
                }
            }
        }
        out.push(c);
    }
    for (i, shape) in REDUCED.into_iter().enumerate() {
        let x = reduced_input(i, shape);
        let total: f64 = x.iter().map(|&v| v as f64).sum();
        out.push(vec![total]);
        out.push(vec![total / x.len() as f64]);
        let [d0, d1, d2] = shape;
        let mut dim = vec![0f64; d0 * d2];
        for a in 0..d0 {
            for b in 0..d1 {
                for c in 0..d2 {
                    dim[a * d2 + c] += x[(a * d1 + b) * d2 + c] as f64;
                }
            }
        }
        out.push(dim);
    }
    out
}

/// ‖a − r‖ / ‖r‖ in f64; infinite on length mismatch or a non-finite output.
fn rel_err_f64(a: &[f32], r: &[f64]) -> f64 {
    if a.len() != r.len() || a.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let diff: f64 = a.iter().zip(r).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let norm: f64 = r.iter().map(|y| y * y).sum();
    diff.sqrt() / norm.sqrt().max(1e-30)
}

/// Child: measures one stack and hands its outputs back.
fn child(stack: &str) {
    let cases = match stack {
        "ours" => run_cases::<Ours>(&our_device()),
        "ours-fused" => run_cases::<OursFused>(&our_device()),
        "stock" => run_cases::<Stock>(&stock_device()),
        "stock-fused" => run_cases::<StockFused>(&stock_device()),
        other => panic!("unknown stack {other}"),
    };
    let names = case_names();
    let outputs: Vec<_> = names
        .iter()
        .zip(&cases)
        .map(|(name, values)| output(name.clone(), false, values))
        .collect();
    write_outputs(&outputs);
}

#[test]
#[ignore = "needs an NVIDIA GPU; run with --ignored on the GPU machine"]
fn t1_precision_against_f64() {
    if let Some(stack) = as_child() {
        return child(&stack);
    }
    let children = Children::new(TEST_NAME);
    let runs: Vec<Vec<Vec<f32>>> = STACKS
        .iter()
        .enumerate()
        .map(|(i, stack)| {
            let run = children.fresh(stack);
            for choice in &run.choices {
                println!("  [{i} {stack}] {choice}");
            }
            run.outputs.iter().map(values).collect()
        })
        .collect();
    let names = case_names();
    let reference = reference();
    for run in &runs {
        assert_eq!(run.len(), reference.len(), "a child measured too few cases");
    }

    println!(
        "| case | {} | stock#1 vs stock#2 | ours vs stock#1 | fused: stock#1 vs #2 | fused: ours vs stock#1 |",
        STACKS.map(|s| format!("{s} vs f64")).join(" | ")
    );
    println!("|{}", "---|".repeat(STACKS.len() + 5));
    let mut failures = Vec::new();
    for (c, name) in names.iter().enumerate() {
        let errs: Vec<f64> = runs
            .iter()
            .map(|r| rel_err_f64(&r[c], &reference[c]))
            .collect();
        let pair = |a: usize, b: usize| rel_err(&runs[a][c], &runs[b][c]);
        println!(
            "| {name} | {} | {:.2e} | {:.2e} | {:.2e} | {:.2e} |",
            errs.iter()
                .map(|e| format!("{e:.2e}"))
                .collect::<Vec<_>>()
                .join(" | "),
            pair(1, 2),
            pair(0, 1),
            pair(4, 5),
            pair(3, 4)
        );
        failures.extend(precision_failures(name, &errs));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Where this runtime's stacks are less precise than stock on one case, given each
/// stack's error against f64 in `STACKS` order.
///
/// Ours must be within twice the worst error of any stock run, in either stack, or within
/// the 1e-5 of exact (f32 accumulation order alone moves a 1M-element sum by
/// ~3e-6). Every stock run counts, not only the same stack's two: autotune picks kernels
/// by timing, and the candidates round TF32 differently (H200, 2026-12-05, 256x512x128:
/// 2.6e-4 or 6.9e-4 against f64), so which one a run gets depends on what else shares the
/// GPU, and two stock runs of one stack can both miss a kernel that ours then picks.
fn precision_failures(case: &str, errs: &[f64]) -> Vec<String> {
    let stock_worst = STACKS
        .iter()
        .zip(errs)
        .filter(|(stack, _)| stack.starts_with("stock"))
        .map(|(_, err)| *err)
        .fold(0.0, f64::max);
    let bound = (2.0 * stock_worst).max(1e-5);
    STACKS
        .iter()
        .zip(errs)
        .filter(|(stack, err)| stack.starts_with("ours") && **err > bound)
        .map(|(stack, err)| format!("{case}: {stack} {err:.2e} > bound {bound:.2e} from stock"))
        .collect()
}

/// Runs on any machine: the bound takes stock's worst run of either stack.
#[test]
fn bound_is_stocks_worst_run_of_either_stack() {
    // H200, 2026-12-05, matmul 256x512x128: ours got the 6.9e-4 kernel, which only one
    // stock-fused run got.
    let seen = [6.86e-4, 2.60e-4, 2.60e-4, 2.60e-4, 6.86e-4, 2.60e-4];
    assert!(precision_failures("seen", &seen).is_empty());
    // Ours three times worse than any stock run fails, on either stack.
    let worse = [2.1e-3, 2.6e-4, 6.9e-4, 2.6e-4, 2.6e-4, 2.6e-4];
    assert_eq!(precision_failures("worse", &worse).len(), 1);
    let worse_fused = [2.6e-4, 2.6e-4, 2.6e-4, 2.1e-3, 6.9e-4, 2.6e-4];
    let failures = precision_failures("worse_fused", &worse_fused);
    assert_eq!(failures.len(), 1);
    assert!(failures[0].contains("ours-fused"), "{failures:?}");
    // Exact stock: ours may still be 1e-5 off (summation order), not more.
    assert!(precision_failures("floor", &[9e-6, 0.0, 0.0, 9e-6, 0.0, 0.0]).is_empty());
    assert_eq!(
        precision_failures("floor", &[2e-5, 0.0, 0.0, 0.0, 0.0, 0.0]).len(),
        1
    );
}

/// Case names, in the order of `run_cases` and `reference`.
fn case_names() -> Vec<String> {
    let mut names: Vec<String> = MATMULS
        .iter()
        .map(|(m, k, n)| format!("matmul {m}x{k}x{n}"))
        .collect();
    for shape in REDUCED {
        let tag = format!("{}x{}x{}", shape[0], shape[1], shape[2]);
        for op in ["sum", "mean", "sum_dim1"] {
            names.push(format!("{op} {tag}"));
        }
    }
    names
}
