//! `FusedGru` against Burn's `nn::Gru` on the CPU (issue 28): same weights, same function,
//! same gradients (1e-5 relative), conversions both ways, typed refusals, and the batched
//! form (one recurrent GEMM per step each way, the weight gradient once).

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::nn::GruConfig;
use burn::tensor::{Distribution, Tensor};
use burn_graph_capture::nn::{FusedGru, FusedGruConfig, GruConversionError};
use burn_graph_capture::{CaptureSession, GraphCapture};
use lstm_example::train::parameter_values;

use crate::common::fused_gru_parity::{
    GRU_BASE, GruCase, Tolerance, compare_gru, compare_gru_within, reference_grus,
};

type A = Autodiff<Flex>;

#[test]
fn matches_nn_gru_outputs_states_and_gradients() {
    let _rng = crate::common::rng::shared();
    compare_gru::<A>(GRU_BASE);
}

#[test]
fn matches_with_a_single_time_step() {
    let _rng = crate::common::rng::shared();
    compare_gru::<A>(GruCase {
        time: 1,
        ..GRU_BASE
    });
}

#[test]
fn matches_with_a_hidden_size_that_is_not_a_multiple_of_32() {
    let _rng = crate::common::rng::shared();
    compare_gru::<A>(GruCase {
        hidden: 33,
        time: 3,
        ..GRU_BASE
    });
}

#[test]
fn matches_without_bias() {
    let _rng = crate::common::rng::shared();
    compare_gru::<A>(GruCase {
        bias: false,
        ..GRU_BASE
    });
}

#[test]
fn matches_two_stacked_layers() {
    let _rng = crate::common::rng::shared();
    compare_gru::<A>(GruCase {
        layers: 2,
        ..GRU_BASE
    });
}

#[test]
fn matches_with_batch_one() {
    let _rng = crate::common::rng::shared();
    compare_gru::<A>(GruCase {
        batch: 1,
        ..GRU_BASE
    });
}

#[test]
fn matches_through_the_decorator() {
    let _rng = crate::common::rng::shared();
    compare_gru::<Autodiff<GraphCapture<Flex>>>(GruCase {
        layers: 2,
        ..GRU_BASE
    });
}

#[test]
fn converts_to_nn_gru_and_back_exactly() {
    let _rng = crate::common::rng::shared();
    let reference = reference_grus::<A>(GruCase {
        layers: 2,
        ..GRU_BASE
    });
    let fused = FusedGru::from_grus(&reference).unwrap();
    let back = fused.to_grus();
    assert_eq!(back.len(), 2);
    for (original, converted) in reference.iter().zip(&back) {
        assert_eq!(parameter_values(original), parameter_values(converted));
    }
    let config = GruConfig::new(4, 8, true);
    let record = fused.to_gru_records().into_iter().next().unwrap();
    let reloaded = FusedGru::<A>::from_gru_record(&config, record, &Default::default()).unwrap();
    assert_eq!(
        parameter_values(&reloaded.layers[0]),
        parameter_values(&fused.layers[0])
    );
}

#[test]
fn options_it_does_not_compute_are_refused_by_name() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let refused = |config: GruConfig| FusedGru::<Flex>::from_gru(&config.init(&device));
    assert_eq!(
        refused(GruConfig::new(4, 8, true).with_reset_after(false)).unwrap_err(),
        GruConversionError::Unsupported("reset_after = false")
    );
    assert_eq!(
        refused(GruConfig::new(4, 8, true).with_clip(Some(1.0))).unwrap_err(),
        GruConversionError::Unsupported("clip")
    );
    assert_eq!(
        FusedGru::<Flex>::from_grus(&[]).unwrap_err(),
        GruConversionError::NoLayers
    );
    let stack = [
        GruConfig::new(4, 8, true).init::<Flex>(&device),
        GruConfig::new(5, 8, true).init::<Flex>(&device),
    ];
    assert!(matches!(
        FusedGru::from_grus(&stack).unwrap_err(),
        GruConversionError::Stacking { layer: 1, .. }
    ));
}

#[test]
fn a_fresh_module_has_packed_shapes_and_trains_its_weights() {
    let _rng = crate::common::rng::shared();
    let fused = FusedGruConfig::new(4, 8, true)
        .with_num_layers(2)
        .init::<A>(&Default::default());
    assert_eq!(fused.layers[0].input_weight.dims(), [4, 24]);
    assert_eq!(fused.layers[1].input_weight.dims(), [8, 24]);
    assert_eq!(fused.layers[1].hidden_weight.dims(), [8, 24]);
    let x = Tensor::<A, 3>::random([2, 5, 4], Distribution::Default, &Default::default());
    let (out, state) = fused.forward(x, None);
    assert_eq!(out.dims(), [2, 5, 8]);
    assert_eq!(state.dims(), [2, 2, 8]);
    let grads = out.sum().backward();
    for layer in &fused.layers {
        assert!(layer.hidden_weight.grad(&grads).is_some());
        assert!(layer.hidden_bias.as_ref().unwrap().grad(&grads).is_some());
    }
    // The inference copy runs the same forward without autodiff.
    let _ = fused.valid();
}

/// The batched form on the decorator: the input projection and its weight's gradient are
/// one GEMM each, and the recurrence one recorded op each way (the inner backend's
/// kernels), so a capture session sees what it reads and makes.
#[test]
fn the_recurrence_is_one_recorded_op_each_way() {
    let _rng = crate::common::rng::shared();
    type D = Autodiff<GraphCapture<Flex>>;
    let (batch, time) = (3, 5);
    let fused = FusedGruConfig::new(4, 8, true).init::<D>(&Default::default());
    let x = Tensor::<D, 3>::random([batch, time, 4], Distribution::Default, &Default::default());
    let (_, recording) = CaptureSession::record(|| {
        let (out, _) = fused.forward(x.clone(), None);
        out.sum().backward()
    });
    let count = |name: &str| {
        recording
            .signature
            .ops()
            .iter()
            .filter(|op| op.op == name)
            .count()
    };
    assert_eq!(count("gru_forward"), 1);
    assert_eq!(count("gru_backward"), 1);
    // The input GEMM forward, the input weight's gradient backward (`x` needs none).
    assert_eq!(count("float_matmul"), 2);
}

/// Weight gradients summed over 200 rows and steps may cancel to small values: each within
/// 1e-5 of its tensor's largest.
#[test]
fn matches_a_larger_batch_within_its_largest_values() {
    let _rng = crate::common::rng::shared();
    let case = GruCase {
        batch: 40,
        hidden: 100,
        time: 5,
        ..GRU_BASE
    };
    compare_gru_within::<A>(case, Tolerance::OfLargest(1e-5));
}

/// The example's `--gru`: a `FusedGru` forecaster trains through `GraphTrainer` on the
/// CPU from the seed's weights, and forecasts the held-out months better than it did
/// before training.
#[test]
fn the_example_trains_a_fused_gru() {
    let _rng = crate::common::rng::shared();
    use burn::module::AutodiffModule;
    use burn_graph_capture::TrainBackend;
    use clap::Parser;
    use lstm_example::forecast::{self, Options};
    use lstm_example::sunspots::Sunspots;
    let options = Options::parse_from([
        "lstm",
        "--gru",
        "--epochs",
        "1",
        "--seq-len",
        "8",
        "--hidden",
        "8",
        "--lr",
        "1e-2",
    ]);
    let series = Sunspots::load().expect("the sunspot series");
    let device = Default::default();
    let model = forecast::gru_model::<TrainBackend<Flex>>(&options, &device);
    let before = forecast::evaluate(&model.valid(), &series, options.seq_len, &device);
    let run =
        forecast::train::<Flex, _>(&options, &series, model, true, "graphed").expect("trains");
    assert!(!run.losses.is_empty() && run.losses.iter().all(|loss| loss.is_finite()));
    assert!(
        run.eval.rmse < before.rmse,
        "held-out RMSE {} before training, {} after",
        before.rmse,
        run.eval.rmse
    );
}
