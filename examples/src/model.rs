//! `nn::Lstm` + `Linear` head, the model of the reference configurations (ARCHITECTURE.md).

use burn::nn::{Linear, LinearConfig, Lstm, LstmConfig};
use burn::prelude::*;
use burn_graph_capture::nn::{FusedLstm, LstmBackend, LstmConversionError};

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

/// A model that predicts one value per time step of `[batch, time, d_input]` inputs.
pub trait Forecaster<B: Backend> {
    /// `[batch, time, d_input]` to `[batch, time, 1]`.
    fn predict(&self, x: Tensor<B, 3>) -> Tensor<B, 3>;

    /// Mean squared error against `[batch, time, 1]` targets.
    fn mse(&self, x: Tensor<B, 3>, y: Tensor<B, 3>) -> Tensor<B, 1> {
        (self.predict(x) - y).powi_scalar(2).mean()
    }
}

impl<B: Backend> Forecaster<B> for LstmRegressor<B> {
    fn predict(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward(x)
    }
}

/// The same model with `FusedLstm` in place of `nn::Lstm`.
#[derive(Module, Debug)]
pub struct FusedLstmRegressor<B: Backend> {
    /// The recurrent layer, in batched form.
    pub lstm: FusedLstm<B>,
    /// The per-step output layer.
    pub head: Linear<B>,
}

impl<B: Backend> LstmRegressor<B> {
    /// The same function with the batched LSTM (its weights converted, the head kept).
    pub fn to_fused(&self) -> Result<FusedLstmRegressor<B>, LstmConversionError> {
        Ok(FusedLstmRegressor {
            lstm: FusedLstm::from_lstm(&self.lstm)?,
            head: self.head.clone(),
        })
    }
}

impl<B: LstmBackend> Forecaster<B> for FusedLstmRegressor<B> {
    fn predict(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let (hidden, _state) = self.lstm.forward(x, None);
        self.head.forward(hidden)
    }
}
