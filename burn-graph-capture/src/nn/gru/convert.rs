//! Conversion between [`FusedGru`] and Burn's `nn::Gru`: existing models switch, and
//! switch back, without retraining.

use burn::module::{Module, Param};
use burn::nn::activation::Activation;
use burn::nn::{GateController, Gru, GruConfig, GruRecord, Linear};
use burn::tensor::{Tensor, backend::Backend};

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
    #[error("layer {layer} does not stack on the one before it: {what}")]
    Stacking {
        /// The offending layer's index.
        layer: usize,
        /// What differs.
        what: String,
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

/// The three gates' weights of one side (`pick` chooses input or hidden transform),
/// packed along the output dimension, and their biases if any.
fn pack<B: Backend>(
    gru: &Gru<B>,
    pick: impl Fn(&GateController<B>) -> &Linear<B>,
) -> (Param<Tensor<B, 2>>, Option<Param<Tensor<B, 1>>>) {
    let linears = gates(gru).map(pick);
    let weight = Tensor::cat(linears.iter().map(|l| l.weight.val()).collect(), 1);
    let biases: Option<Vec<_>> = linears
        .iter()
        .map(|l| l.bias.as_ref().map(Param::val))
        .collect();
    (
        Param::from_tensor(weight.detach()),
        biases.map(|b| Param::from_tensor(Tensor::cat(b, 0).detach())),
    )
}

/// Gate `k`'s block of a packed `[rows, 3H]` weight.
fn unpack_weight<B: Backend>(weight: &Param<Tensor<B, 2>>, k: usize) -> Param<Tensor<B, 2>> {
    let h = weight.dims()[1] / 3;
    Param::from_tensor(weight.val().narrow(1, k * h, h).detach())
}

/// Gate `k`'s block of a packed `[3H]` bias.
fn unpack_bias<B: Backend>(
    bias: &Option<Param<Tensor<B, 1>>>,
    k: usize,
) -> Option<Param<Tensor<B, 1>>> {
    bias.as_ref().map(|b| {
        let h = b.dims()[0] / 3;
        Param::from_tensor(b.val().narrow(0, k * h, h).detach())
    })
}

impl<B: Backend> FusedGruLayer<B> {
    fn from_gru(gru: &Gru<B>) -> Result<Self, GruConversionError> {
        check(gru)?;
        let (input_weight, input_bias) = pack(gru, |gate| &gate.input_transform);
        let (hidden_weight, hidden_bias) = pack(gru, |gate| &gate.hidden_transform);
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
            gate.input_transform.weight = unpack_weight(&self.input_weight, k);
            gate.input_transform.bias = unpack_bias(&self.input_bias, k);
            gate.hidden_transform.weight = unpack_weight(&self.hidden_weight, k);
            gate.hidden_transform.bias = unpack_bias(&self.hidden_bias, k);
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
        for (index, pair) in layers.windows(2).enumerate() {
            let [below, above] = pair else { unreachable!() };
            let [d_input, _] = above.update_gate.input_transform.weight.dims();
            let what = if above.d_hidden != first.d_hidden {
                Some(format!(
                    "hidden size {} instead of {}",
                    above.d_hidden, first.d_hidden
                ))
            } else if d_input != below.d_hidden {
                Some(format!(
                    "takes {d_input} inputs, the layer below outputs {}",
                    below.d_hidden
                ))
            } else {
                None
            };
            if let Some(what) = what {
                return Err(GruConversionError::Stacking {
                    layer: index + 1,
                    what,
                });
            }
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
