//! Batches of every tensor kind: listed, keyed, checked, rebuilt; the derive.

use burn::backend::Flex;
use burn::prelude::*;
use burn_graph_capture::backend::TensorKind;
use burn_graph_capture::optim::CapturableAdamConfig;
use burn_graph_capture::step::EmptyBatch;
use burn_graph_capture::{
    AnyTensor, FallbackReason, GraphTrainer, GraphTrainerConfig, StepError, StepInput, StepMode,
};
use lstm_example::{CharLm, CharLmConfig, TokenBatch, TokenTask};

use crate::common::{self, B};

type Inner = <B as burn::tensor::backend::AutodiffBackend>::InnerBackend;

#[derive(Clone, Debug, StepInput)]
struct Masked<B: Backend> {
    tokens: Tensor<B, 2, Int>,
    mask: Tensor<B, 2, Bool>,
}

/// A nested batch: a derived struct, a tuple, a host key and a skipped field.
#[derive(Clone, Debug, StepInput)]
struct Nested<B: Backend> {
    weights: Tensor<B, 1>,
    inner: Masked<B>,
    pair: (Tensor<B, 1, Int>, Tensor<B, 2>),
    #[step_input(key)]
    task: u8,
    #[step_input(skip)]
    note: String,
}

/// A batch for a concrete backend, which names it.
#[derive(Clone, StepInput)]
#[step_input(backend = B)]
struct Concrete(Tensor<B, 1, Int>);

fn nested(task: u8) -> Nested<B> {
    let device = Default::default();
    Nested {
        weights: Tensor::from_floats([1.0, 2.0], &device),
        inner: Masked {
            tokens: Tensor::from_ints([[1, 2, 3]], &device),
            mask: Tensor::from_bool(TensorData::from([[true, false, true]]), &device),
        },
        pair: (
            Tensor::from_ints([7], &device),
            Tensor::zeros([2, 2], &device),
        ),
        task,
        note: "not read by the step".into(),
    }
}

fn describe(tensors: &[AnyTensor<Inner>]) -> Vec<(TensorKind, Vec<usize>)> {
    tensors
        .iter()
        .map(|t| (t.kind(), t.shape().as_slice().to_vec()))
        .collect()
}

#[test]
fn the_derive_lists_every_field_in_declaration_order_nested_ones_included() {
    let _rng = crate::common::rng::shared();
    let tensors = nested(0).tensors();
    assert_eq!(
        describe(&tensors),
        [
            (TensorKind::Float, vec![2]),
            (TensorKind::Int, vec![1, 3]),
            (TensorKind::Bool, vec![1, 3]),
            (TensorKind::Int, vec![1]),
            (TensorKind::Float, vec![2, 2]),
        ]
    );
    assert_eq!(
        Concrete(Tensor::from_ints([4, 5], &Default::default()))
            .tensors()
            .len(),
        1
    );
}

#[test]
fn the_derive_rebuilds_the_batch_from_replacement_tensors_in_order() {
    let _rng = crate::common::rng::shared();
    let original = nested(3);
    let other = Nested {
        weights: Tensor::from_floats([5.0, 6.0], &Default::default()),
        ..nested(3)
    };
    let replacement = other.tensors();
    let rebuilt = original.with_tensors(&mut replacement.into_iter());
    let values: Vec<f32> = rebuilt.weights.into_data().to_vec().unwrap();
    assert_eq!(values, [5.0, 6.0], "the listed tensor was replaced");
    assert_eq!(rebuilt.task, 3, "key fields are kept");
    assert_eq!(
        rebuilt.note, "not read by the step",
        "skipped fields are kept"
    );
    let too_few = original.with_tensors(&mut Vec::new().into_iter());
    let kept: Vec<f32> = too_few.weights.into_data().to_vec().unwrap();
    assert_eq!(
        kept,
        [1.0, 2.0],
        "a missing replacement keeps the batch's own tensor"
    );
}

type TokenTrainer = GraphTrainer<
    Flex,
    CharLm<B>,
    burn_graph_capture::optim::CapturableAdam<B>,
    TokenBatch<B>,
    fn(&CharLm<B>, &TokenBatch<B>) -> Tensor<B, 1>,
>;

fn token_trainer(config: GraphTrainerConfig) -> TokenTrainer {
    let device = Default::default();
    let model = CharLmConfig::new(12, 8).init::<B>(&device);
    let optimizer = CapturableAdamConfig::new().init::<B>(&device);
    fn loss(model: &CharLm<B>, batch: &TokenBatch<B>) -> Tensor<B, 1> {
        model.loss(batch.tokens.clone(), batch.targets.clone())
    }
    GraphTrainer::new(model, optimizer, loss, config)
}

#[test]
fn int_batches_are_keyed_by_their_shapes() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let mut trainer = token_trainer(
        GraphTrainerConfig::new()
            .with_warmup_steps(1)
            .with_max_graphs(2),
    );
    let mut task = TokenTask::new(1, 12);
    let mode = |trainer: &mut GraphTrainer<_, _, _, _, _>, batch| trainer.step(batch).unwrap().mode;
    assert_eq!(
        mode(&mut trainer, task.next_batch(2, 5, &device)),
        StepMode::Eager(FallbackReason::Warmup)
    );
    assert_eq!(
        mode(&mut trainer, task.next_batch(2, 5, &device)),
        StepMode::Eager(FallbackReason::NoHardwareGraphs),
        "warmed up: the tokens are listed, so only the CPU stops a graph"
    );
    assert_eq!(
        mode(&mut trainer, task.next_batch(2, 7, &device)),
        StepMode::Eager(FallbackReason::Warmup),
        "another sequence length is another key"
    );
    assert_eq!(
        mode(&mut trainer, task.next_batch(3, 7, &device)),
        StepMode::Eager(FallbackReason::Warmup),
        "shapes without a graph hold no graph slot"
    );
}

#[test]
fn host_key_fields_key_graphs() {
    let _rng = crate::common::rng::shared();
    let device = burn::backend::flex::FlexDevice;
    let model = common::models::BnMlp::<B>::new(4, &device);
    #[derive(Clone, StepInput)]
    struct Keyed<B: Backend> {
        data: common::models::Regression<B>,
        #[step_input(key)]
        scale: u32,
    }
    let loss = |model: &common::models::BnMlp<B>, batch: &Keyed<B>| {
        model.loss(&batch.data) * batch.scale as f32
    };
    let optimizer = CapturableAdamConfig::new().init::<B>(&device);
    let mut trainer = GraphTrainer::new(
        model,
        optimizer,
        loss,
        GraphTrainerConfig::new().with_warmup_steps(1),
    );
    let batch = |step, scale| Keyed {
        data: common::models::Regression::new(step, 4, &device),
        scale,
    };
    assert_eq!(
        trainer.step(batch(0, 1)).unwrap().mode,
        StepMode::Eager(FallbackReason::Warmup)
    );
    assert_eq!(
        trainer.step(batch(1, 1)).unwrap().mode,
        StepMode::Eager(FallbackReason::NoHardwareGraphs)
    );
    assert_eq!(
        trainer.step(batch(2, 2)).unwrap().mode,
        StepMode::Eager(FallbackReason::Warmup),
        "another host value, another graph"
    );
}

#[test]
fn an_empty_int_tensor_is_refused_by_kind_and_position() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let mut trainer = token_trainer(GraphTrainerConfig::new());
    let empty = TokenBatch::<B> {
        tokens: Tensor::from_ints([[1, 2]], &device),
        targets: Tensor::<B, 2, Int>::empty([1, 0], &device),
    };
    let error = trainer.step(empty).unwrap_err();
    assert_eq!(
        error,
        StepError::EmptyBatch(EmptyBatch::EmptyTensor {
            kind: TensorKind::Int,
            index: 1,
            shape: vec![1, 0]
        })
    );
    assert_eq!(
        error.to_string(),
        "empty batch: int tensor 1 has shape [1, 0]"
    );
    assert_eq!(trainer.report().steps, 0, "nothing ran");
    let mut task = TokenTask::new(2, 12);
    assert!(
        trainer.step(task.next_batch(2, 4, &device)).is_ok(),
        "still usable"
    );
}

/// Features and target narrowed from one `[batch, time, features + 1]` upload, and a
/// per-sample weight `expand`ed over time: three views, two of one allocation.
#[derive(Clone, Debug, StepInput)]
struct Packed<B: Backend> {
    features: Tensor<B, 3>,
    target: Tensor<B, 3>,
    weight: Tensor<B, 3>,
}

const PACKED_FEATURES: usize = 3;

fn packed(step: usize) -> Packed<B> {
    let device = Default::default();
    let (batch, time) = (4, 5);
    let width = PACKED_FEATURES + 1;
    let values: Vec<f32> = (0..batch * time * width)
        .map(|i| ((i * 7 + step * 13) % 17) as f32 / 17.0 - 0.5)
        .collect();
    let upload = Tensor::<B, 3>::from_data(TensorData::new(values, [batch, time, width]), &device);
    let weights: Vec<f32> = (0..batch).map(|i| 1.0 + (i + step) as f32 * 0.25).collect();
    Packed {
        features: upload.clone().narrow(2, 0, PACKED_FEATURES),
        target: upload.narrow(2, PACKED_FEATURES, 1),
        weight: Tensor::<B, 1>::from_floats(weights.as_slice(), &device)
            .reshape([batch, 1, 1])
            .expand([batch, time, 1]),
    }
}

fn packed_loss(model: &burn::nn::Linear<B>, batch: &Packed<B>) -> Tensor<B, 1> {
    let error = model.forward(batch.features.clone()) - batch.target.clone();
    (batch.weight.clone() * error.powi_scalar(2)).mean()
}

#[test]
fn views_of_one_upload_warm_up_like_any_batch_and_train_as_plain_code() {
    let _rng = crate::common::rng::shared();
    let device = Default::default();
    let start = common::models::materialized(
        burn::nn::LinearConfig::new(PACKED_FEATURES, 1).init::<B>(&device),
    );
    let adam = || CapturableAdamConfig::new().init::<B>(&device);
    let mut trainer = GraphTrainer::new(
        start.clone(),
        adam(),
        packed_loss,
        GraphTrainerConfig::new(),
    );
    let steps = 8;
    let (mut losses, mut modes) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let outcome = trainer.step(packed(step)).unwrap();
        losses.push(outcome.output.into_scalar().to_bits());
        modes.push(outcome.mode);
    }
    let warmup = GraphTrainerConfig::new().warmup_steps;
    assert!(
        modes[warmup..]
            .iter()
            .all(|mode| *mode == StepMode::Eager(FallbackReason::NoHardwareGraphs)),
        "ready for a graph after warmup: {modes:?}"
    );

    let mut optimizer = adam();
    optimizer.init_state(&start);
    let mut model = start;
    let mut plain = Vec::new();
    for step in 0..steps {
        let loss = packed_loss(&model, &packed(step));
        let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
        model = optimizer.step(model, grads);
        plain.push(loss.into_scalar().to_bits());
    }
    assert_eq!(losses, plain);
}
