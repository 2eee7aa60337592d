//! The module and its configuration.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::{Tensor, backend::Backend};

use super::backend::GruBackend;
use crate::nn::gates::{init_bias, init_weight};
use crate::nn::sequence::{primitive, tensor};

/// Configuration of a [`FusedGru`]: `nn::GruConfig`'s options that it computes, plus
/// stacking. Inputs and outputs are batch first, as `nn::Gru`'s.
#[derive(Config, Debug)]
pub struct FusedGruConfig {
    /// Input features per time step.
    pub d_input: usize,
    /// Hidden size of every layer.
    pub d_hidden: usize,
    /// Whether the gates have biases (an input and a hidden bias, as `nn::Gru`).
    pub bias: bool,
    /// Initializer of weights and biases, applied per gate as `nn::Gru` does.
    #[config(default = "Initializer::XavierNormal{gain:1.0}")]
    pub initializer: Initializer,
    /// Stacked layers: each layer's hidden sequence is the next one's input.
    #[config(default = 1)]
    pub num_layers: usize,
}

/// One layer's parameters, gates packed `[update, reset, new]`.
#[derive(Module, Debug)]
pub struct FusedGruLayer<B: Backend> {
    /// `[d_input, 3H]`.
    pub input_weight: Param<Tensor<B, 2>>,
    /// `[H, 3H]`.
    pub hidden_weight: Param<Tensor<B, 2>>,
    /// `[3H]`, added to the input projection.
    pub input_bias: Option<Param<Tensor<B, 1>>>,
    /// `[3H]`, added to the recurrent projection (inside the reset gate's product).
    pub hidden_bias: Option<Param<Tensor<B, 1>>>,
}

/// A GRU (one or more stacked layers) whose step is a few large ops: see the module docs
/// of [`gru`](super).
#[derive(Module, Debug)]
pub struct FusedGru<B: Backend> {
    /// The layers, input side first.
    pub layers: Vec<FusedGruLayer<B>>,
    /// Hidden size.
    pub d_hidden: usize,
}

impl FusedGruConfig {
    /// Builds the module with fresh weights.
    pub fn init<B: Backend>(&self, device: &B::Device) -> FusedGru<B> {
        let hidden = self.d_hidden;
        let layer = |d_input: usize| {
            // Per gate, as `nn::Gru`'s `Linear`s draw them (fan-in, fan-out of one gate).
            let weight = |rows| init_weight(&self.initializer, rows, hidden, 3, device);
            let bias = |rows| {
                self.bias
                    .then(|| init_bias(&self.initializer, rows, hidden, 3, device))
            };
            FusedGruLayer {
                input_weight: weight(d_input),
                hidden_weight: weight(hidden),
                input_bias: bias(d_input),
                hidden_bias: bias(hidden),
            }
        };
        FusedGru {
            layers: (0..self.num_layers.max(1))
                .map(|index| layer(if index == 0 { self.d_input } else { hidden }))
                .collect(),
            d_hidden: hidden,
        }
    }
}

impl<B: GruBackend> FusedGru<B> {
    /// Runs the sequence `[batch, time, d_input]` through every layer: the output is every
    /// time step's hidden state of the last layer, `[batch, time, H]`. `state` holds each
    /// layer's initial state, `[num_layers, batch, H]` (zeros if `None`); the returned
    /// state is each layer's final state, same shape.
    pub fn forward(
        &self,
        input: Tensor<B, 3>,
        state: Option<Tensor<B, 3>>,
    ) -> (Tensor<B, 3>, Tensor<B, 3>) {
        let [batch, time, _] = input.dims();
        let hidden = self.d_hidden;
        let device = input.device();
        // Layers after the first read the one before time-major, as its states lie.
        let (mut x, mut time_major) = (input, false);
        let mut finals = Vec::with_capacity(self.layers.len());
        for (index, layer) in self.layers.iter().enumerate() {
            let h0 = match &state {
                Some(state) => state
                    .clone()
                    .slice([index..index + 1, 0..batch, 0..hidden])
                    .reshape([batch, hidden]),
                None => Tensor::zeros([batch, hidden], &device),
            };
            let states = layer.forward(x, time_major, h0);
            finals.push(
                states
                    .clone()
                    .slice([time..time + 1, 0..batch, 0..hidden])
                    .reshape([batch, hidden]),
            );
            x = states.slice([1..time + 1, 0..batch, 0..hidden]);
            time_major = true;
        }
        (x.swap_dims(0, 1), Tensor::stack(finals, 0))
    }
}

impl<B: GruBackend> FusedGruLayer<B> {
    /// The layer's hidden states `[time + 1, batch, H]` from its input, `[batch, time,
    /// d_input]`, or `[time, batch, d_input]` if `time_major`.
    fn forward(&self, x: Tensor<B, 3>, time_major: bool, h0: Tensor<B, 2>) -> Tensor<B, 3> {
        let [d0, d1, d_input] = x.dims();
        let [hidden, three_h] = self.hidden_weight.dims();
        let mut xp = x
            .reshape([d0 * d1, d_input])
            .matmul(self.input_weight.val())
            .reshape([d0, d1, three_h]);
        if let Some(bias) = &self.input_bias {
            xp = xp + bias.val().reshape([1, 1, three_h]);
        }
        // The recurrence takes `[batch, time, 3H]`, whatever its strides.
        if time_major {
            xp = xp.swap_dims(0, 1);
        }
        let bh = match &self.hidden_bias {
            Some(bias) => bias.val(),
            None => Tensor::zeros([three_h], &h0.device()),
        };
        debug_assert_eq!(three_h, 3 * hidden);
        tensor(B::gru_recurrence(
            primitive(xp),
            primitive(self.hidden_weight.val()),
            primitive(bh),
            primitive(h0),
        ))
    }
}
