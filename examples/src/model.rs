//! `nn::Lstm` + `Linear` head, the model of the reference configurations (ARCHITECTURE.md).

use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
use burn::prelude::*;

/// Sizes of the model.
#[derive(Config, Debug)]
pub struct LstmRegressorConfig {
    /// Input features per time step.
    #[config(default = 32)]
    pub d_input: usize,
    /// Hidden size of the LSTM.
    pub d_hidden: usize,
}

/// An LSTM that predicts one value per time step.
#[derive(Module, Debug)]
pub struct LstmRegressor<B: Backend> {
    /// The recurrent layer.
    pub lstm: Lstm<B>,
    /// The per-step output layer.
    pub head: Linear<B>,
}

impl LstmRegressorConfig {
    /// Builds the model with fresh weights from `B`'s RNG.
    pub fn init<B: Backend>(&self, device: &B::Device) -> LstmRegressor<B> {
        LstmRegressor {
            lstm: LstmConfig::new(self.d_input, self.d_hidden, true).init(device),
            head: LinearConfig::new(self.d_hidden, 1).init(device),
        }
    }
}

impl<B: Backend> LstmRegressor<B> {
    /// `[batch, time, d_input]` to `[batch, time, 1]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let (hidden, _state) = self.lstm.forward(x, None);
        self.head.forward(hidden)
    }

    /// Mean squared error against `[batch, time, 1]` targets.
    pub fn loss(&self, x: Tensor<B, 3>, y: Tensor<B, 3>) -> Tensor<B, 1> {
        (self.forward(x) - y).powi_scalar(2).mean()
    }
}
