//! What a step closure returns, and the copies of it that the trainer hands back.
//!
//! A replay does not run the closure: its outputs are the graph's own buffers, which the
//! next replay overwrites. The trainer therefore returns [`owned_copy`]s, never those
//! buffers, and needs to know every tensor an output holds: [`StepOutput::Item`] is a
//! [`StepInput`], whose tensors can be listed and replaced.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::error::StepError;
use super::input::StepInput;
use crate::backend::AnyTensor;

/// What a training step's closure returns: a loss for the trainer to differentiate, or
/// (feature `train`) burn-train's `TrainOutput`, whose gradients the user's `TrainStep`
/// computed.
pub trait StepOutput<B: AutodiffBackend>: Sized {
    /// What the caller gets back for the step, detached, in buffers of its own.
    type Item: StepInput<B>;

    /// The gradients for the optimizer and the item. `model` is the model the closure
    /// ran on. Refuses an output the step cannot use (a loss that is not a scalar).
    fn into_update<M: AutodiffModule<B>>(
        self,
        model: &M,
    ) -> Result<(GradientsParams, Self::Item), StepError>;
}

/// A scalar loss: the trainer runs backward on it and returns it.
impl<B: AutodiffBackend> StepOutput<B> for Tensor<B, 1> {
    type Item = Tensor<B, 1>;

    fn into_update<M: AutodiffModule<B>>(
        self,
        model: &M,
    ) -> Result<(GradientsParams, Self::Item), StepError> {
        let [elements] = self.dims();
        if elements != 1 {
            return Err(StepError::NonScalarLoss {
                shape: vec![elements],
            });
        }
        let grads = GradientsParams::from_grads(self.backward(), model);
        Ok((grads, self))
    }
}

/// `item` detached from the autodiff graph, each of its tensors replaced by `f`'s.
pub(crate) fn map_tensors<B: AutodiffBackend, T: StepInput<B>>(
    item: &T,
    f: impl FnMut(AnyTensor<B::InnerBackend>) -> AnyTensor<B::InnerBackend>,
) -> T {
    let mapped: Vec<_> = item.tensors().into_iter().map(f).collect();
    item.with_tensors(&mut mapped.into_iter())
}

/// `item` detached from the autodiff graph, on the same buffers.
pub(crate) fn detached<B: AutodiffBackend, T: StepInput<B>>(item: &T) -> T {
    map_tensors(item, |tensor| tensor)
}

/// `item` detached, with every tensor copied into a fresh buffer: what the caller owns
/// after a graph step, whatever later replays write.
pub(crate) fn owned_copy<B: AutodiffBackend, T: StepInput<B>>(item: &T) -> T {
    map_tensors(item, AnyTensor::fresh_copy)
}
