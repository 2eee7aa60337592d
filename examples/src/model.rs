//! `nn::Lstm` + `Linear` head, the model of the reference configurations (ARCHITECTURE.md).

use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig, Lstm, LstmConfig};
use burn::prelude::*;
use burn_graph_capture::nn::{
    FusedGru, FusedGruConfig, FusedLstm, FusedLstmConfig, GruBackend, LstmBackend,
    LstmConversionError,
};

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

/// Sizes of [`GruRegressor`].
#[derive(Config, Debug)]
pub struct GruRegressorConfig {
    /// Input features per time step.
    #[config(default = 32)]
    pub d_input: usize,
    /// Hidden size.
    pub d_hidden: usize,
}

/// A `FusedGru` and a per-step head: the GRU counterpart of [`FusedLstmRegressor`].
#[derive(Module, Debug)]
pub struct GruRegressor<B: Backend> {
    /// The recurrent layer, in batched form.
    pub gru: FusedGru<B>,
    /// The per-step output layer.
    pub head: Linear<B>,
}

impl GruRegressorConfig {
    /// Builds the model with fresh weights from `B`'s RNG.
    pub fn init<B: Backend>(&self, device: &B::Device) -> GruRegressor<B> {
        GruRegressor {
            gru: FusedGruConfig::new(self.d_input, self.d_hidden, true).init(device),
            head: LinearConfig::new(self.d_hidden, 1).init(device),
        }
    }
}

impl<B: GruBackend> Forecaster<B> for GruRegressor<B> {
    fn predict(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let (hidden, _state) = self.gru.forward(x, None);
        self.head.forward(hidden)
    }
}

/// Sizes of [`DropoutLstmRegressor`].
#[derive(Config, Debug)]
pub struct DropoutLstmRegressorConfig {
    /// Input features per time step.
    #[config(default = 32)]
    pub d_input: usize,
    /// Hidden size of both layers.
    pub d_hidden: usize,
    /// Dropout probability between the two layers.
    #[config(default = 0.3)]
    pub dropout: f64,
}

/// Two `FusedLstm` layers with dropout between them, and a per-step head: a recurrent
/// model as most are trained. Its masks come from the trainer's device generator, so its
/// steps graph like any other (`burn_graph_capture::rng`).
#[derive(Module, Debug)]
pub struct DropoutLstmRegressor<B: Backend> {
    /// The input-side layer.
    pub first: FusedLstm<B>,
    /// Between the layers.
    pub dropout: Dropout,
    /// The output-side layer.
    pub second: FusedLstm<B>,
    /// The per-step output layer.
    pub head: Linear<B>,
}

impl DropoutLstmRegressorConfig {
    /// Builds the model with fresh weights from `B`'s RNG.
    pub fn init<B: Backend>(&self, device: &B::Device) -> DropoutLstmRegressor<B> {
        let layer = |d_input| FusedLstmConfig::new(d_input, self.d_hidden, true).init(device);
        DropoutLstmRegressor {
            first: layer(self.d_input),
            dropout: DropoutConfig::new(self.dropout).init(),
            second: layer(self.d_hidden),
            head: LinearConfig::new(self.d_hidden, 1).init(device),
        }
    }
}

impl<B: LstmBackend> Forecaster<B> for DropoutLstmRegressor<B> {
    fn predict(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let (hidden, _state) = self.first.forward(x, None);
        let (hidden, _state) = self.second.forward(self.dropout.forward(hidden), None);
        self.head.forward(hidden)
    }
}
