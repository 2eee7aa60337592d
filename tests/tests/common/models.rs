//! Models other than the example's LSTM, for the guards: an MLP with `BatchNorm`
//! (module state the step writes outside parameters) and an MLP whose one layer is
//! reached through two fields (a tied parameter); and a token batch that does not list
//! its tokens.
#![allow(dead_code)] // Each test binary uses a different subset.

use burn::module::{ModuleMapper, Param};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, Relu};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use burn_graph_capture::{AnyTensor, StepInput};
use lstm_example::TokenBatch;

/// Input width of both MLPs.
pub const D_IN: usize = 8;

/// `module` with every parameter drawn now: Burn draws lazily, so a clone of a fresh
/// module would draw values of its own.
pub fn materialized<B: Backend, M: Module<B>>(module: M) -> M {
    struct Draw;
    impl<B: Backend> ModuleMapper<B> for Draw {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            Param::from_mapped_value(id, tensor, mapper)
        }
    }
    module.map(&mut Draw)
}

/// Maps every matrix of a module to a transposed view of its transpose's upload: the
/// same values with other strides (`[1, rows]`), as a user's own tensors may lie. Kernels
/// follow strides, so a trainer must pin again where such parameters leave their layout.
pub struct TransposedViews;

impl<B: AutodiffBackend> ModuleMapper<B> for TransposedViews {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if D != 2 {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let inner = tensor.inner();
        let data = inner.clone().swap_dims(0, 1).into_data();
        let view = Tensor::<B::InnerBackend, D>::from_data(data, &inner.device()).swap_dims(0, 1);
        let mut tensor = Tensor::from_inner(view);
        if require_grad {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// `Linear` → `BatchNorm` → ReLU → `Linear`, regressing one value.
#[derive(Module, Debug)]
pub struct BnMlp<B: Backend> {
    input: Linear<B>,
    norm: BatchNorm<B>,
    activation: Relu,
    output: Linear<B>,
}

impl<B: Backend> BnMlp<B> {
    pub fn new(hidden: usize, device: &B::Device) -> Self {
        materialized(Self {
            input: LinearConfig::new(D_IN, hidden).init(device),
            norm: BatchNormConfig::new(hidden).init(device),
            activation: Relu::new(),
            output: LinearConfig::new(hidden, 1).init(device),
        })
    }

    /// `[batch, D_IN]` to `[batch, 1]`; training mode on autodiff backends.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = self.input.forward(x).unsqueeze_dim::<3>(2);
        let hidden = self.norm.forward(hidden).squeeze_dim::<2>(2);
        self.output.forward(self.activation.forward(hidden))
    }

    pub fn loss(&self, batch: &Regression<B>) -> Tensor<B, 1> {
        (self.forward(batch.x.clone()) - batch.y.clone())
            .powi_scalar(2)
            .mean()
    }

    /// The running mean as the module holds it (`value`, not flushed).
    pub fn norm_mean(&self) -> Tensor<B, 1> {
        self.norm.running_mean.value()
    }

    /// The running mean and variance, flushed (`value_sync`).
    pub fn running_stats(&self) -> (Vec<f32>, Vec<f32>) {
        let read = |t: Tensor<B, 1>| t.into_data().convert::<f32>().into_vec().unwrap();
        (
            read(self.norm.running_mean.value_sync()),
            read(self.norm.running_var.value_sync()),
        )
    }
}

/// An MLP whose `shared` layer is applied twice, through two fields holding one
/// parameter (as an embedding tied to an output layer is).
#[derive(Module, Debug)]
pub struct TiedMlp<B: Backend> {
    first: Linear<B>,
    second: Linear<B>,
    output: Linear<B>,
}

impl<B: Backend> TiedMlp<B> {
    pub fn new(device: &B::Device) -> Self {
        let shared = materialized(LinearConfig::new(D_IN, D_IN).init(device));
        materialized(Self {
            first: shared.clone(),
            second: shared,
            output: LinearConfig::new(D_IN, 1).init(device),
        })
    }

    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = self.first.forward(x).tanh();
        self.output.forward(self.second.forward(hidden).tanh())
    }

    pub fn loss(&self, batch: &Regression<B>) -> Tensor<B, 1> {
        (self.forward(batch.x.clone()) - batch.y.clone())
            .powi_scalar(2)
            .mean()
    }

    /// Ties the second field to the first again, as plain Burn code must after each
    /// optimizer step.
    pub fn retie(&mut self) {
        self.second = self.first.clone();
    }

    /// Whether both fields still hold the same values.
    pub fn tied(&self) -> bool {
        let values = |l: &Linear<B>| l.weight.val().into_data();
        values(&self.first) == values(&self.second)
    }
}

/// Inputs `[batch, D_IN]` and targets `[batch, 1]`.
#[derive(Clone, Debug, StepInput)]
pub struct Regression<B: Backend> {
    pub x: Tensor<B, 2>,
    pub y: Tensor<B, 2>,
}

impl<B: Backend> Regression<B> {
    /// A deterministic batch: `y` is a fixed nonlinear function of `x`, computed on the
    /// host so that both tensors are plain uploads. (Computed lazily on the device, `y`'s
    /// ops fused into the loss's kernels in plain eager code but not in the trainer,
    /// which copies the batch into its buffers first: other fused kernels, whose
    /// autotuned picks rounded alike only sometimes. See the guide, "Limits".)
    pub fn new(step: usize, batch: usize, device: &B::Device) -> Self {
        let values: Vec<f32> = (0..batch * D_IN)
            .map(|i| (((i * 7 + step * 13) % 17) as f32 - 8.0) / 8.0)
            .collect();
        let targets: Vec<f32> = values
            .chunks(D_IN)
            .map(|row| row.iter().map(|v| v.sin()).sum::<f32>() * 0.5)
            .collect();
        let x = Tensor::<B, 2>::from_data(TensorData::new(values, [batch, D_IN]), device);
        let y = Tensor::<B, 2>::from_data(TensorData::new(targets, [batch, 1]), device);
        Self { x, y }
    }
}

/// The batch of issue 11's report: a hand-written `StepInput` that lists the float mask
/// and leaves the int tokens and targets out.
#[derive(Clone, Debug)]
pub struct MaskOnly<B: Backend> {
    pub tokens: TokenBatch<B>,
    pub mask: Tensor<B, 2>,
}

impl<B: AutodiffBackend> StepInput<B> for MaskOnly<B> {
    fn collect_tensors(&self, tensors: &mut Vec<AnyTensor<B::InnerBackend>>) {
        self.mask.collect_tensors(tensors);
    }

    fn with_tensors(&self, tensors: &mut std::vec::IntoIter<AnyTensor<B::InnerBackend>>) -> Self {
        Self {
            tokens: self.tokens.clone(),
            mask: self.mask.with_tensors(tensors),
        }
    }
}

/// A GRU regressor: `nn::Gru` over `[batch, time, D_IN]`, a `Linear` head per step.
#[derive(Module, Debug)]
pub struct GruRegressor<B: Backend> {
    gru: burn::nn::gru::Gru<B>,
    head: Linear<B>,
}

impl<B: Backend> GruRegressor<B> {
    pub fn new(hidden: usize, device: &B::Device) -> Self {
        materialized(Self {
            gru: burn::nn::gru::GruConfig::new(D_IN / 2, hidden, true).init(device),
            head: LinearConfig::new(hidden, 1).init(device),
        })
    }

    /// Mean squared error of the last step's forecast of `y`, reading each row of `x`
    /// as a sequence of two steps of `D_IN / 2` features.
    pub fn loss(&self, batch: &Regression<B>) -> Tensor<B, 1> {
        let [rows, _] = batch.x.dims();
        let hidden = self
            .gru
            .forward(batch.x.clone().reshape([rows, 2, D_IN / 2]), None);
        let last = hidden.narrow(1, 1, 1).squeeze_dim::<2>(1);
        (self.head.forward(last) - batch.y.clone())
            .powi_scalar(2)
            .mean()
    }
}
