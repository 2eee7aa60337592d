//! Graphs emulated on the host (`EmulatedGraphs`): a capture records the step's ops, a
//! replay runs that recording again on the pinned buffers without the step, host values
//! frozen as a device graph freezes them; trainers on them replay and train as plain
//! eager code does; an op the emulation cannot replay leaves its shape eager with the
//! op's name as the reason.

use burn::backend::Flex;
use burn::module::AutodiffModule;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::{ElementConversion, TensorPrimitive};
use burn_graph_capture::optim::CapturableAdam;
use burn_graph_capture::{
    AnyTensor, CaptureSession, Captured, EmulatedGraphs, FallbackReason, GraphBackend,
    GraphCapture, GraphError, GraphTrainer, GraphTrainerConfig, StepMode,
};
use lstm_example::train::parameter_bits;

use crate::common::models::{D_IN, GruRegressor, Regression, materialized};
use crate::common::{B, adam};

type G = GraphCapture<Flex>;

fn values(tensor: &AnyTensor<Flex>) -> Vec<f32> {
    let AnyTensor::Float(tensor) = tensor else {
        panic!("a float tensor")
    };
    Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(tensor.clone()))
        .into_data()
        .to_vec()
        .unwrap()
}

#[test]
fn a_replay_reruns_the_recording_on_the_pins_with_host_values_as_captured() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let initial = Tensor::<Flex, 1>::from_floats([1.0, 2.0], &device);
    assert!(matches!(
        Flex::pin(AnyTensor::Float(initial.clone().into_primitive().tensor())),
        Err(GraphError::NoArena)
    ));

    let _graphs = EmulatedGraphs::on();
    assert!(Flex::supports_hardware_graphs(&device));
    let pin = Flex::pin(AnyTensor::Float(initial.into_primitive().tensor())).unwrap();
    let weight = std::cell::Cell::new(2.0f32);
    let step = || {
        let x = Tensor::<G, 1>::from_primitive(TensorPrimitive::Float(match &pin {
            AnyTensor::Float(t) => t.clone(),
            _ => unreachable!(),
        }));
        let next = (x * weight.get() + 1.0).into_primitive().tensor();
        Flex::copy_into(&pin, &AnyTensor::Float(next)).unwrap();
    };
    let session = CaptureSession::begin();
    let captured = Flex::capture(&device, step);
    drop(session);
    let Captured::Recorded { graph, .. } = captured else {
        panic!("the step is recorded")
    };
    assert_eq!(
        values(&pin),
        [1.0, 2.0],
        "nothing recorded runs before a launch"
    );
    Flex::replay(&graph).unwrap();
    assert_eq!(values(&pin), [3.0, 5.0]);
    // The closure is not called: a host value changed after the capture stays as it was.
    weight.set(10.0);
    Flex::replay(&graph).unwrap();
    assert_eq!(
        values(&pin),
        [7.0, 11.0],
        "read from the pin as it is, weight 2"
    );
}

/// `D_IN -> 8 -> 1`, tanh.
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    first: Linear<B>,
    head: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        materialized(Self {
            first: LinearConfig::new(D_IN, 8).init(device),
            head: LinearConfig::new(8, 1).init(device),
        })
    }

    fn loss(&self, batch: &Regression<B>) -> Tensor<B, 1> {
        let hidden = self.first.forward(batch.x.clone()).tanh();
        (self.head.forward(hidden) - batch.y.clone())
            .powi_scalar(2)
            .mean()
    }
}

/// Trains `model` for `steps` steps of alternating batch sizes, on the trainer (with
/// emulated graphs) and as plain eager code: losses and parameters must agree bit for
/// bit. Returns the trainer's modes.
fn trains_as_plain_code<M>(model: M, loss: fn(&M, &Regression<B>) -> Tensor<B, 1>) -> Vec<StepMode>
where
    M: AutodiffModule<B> + Clone,
{
    trains_on_batches_as_plain_code(model, loss, |step| {
        let size = if step.is_multiple_of(3) { 5 } else { 4 };
        Regression::<B>::new(step, size, &Default::default())
    })
}

/// [`trains_as_plain_code`] on the batches `batch` makes. Every replay is traced.
fn trains_on_batches_as_plain_code<M>(
    model: M,
    loss: fn(&M, &Regression<B>) -> Tensor<B, 1>,
    batch: impl Fn(usize) -> Regression<B>,
) -> Vec<StepMode>
where
    M: AutodiffModule<B> + Clone,
{
    let steps = 40;

    let mut eager_losses = Vec::new();
    let (mut eager, mut optimizer) = (model.clone(), adam());
    for step in 0..steps {
        let value = loss(&eager, &batch(step));
        let grads = GradientsParams::from_grads(value.backward(), &eager);
        eager = burn_graph_capture::optim::CapturableOptimizer::step(&mut optimizer, eager, grads);
        eager_losses.push(value.into_scalar().elem::<f32>().to_bits());
    }

    let _graphs = EmulatedGraphs::on();
    let mut trainer: GraphTrainer<Flex, M, CapturableAdam<B>, Regression<B>, _> =
        GraphTrainer::new(model, adam(), loss, GraphTrainerConfig::new());
    let mut modes = Vec::new();
    for (step, eager_loss) in eager_losses.iter().enumerate() {
        let outcome = trainer.step(batch(step)).unwrap();
        assert_eq!(
            outcome.output.into_scalar().elem::<f32>().to_bits(),
            *eager_loss,
            "loss of step {step} ({:?})",
            outcome.mode
        );
        modes.push(outcome.mode);
    }
    assert_eq!(
        parameter_bits(trainer.model().unwrap()),
        parameter_bits(&eager)
    );
    // A replayed step's host time is in the report: its trace and its launch.
    let report = trainer.report();
    if report.modes.replayed > 0 {
        assert!(
            report.trace_ms > 0.0 && report.launch_ms > 0.0,
            "{report:?}"
        );
    }
    modes
}

#[test]
fn trainers_on_emulated_graphs_replay_and_train_as_plain_code() {
    let _rng = crate::common::rng::exclusive();
    let device = Default::default();
    for modes in [
        trains_as_plain_code(Mlp::<B>::new(&device), Mlp::loss),
        trains_as_plain_code(GruRegressor::<B>::new(6, &device), GruRegressor::loss),
    ] {
        let replays = modes.iter().filter(|m| **m == StepMode::Replayed).count();
        assert!(replays >= 25, "{replays} of 40 steps replayed: {modes:?}");
        assert!(modes.contains(&StepMode::Captured));
    }
}

/// A batch whose inputs and targets are views of one upload (`[B, D_IN + 1]`, narrowed):
/// its pins keep the views' strides, each batch is copied into them, and it graphs.
#[test]
fn a_batch_of_views_of_one_upload_graphs_and_trains_as_plain_code() {
    let _rng = crate::common::rng::exclusive();
    let device = Default::default();
    let viewed = |step: usize| {
        let plain = Regression::<B>::new(step, 4, &Default::default());
        let upload = Tensor::cat(vec![plain.x, plain.y], 1).into_data();
        let upload = Tensor::<B, 2>::from_data(upload, &Default::default());
        Regression {
            x: upload.clone().narrow(1, 0, D_IN),
            y: upload.narrow(1, D_IN, 1),
        }
    };
    let modes = trains_on_batches_as_plain_code(Mlp::<B>::new(&device), Mlp::loss, viewed);
    let replays = modes.iter().filter(|m| **m == StepMode::Replayed).count();
    assert!(replays >= 30, "{replays} of 40 steps replayed: {modes:?}");
}

/// A convolution with max pooling: autodiff's pooling keeps its indices in a Burn struct
/// over the backend, which an emulated graph does not replay.
#[derive(Module, Debug)]
struct Pooled<B: Backend> {
    conv: Conv2d<B>,
    pool: MaxPool2d,
    head: Linear<B>,
}

impl<B: Backend> Pooled<B> {
    fn new(device: &B::Device) -> Self {
        materialized(Self {
            conv: Conv2dConfig::new([1, 2], [1, 2]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            head: LinearConfig::new(2, 1).init(device),
        })
    }

    fn loss(&self, batch: &Regression<B>) -> Tensor<B, 1> {
        let [rows, _] = batch.x.dims();
        let image = batch.x.clone().reshape([rows, 1, 2, D_IN / 2]);
        let pooled = self.pool.forward(self.conv.forward(image));
        let features = pooled.mean_dim(3).mean_dim(2).reshape([rows, 2]);
        (self.head.forward(features) - batch.y.clone())
            .powi_scalar(2)
            .mean()
    }
}

#[test]
fn an_op_the_emulation_cannot_replay_leaves_its_shape_eager_with_its_name() {
    let _rng = crate::common::rng::exclusive();
    let modes = trains_as_plain_code(Pooled::<B>::new(&Default::default()), Pooled::loss);
    assert!(!modes.contains(&StepMode::Replayed), "{modes:?}");
    assert!(
        modes.iter().any(|mode| matches!(
            mode,
            StepMode::Eager(FallbackReason::Graph(GraphError::NotEmulated { op }))
                if op.contains("with_indices")
        )),
        "{modes:?}"
    );
}
