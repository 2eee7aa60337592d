//! A small Transformer encoder forecaster, shared by the benches: the inputs projected to
//! `h`, two encoder layers of width `h` with four heads (no dropout), a linear head. What
//! a trace costs on a model of many small ops that is not recurrent.

use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use lstm_example::model::Forecaster;

#[derive(Module, Debug)]
pub struct TransformerRegressor<B: Backend> {
    input: Linear<B>,
    encoder: TransformerEncoder<B>,
    head: Linear<B>,
}

impl<B: Backend> TransformerRegressor<B> {
    /// `d_input` features a step, width `h`.
    pub fn new(d_input: usize, h: usize, device: &B::Device) -> Self {
        Self {
            input: LinearConfig::new(d_input, h).init(device),
            encoder: TransformerEncoderConfig::new(h, 2 * h, 4, 2)
                .with_dropout(0.0)
                .init(device),
            head: LinearConfig::new(h, 1).init(device),
        }
    }
}

impl<B: Backend> Forecaster<B> for TransformerRegressor<B> {
    fn predict(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let hidden = self.input.forward(x);
        let encoded = self.encoder.forward(TransformerEncoderInput::new(hidden));
        self.head.forward(encoded)
    }
}
