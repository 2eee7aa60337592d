//! Conversion between [`FusedGru`] and Burn's `nn::Gru`: existing models switch, and
//! switch back, without retraining.

use burn::module::Module;
use burn::nn::activation::Activation;
use burn::nn::{GateController, Gru, GruConfig, GruRecord};
use burn::tensor::backend::Backend;

use crate::nn::gates::{pack, unpack_bias, unpack_weight};
use crate::nn::stacking::{LayerShape, StackMismatch, first_mismatch};

/// Gates the packed tensors hold.
const GATES: usize = 3;

use super::module::{FusedGru, FusedGruLayer};

/// Why an `nn::Gru` (or a stack of them) cannot become a [`FusedGru`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GruConversionError {
    /// The `nn::Gru` uses an option the fused form does not compute.
    #[error("nn::Gru option `{0}` has no FusedGru equivalent")]
    Unsupported(&'static str),
    /// No layers were given.
    #[error("a FusedGru needs at least one layer")]
    NoLayers,
    /// Stacked layers must share the hidden size and feed each other.
    #[error("layer {layer} does not stack on the one before it: {mismatch}")]
    Stacking {
        /// The offending layer's index.
        layer: usize,
        /// What differs.
        #[source]
        mismatch: StackMismatch,
    },
}

/// Gates in `nn::Gru`, in the packed order `[update, reset, new]`.
fn gates<B: Backend>(gru: &Gru<B>) -> [&GateController<B>; 3] {
    [&gru.update_gate, &gru.reset_gate, &gru.new_gate]
}

fn check<B: Backend>(gru: &Gru<B>) -> Result<(), GruConversionError> {
    use GruConversionError::Unsupported;
    if !gru.reset_after {
        return Err(Unsupported("reset_after = false"));
    }
    if gru.clip.is_some() {
        return Err(Unsupported("clip"));
    }
    if !matches!(gru.gate_activation, Activation::Sigmoid(_)) {
        return Err(Unsupported("gate_activation (only sigmoid)"));
    }
    if !matches!(gru.hidden_activation, Activation::Tanh(_)) {
        return Err(Unsupported("hidden_activation (only tanh)"));
    }
    Ok(())
}

impl<B: Backend> FusedGruLayer<B> {
    fn from_gru(gru: &Gru<B>) -> Result<Self, GruConversionError> {
        check(gru)?;
        let (input_weight, input_bias) = pack(&gates(gru).map(|gate| &gate.input_transform));
        let (hidden_weight, hidden_bias) = pack(&gates(gru).map(|gate| &gate.hidden_transform));
        Ok(Self {
            input_weight,
            hidden_weight,
            input_bias,
            hidden_bias,
        })
    }

    fn to_gru(&self) -> Gru<B> {
        let [d_input, three_h] = self.input_weight.dims();
        let device = self.input_weight.device();
        let mut gru =
            GruConfig::new(d_input, three_h / 3, self.input_bias.is_some()).init::<B>(&device);
        let gates = [&mut gru.update_gate, &mut gru.reset_gate, &mut gru.new_gate];
        for (k, gate) in gates.into_iter().enumerate() {
            gate.input_transform.weight = unpack_weight(&self.input_weight, k, GATES);
            gate.input_transform.bias = unpack_bias(&self.input_bias, k, GATES);
            gate.hidden_transform.weight = unpack_weight(&self.hidden_weight, k, GATES);
            gate.hidden_transform.bias = unpack_bias(&self.hidden_bias, k, GATES);
        }
        gru
    }
}

impl<B: Backend> FusedGru<B> {
    /// The same GRU as `gru` (one layer), computing the same function.
    pub fn from_gru(gru: &Gru<B>) -> Result<Self, GruConversionError> {
        Self::from_grus(std::slice::from_ref(gru))
    }

    /// A stack of `nn::Gru`s as one module: each layer's output feeds the next.
    pub fn from_grus(layers: &[Gru<B>]) -> Result<Self, GruConversionError> {
        let first = layers.first().ok_or(GruConversionError::NoLayers)?;
        let shapes: Vec<LayerShape> = layers
            .iter()
            .map(|layer| LayerShape {
                d_input: layer.update_gate.input_transform.weight.dims()[0],
                d_hidden: layer.d_hidden,
                // `nn::Gru` has one layout.
                batch_first: true,
            })
            .collect();
        if let Some((layer, mismatch)) = first_mismatch(&shapes) {
            return Err(GruConversionError::Stacking { layer, mismatch });
        }
        Ok(Self {
            layers: layers
                .iter()
                .map(FusedGruLayer::from_gru)
                .collect::<Result<_, _>>()?,
            d_hidden: first.d_hidden,
        })
    }

    /// Builds the `nn::Gru` of `config`, loads `record` into it, and converts it.
    pub fn from_gru_record(
        config: &GruConfig,
        record: GruRecord<B>,
        device: &B::Device,
    ) -> Result<Self, GruConversionError> {
        Self::from_gru(&config.init::<B>(device).load_record(record))
    }

    /// Every layer as an `nn::Gru` computing the same function.
    pub fn to_grus(&self) -> Vec<Gru<B>> {
        self.layers.iter().map(FusedGruLayer::to_gru).collect()
    }

    /// Every layer's `nn::Gru` record.
    pub fn to_gru_records(&self) -> Vec<GruRecord<B>> {
        self.to_grus()
            .into_iter()
            .map(Module::into_record)
            .collect()
    }
}
