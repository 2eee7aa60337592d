//! Conversion between [`FusedLstm`] and Burn's `nn::Lstm`: existing models switch, and
//! switch back, without retraining.

use burn::module::Module;
use burn::nn::activation::Activation;
use burn::nn::{Lstm, LstmConfig, LstmRecord};
use burn::tensor::backend::Backend;

use crate::nn::gates::{pack, unpack_bias, unpack_weight};
use crate::nn::stacking::{LayerShape, StackMismatch, first_mismatch};

/// Gates the packed tensors hold.
const GATES: usize = 4;

use super::module::{FusedLstm, FusedLstmLayer};

/// Why an `nn::Lstm` (or a stack of them) cannot become a [`FusedLstm`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LstmConversionError {
    /// The `nn::Lstm` uses an option the fused form does not compute.
    #[error("nn::Lstm option `{0}` has no FusedLstm equivalent")]
    Unsupported(&'static str),
    /// No layers were given.
    #[error("a FusedLstm needs at least one layer")]
    NoLayers,
    /// Stacked layers must share hidden size and layout, and feed each other.
    #[error("layer {layer} does not stack on the one before it: {mismatch}")]
    Stacking {
        /// The offending layer's index.
        layer: usize,
        /// What differs.
        #[source]
        mismatch: StackMismatch,
    },
}

/// Gates in `nn::Lstm`, in the packed order `[input, forget, cell, output]`.
fn gates<B: Backend>(lstm: &Lstm<B>) -> [&burn::nn::GateController<B>; 4] {
    [
        &lstm.input_gate,
        &lstm.forget_gate,
        &lstm.cell_gate,
        &lstm.output_gate,
    ]
}

fn check<B: Backend>(lstm: &Lstm<B>) -> Result<(), LstmConversionError> {
    use LstmConversionError::Unsupported;
    if lstm.reverse {
        return Err(Unsupported("reverse"));
    }
    if lstm.clip.is_some() {
        return Err(Unsupported("clip"));
    }
    if lstm.input_forget {
        return Err(Unsupported("input_forget"));
    }
    if !matches!(lstm.gate_activation, Activation::Sigmoid(_)) {
        return Err(Unsupported("gate_activation (only sigmoid)"));
    }
    if !matches!(lstm.cell_activation, Activation::Tanh(_)) {
        return Err(Unsupported("cell_activation (only tanh)"));
    }
    if !matches!(lstm.hidden_activation, Activation::Tanh(_)) {
        return Err(Unsupported("hidden_activation (only tanh)"));
    }
    Ok(())
}

impl<B: Backend> FusedLstmLayer<B> {
    fn from_lstm(lstm: &Lstm<B>) -> Result<Self, LstmConversionError> {
        check(lstm)?;
        let (input_weight, input_bias) = pack(&gates(lstm).map(|gate| &gate.input_transform));
        let (hidden_weight, hidden_bias) = pack(&gates(lstm).map(|gate| &gate.hidden_transform));
        Ok(Self {
            input_weight,
            hidden_weight,
            input_bias,
            hidden_bias,
        })
    }

    fn to_lstm(&self, batch_first: bool) -> Lstm<B> {
        let [d_input, four_h] = self.input_weight.dims();
        let device = self.input_weight.device();
        let config = LstmConfig::new(d_input, four_h / 4, self.input_bias.is_some())
            .with_batch_first(batch_first);
        let mut lstm = config.init::<B>(&device);
        let gates = [
            &mut lstm.input_gate,
            &mut lstm.forget_gate,
            &mut lstm.cell_gate,
            &mut lstm.output_gate,
        ];
        for (k, gate) in gates.into_iter().enumerate() {
            gate.input_transform.weight = unpack_weight(&self.input_weight, k, GATES);
            gate.input_transform.bias = unpack_bias(&self.input_bias, k, GATES);
            gate.hidden_transform.weight = unpack_weight(&self.hidden_weight, k, GATES);
            gate.hidden_transform.bias = unpack_bias(&self.hidden_bias, k, GATES);
        }
        lstm
    }
}

impl<B: Backend> FusedLstm<B> {
    /// The same LSTM as `lstm` (one layer), computing the same function.
    pub fn from_lstm(lstm: &Lstm<B>) -> Result<Self, LstmConversionError> {
        Self::from_lstms(std::slice::from_ref(lstm))
    }

    /// A stack of `nn::Lstm`s as one module: each layer's output feeds the next.
    pub fn from_lstms(layers: &[Lstm<B>]) -> Result<Self, LstmConversionError> {
        let first = layers.first().ok_or(LstmConversionError::NoLayers)?;
        let shapes: Vec<LayerShape> = layers
            .iter()
            .map(|layer| LayerShape {
                d_input: layer.input_gate.input_transform.weight.dims()[0],
                d_hidden: layer.d_hidden,
                batch_first: layer.batch_first,
            })
            .collect();
        if let Some((layer, mismatch)) = first_mismatch(&shapes) {
            return Err(LstmConversionError::Stacking { layer, mismatch });
        }
        Ok(Self {
            layers: layers
                .iter()
                .map(FusedLstmLayer::from_lstm)
                .collect::<Result<_, _>>()?,
            d_hidden: first.d_hidden,
            batch_first: first.batch_first,
        })
    }

    /// Builds the `nn::Lstm` of `config`, loads `record` into it, and converts it.
    pub fn from_lstm_record(
        config: &LstmConfig,
        record: LstmRecord<B>,
        device: &B::Device,
    ) -> Result<Self, LstmConversionError> {
        Self::from_lstm(&config.init::<B>(device).load_record(record))
    }

    /// Every layer as an `nn::Lstm` computing the same function.
    pub fn to_lstms(&self) -> Vec<Lstm<B>> {
        self.layers
            .iter()
            .map(|layer| layer.to_lstm(self.batch_first))
            .collect()
    }

    /// Every layer's `nn::Lstm` record.
    pub fn to_lstm_records(&self) -> Vec<LstmRecord<B>> {
        self.to_lstms()
            .into_iter()
            .map(Module::into_record)
            .collect()
    }
}
