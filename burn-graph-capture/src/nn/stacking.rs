//! Whether recurrent layers stack: what `FusedLstm::from_lstms` and `FusedGru::from_grus`
//! check before they pack a stack into one module.

/// How a layer of a stack does not fit the ones before it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StackMismatch {
    /// Every layer of a fused stack has the first layer's hidden size.
    #[error("hidden size {found} instead of {expected}")]
    HiddenSize {
        /// This layer's hidden size.
        found: usize,
        /// The first layer's.
        expected: usize,
    },
    /// Every layer of a fused stack has the first layer's layout (`batch_first`).
    #[error("batch_first differs")]
    BatchFirst,
    /// A layer's input is the output of the layer below it.
    #[error("takes {takes} inputs, the layer below outputs {below}")]
    InputSize {
        /// This layer's input size.
        takes: usize,
        /// The layer below's hidden size.
        below: usize,
    },
}

/// The sizes of a layer that stacking compares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerShape {
    pub(crate) d_input: usize,
    pub(crate) d_hidden: usize,
    pub(crate) batch_first: bool,
}

/// The first layer (by index) that does not stack on the ones before it, and how.
pub(crate) fn first_mismatch(layers: &[LayerShape]) -> Option<(usize, StackMismatch)> {
    let first = layers.first()?;
    layers.windows(2).enumerate().find_map(|(index, pair)| {
        let [below, above] = pair else { unreachable!() };
        let mismatch = if above.d_hidden != first.d_hidden {
            StackMismatch::HiddenSize {
                found: above.d_hidden,
                expected: first.d_hidden,
            }
        } else if above.batch_first != first.batch_first {
            StackMismatch::BatchFirst
        } else if above.d_input != below.d_hidden {
            StackMismatch::InputSize {
                takes: above.d_input,
                below: below.d_hidden,
            }
        } else {
            return None;
        };
        Some((index + 1, mismatch))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(d_input: usize, d_hidden: usize) -> LayerShape {
        LayerShape {
            d_input,
            d_hidden,
            batch_first: true,
        }
    }

    #[test]
    fn a_stack_fits_when_each_layer_takes_the_hidden_size_below() {
        assert_eq!(
            first_mismatch(&[layer(7, 16), layer(16, 16), layer(16, 16)]),
            None
        );
        assert_eq!(first_mismatch(&[]), None);
    }

    #[test]
    fn the_first_misfit_is_named_with_its_index() {
        assert_eq!(
            first_mismatch(&[layer(7, 16), layer(16, 16), layer(16, 8)]),
            Some((
                2,
                StackMismatch::HiddenSize {
                    found: 8,
                    expected: 16
                }
            ))
        );
        assert_eq!(
            first_mismatch(&[layer(7, 16), layer(12, 16)]),
            Some((
                1,
                StackMismatch::InputSize {
                    takes: 12,
                    below: 16
                }
            ))
        );
        let mut other_layout = layer(16, 16);
        other_layout.batch_first = false;
        assert_eq!(
            first_mismatch(&[layer(7, 16), other_layout]),
            Some((1, StackMismatch::BatchFirst))
        );
    }
}
