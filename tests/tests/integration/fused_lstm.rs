//! `FusedLstm` against Burn's `nn::Lstm` on the CPU: same weights, same function, same
//! gradients (1e-5 relative), conversions both ways, typed refusals, fewer ops per step.

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::nn::{Lstm, LstmConfig};
use burn::tensor::{Distribution, Tensor, backend::Backend};
use burn_graph_capture::nn::{FusedLstm, FusedLstmConfig, LstmConversionError};
use burn_graph_capture::{CaptureSession, GraphCapture};
use lstm_example::train::{load_bytes, parameter_values, to_bytes};

use crate::common::fused_lstm_parity::{
    BASE, Case, Tolerance, compare, compare_within, reference_layers, values,
};

type A = Autodiff<Flex>;

#[test]
fn matches_nn_lstm_outputs_states_and_gradients() {
    let _rng = crate::common::rng::shared();
    compare::<A>(BASE);
}

#[test]
fn matches_with_a_single_time_step() {
    let _rng = crate::common::rng::shared();
    compare::<A>(Case { time: 1, ..BASE });
}

#[test]
fn matches_with_a_hidden_size_that_is_not_a_multiple_of_32() {
    let _rng = crate::common::rng::shared();
    compare::<A>(Case {
        hidden: 33,
        time: 3,
        ..BASE
    });
}

#[test]
fn matches_without_bias() {
    let _rng = crate::common::rng::shared();
    compare::<A>(Case {
        bias: false,
        ..BASE
    });
}

#[test]
fn matches_two_stacked_layers() {
    let _rng = crate::common::rng::shared();
    compare::<A>(Case { layers: 2, ..BASE });
}

/// Weight gradients summed over 200 rows and steps may cancel to small values: each within
/// 1e-5 of its tensor's largest.
#[test]
fn matches_a_larger_batch_within_its_largest_values() {
    let _rng = crate::common::rng::shared();
    let case = Case {
        batch: 40,
        hidden: 100,
        time: 5,
        ..BASE
    };
    compare_within::<A>(case, Tolerance::OfLargest(1e-5));
}

#[test]
fn time_major_layout_is_the_transpose() {
    let _rng = crate::common::rng::shared();
    let fused = FusedLstmConfig::new(4, 8, true).init::<Flex>(&Default::default());
    let time_major = FusedLstm {
        batch_first: false,
        ..fused.clone()
    };
    let x = Tensor::<Flex, 3>::random([2, 5, 4], Distribution::Default, &Default::default());
    let (a, _) = fused.forward(x.clone(), None);
    let (b, _) = time_major.forward(x.swap_dims(0, 1), None);
    assert_eq!(values(a), values(b.swap_dims(0, 1)));
}

#[test]
fn converts_to_nn_lstm_and_back_exactly() {
    let _rng = crate::common::rng::shared();
    let reference = reference_layers::<A>(Case { layers: 2, ..BASE });
    let fused = FusedLstm::from_lstms(&reference).unwrap();
    let back = fused.to_lstms();
    assert_eq!(back.len(), 2);
    for (original, converted) in reference.iter().zip(&back) {
        assert_eq!(parameter_values(original), parameter_values(converted));
    }
    let records = fused.to_lstm_records();
    let config = LstmConfig::new(4, 8, true);
    let reloaded = FusedLstm::<A>::from_lstm_record(
        &config,
        records.into_iter().next().unwrap(),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(
        parameter_values(&reloaded.layers[0]),
        parameter_values(&fused.layers[0])
    );
}

#[test]
fn unsupported_options_and_bad_stacks_are_refused_by_name() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let reversed = LstmConfig::new(4, 8, true)
        .with_reverse(true)
        .init::<Flex>(&device);
    assert_eq!(
        FusedLstm::from_lstm(&reversed).unwrap_err(),
        LstmConversionError::Unsupported("reverse")
    );
    let clipped = LstmConfig::new(4, 8, true)
        .with_clip(Some(1.0))
        .init::<Flex>(&device);
    assert_eq!(
        FusedLstm::from_lstm(&clipped).unwrap_err(),
        LstmConversionError::Unsupported("clip")
    );
    let a = LstmConfig::new(4, 8, true).init::<Flex>(&device);
    let b = LstmConfig::new(5, 8, true).init::<Flex>(&device);
    assert!(matches!(
        FusedLstm::from_lstms(&[a, b]).unwrap_err(),
        LstmConversionError::Stacking { layer: 1, .. }
    ));
    assert_eq!(
        FusedLstm::<Flex>::from_lstms(&[]).unwrap_err(),
        LstmConversionError::NoLayers
    );
}

const TIME: usize = 16;

/// The ops of one forward and backward pass, as the decorator records them.
fn ops_per_step<M: AutodiffModule<Autodiff<GraphCapture<Flex>>>>(
    forward: impl Fn(
        &M,
        Tensor<Autodiff<GraphCapture<Flex>>, 3>,
    ) -> Tensor<Autodiff<GraphCapture<Flex>>, 3>,
    model: &M,
) -> Vec<&'static str> {
    let x = Tensor::random([4, TIME, 8], Distribution::Default, &Default::default()).require_grad();
    let ((), recording) = CaptureSession::record(|| {
        let _grads = forward(model, x).sum().backward();
    });
    recording.signature.ops().iter().map(|op| op.op).collect()
}

fn count(ops: &[&str], wanted: impl Fn(&str) -> bool) -> usize {
    ops.iter().filter(|op| wanted(op)).count()
}

/// The batched form: the recurrence is one op each way (its per-step GEMMs and cell
/// kernels are the inner backend's), beside the input GEMM and its two gradients, once
/// per sequence. `nn::Lstm` runs eight GEMMs per step forward and differentiates each.
#[test]
fn the_recurrence_is_one_op_each_way_and_three_gemms_per_layer() {
    let _rng = crate::common::rng::shared();
    type G = Autodiff<GraphCapture<Flex>>;
    let device = Default::default();
    let config = LstmConfig::new(8, 16, true);
    let bytes = to_bytes(config.init::<Flex>(&device));
    let reference: Lstm<G> = load_bytes(config.init::<G>(&device), bytes, &device);
    let fused = FusedLstm::from_lstm(&reference).unwrap();
    let stock = ops_per_step(|m: &Lstm<G>, x| m.forward(x, None).0, &reference);
    let ours = ops_per_step(|m: &FusedLstm<G>, x| m.forward(x, None).0, &fused);
    let matmuls = |ops: &[&str]| count(ops, |op| op.contains("matmul") || op.contains("linear"));
    println!(
        "ops per forward+backward at b4/t{TIME}/h16: nn::Lstm {} ({} matmuls), FusedLstm {} ({} matmuls)",
        stock.len(),
        matmuls(&stock),
        ours.len(),
        matmuls(&ours)
    );
    assert_eq!(count(&ours, |op| op == "lstm_forward"), 1, "{ours:?}");
    assert_eq!(count(&ours, |op| op == "lstm_backward"), 1, "{ours:?}");
    assert_eq!(matmuls(&ours), 3, "{ours:?}");
    assert!(matmuls(&stock) >= 8 * TIME * 2, "nn::Lstm: {stock:?}");
}

/// The reference model with its `nn::Lstm` swapped for the fused one.
#[derive(burn::module::Module, Debug)]
struct FusedRegressor<B: Backend> {
    lstm: FusedLstm<B>,
    head: burn::nn::Linear<B>,
}

impl<B: burn_graph_capture::nn::LstmBackend> FusedRegressor<B> {
    fn loss(&self, x: Tensor<B, 3>, y: Tensor<B, 3>) -> Tensor<B, 1> {
        let (hidden, _) = self.lstm.forward(x, None);
        (self.head.forward(hidden) - y).powi_scalar(2).mean()
    }
}

/// Trained by `GraphTrainer` from the same weights, the fused model follows `nn::Lstm`'s
/// loss curve, and its step passes every capture guard (no breaker, a static signature,
/// no unlisted input): on the CPU it reaches `NoHardwareGraphs`, where a GPU captures.
#[test]
fn trains_like_nn_lstm_and_passes_the_capture_guards() {
    let _rng = crate::common::rng::shared();
    use burn_graph_capture::optim::CapturableAdamConfig;
    use burn_graph_capture::{GraphTrainer, GraphTrainerConfig, TrainBackend};
    use lstm_example::{Batch, LstmRegressor, LstmRegressorConfig, SineTask};
    type T = TrainBackend<Flex>;
    let device = Default::default();
    let config = LstmRegressorConfig::new(12);
    let bytes = to_bytes(config.init::<Flex>(&device));
    let reference: LstmRegressor<T> = load_bytes(config.init::<T>(&device), bytes.clone(), &device);
    // A second copy: a clone would share the head's tensors between the two trainers.
    let copy: LstmRegressor<T> = load_bytes(config.init::<T>(&device), bytes, &device);
    let fused = FusedRegressor {
        lstm: FusedLstm::from_lstm(&copy.lstm).unwrap(),
        head: copy.head,
    };
    let adam = || {
        CapturableAdamConfig::new()
            .with_learning_rate(1e-2)
            .init::<T>(&device)
    };
    let mut stock = GraphTrainer::new(
        reference,
        adam(),
        |m: &LstmRegressor<T>, b: &Batch<T>| m.loss(b.x.clone(), b.y.clone()),
        GraphTrainerConfig::new(),
    );
    let mut ours = GraphTrainer::new(
        fused,
        adam(),
        |m: &FusedRegressor<T>, b: &Batch<T>| m.loss(b.x.clone(), b.y.clone()),
        GraphTrainerConfig::new(),
    );
    let mut task = SineTask::new(5, 32);
    for step in 0..20 {
        let batch = task.next_batch::<T>(4, 10, &device);
        let expected: f32 = stock.step(batch.clone()).unwrap().output.into_scalar();
        let got: f32 = ours.step(batch).unwrap().output.into_scalar();
        assert!(
            (got - expected).abs() <= 1e-4 * expected.abs(),
            "step {step}: fused {got}, nn::Lstm {expected}"
        );
    }
    let report = ours.report();
    assert_eq!(report.fallbacks.get("Warmup"), Some(&3), "{report:?}");
    assert_eq!(
        report.fallbacks.get("NoHardwareGraphs"),
        Some(&17),
        "{report:?}"
    );
}
