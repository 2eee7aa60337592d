//! The module and its configuration.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Initializer, LstmState};
use burn::tensor::{Tensor, TensorPrimitive, backend::Backend};

use super::backend::LstmBackend;
use crate::nn::gates::{init_bias, init_weight};

/// Configuration of a [`FusedLstm`]: `nn::LstmConfig`'s options, plus stacking.
#[derive(Config, Debug)]
pub struct FusedLstmConfig {
    /// Input features per time step.
    pub d_input: usize,
    /// Hidden size of every layer.
    pub d_hidden: usize,
    /// Whether the gates have biases (an input and a hidden bias, as `nn::Lstm`).
    pub bias: bool,
    /// Initializer of weights and biases, applied per gate as `nn::Lstm` does.
    #[config(default = "Initializer::XavierNormal{gain:1.0}")]
    pub initializer: Initializer,
    /// `[batch, time, features]` if true, `[time, batch, features]` if false.
    #[config(default = true)]
    pub batch_first: bool,
    /// Stacked layers: each layer's hidden sequence is the next one's input.
    #[config(default = 1)]
    pub num_layers: usize,
}

/// One layer's parameters, gates packed `[input, forget, cell, output]`.
#[derive(Module, Debug)]
pub struct FusedLstmLayer<B: Backend> {
    /// `[d_input, 4H]`.
    pub input_weight: Param<Tensor<B, 2>>,
    /// `[H, 4H]`.
    pub hidden_weight: Param<Tensor<B, 2>>,
    /// `[4H]`, added to the input projection.
    pub input_bias: Option<Param<Tensor<B, 1>>>,
    /// `[4H]`, added to the recurrent projection.
    pub hidden_bias: Option<Param<Tensor<B, 1>>>,
}

/// An LSTM (one or more stacked layers) whose step is a few large ops: see the module
/// docs of [`lstm`](super).
#[derive(Module, Debug)]
pub struct FusedLstm<B: Backend> {
    /// The layers, input side first.
    pub layers: Vec<FusedLstmLayer<B>>,
    /// Hidden size.
    pub d_hidden: usize,
    /// Whether inputs and outputs are `[batch, time, features]`.
    pub batch_first: bool,
}

impl FusedLstmConfig {
    /// Builds the module with fresh weights.
    pub fn init<B: Backend>(&self, device: &B::Device) -> FusedLstm<B> {
        let hidden = self.d_hidden;
        let layer = |d_input: usize| {
            // Per gate, as `nn::Lstm`'s `Linear`s draw them (fan-in, fan-out of one gate).
            let weight = |rows| init_weight(&self.initializer, rows, hidden, 4, device);
            let bias = |rows| {
                self.bias
                    .then(|| init_bias(&self.initializer, rows, hidden, 4, device))
            };
            FusedLstmLayer {
                input_weight: weight(d_input),
                hidden_weight: weight(hidden),
                input_bias: bias(d_input),
                hidden_bias: bias(hidden),
            }
        };
        let layers = (0..self.num_layers.max(1))
            .map(|index| layer(if index == 0 { self.d_input } else { hidden }))
            .collect();
        FusedLstm {
            layers,
            d_hidden: hidden,
            batch_first: self.batch_first,
        }
    }
}

impl<B: LstmBackend> FusedLstm<B> {
    /// Runs the sequence through every layer.
    ///
    /// `input` is `[batch, time, d_input]` (or `[time, batch, d_input]` when not batch
    /// first); the output is every time step's hidden state of the last layer, in the
    /// same layout. `state` holds each layer's initial state, `[num_layers, batch, H]`
    /// (zeros if `None`); the returned state is each layer's final state, same shape.
    pub fn forward(
        &self,
        input: Tensor<B, 3>,
        state: Option<LstmState<B, 3>>,
    ) -> (Tensor<B, 3>, LstmState<B, 3>) {
        // Layers after the first read the one before time-major, as its states lie.
        let (mut x, mut time_major) = (input, !self.batch_first);
        let [d0, d1, _] = x.dims();
        let (batch, time) = if time_major { (d1, d0) } else { (d0, d1) };
        let hidden = self.d_hidden;
        let device = x.device();
        let (mut cells, mut hiddens) = (Vec::new(), Vec::new());
        for (index, layer) in self.layers.iter().enumerate() {
            let (h0, c0) = match &state {
                Some(state) => (
                    layer_state(&state.hidden, index),
                    layer_state(&state.cell, index),
                ),
                None => (
                    Tensor::zeros([batch, hidden], &device),
                    Tensor::zeros([batch, hidden], &device),
                ),
            };
            // The packed states `[2, time + 1, batch, H]` as rows `[2 (time + 1) batch, H]`:
            // each block read below is then a packed row slice, which reshapes without the
            // copy that burn's reshape makes of a 4-d slice.
            let rows = layer
                .forward(x, time_major, h0, c0)
                .reshape([2 * (time + 1) * batch, hidden]);
            let last = |kind: usize| {
                let start = (kind * (time + 1) + time) * batch;
                rows.clone().slice([start..start + batch, 0..hidden])
            };
            hiddens.push(last(0));
            cells.push(last(1));
            x = rows
                .slice([batch..(time + 1) * batch, 0..hidden])
                .reshape([time, batch, hidden]);
            time_major = true;
        }
        let output = if self.batch_first {
            x.swap_dims(0, 1)
        } else {
            x
        };
        let state = LstmState::new(Tensor::stack(cells, 0), Tensor::stack(hiddens, 0));
        (output, state)
    }
}

/// Layer `index` of a `[num_layers, batch, H]` state.
fn layer_state<B: Backend>(state: &Tensor<B, 3>, index: usize) -> Tensor<B, 2> {
    let [_, batch, hidden] = state.dims();
    state
        .clone()
        .slice([index..index + 1, 0..batch, 0..hidden])
        .reshape([batch, hidden])
}

impl<B: LstmBackend> FusedLstmLayer<B> {
    /// The layer's states `[2, time + 1, batch, H]` (see [`LstmBackend`]) from its input,
    /// `[batch, time, d_input]`, or `[time, batch, d_input]` if `time_major`.
    fn forward(
        &self,
        x: Tensor<B, 3>,
        time_major: bool,
        h0: Tensor<B, 2>,
        c0: Tensor<B, 2>,
    ) -> Tensor<B, 4> {
        // The projection is computed time-major, `[time, batch, 4H]`: the recurrence's
        // input gradient (its gate gradients, time-major) then reaches the input
        // weight's GEMM packed, where a batch-major projection had it copied whole.
        let x = if time_major { x } else { x.swap_dims(0, 1) };
        let [time, batch, d_input] = x.dims();
        let [_, four_h] = self.input_weight.dims();
        let mut xp = x
            .reshape([time * batch, d_input])
            .matmul(self.input_weight.val())
            .reshape([time, batch, four_h]);
        // Both biases add to every step's gates: added together first, their gradient is
        // one sum over time and batch.
        let bias = match (&self.input_bias, &self.hidden_bias) {
            (Some(input), Some(hidden)) => Some(input.val() + hidden.val()),
            (Some(one), None) | (None, Some(one)) => Some(one.val()),
            (None, None) => None,
        };
        if let Some(bias) = bias {
            xp = xp + bias.reshape([1, 1, four_h]);
        }
        // The recurrence takes `[batch, time, 4H]`, whatever its strides.
        let xp = xp.swap_dims(0, 1);
        let states = B::lstm_recurrence(
            xp.into_primitive().tensor(),
            self.hidden_weight.val().into_primitive().tensor(),
            h0.into_primitive().tensor(),
            c0.into_primitive().tensor(),
        );
        Tensor::from_primitive(TensorPrimitive::Float(states))
    }
}
