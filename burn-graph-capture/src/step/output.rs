//! What a step closure returns, and the copies of it that the trainer hands back.
//!
//! A replay does not run the closure: its outputs are the graph's own buffers, which the
//! next replay overwrites. The trainer therefore returns [`owned_copy`]s, never those
//! buffers, and needs to know every tensor an output holds: [`StepOutput::Item`] is a
//! [`StepInput`], whose tensors can be listed and replaced.

use std::collections::HashSet;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::error::StepError;
use super::input::StepInput;
use crate::backend::{AllocationId, AnyTensor, GraphBackend};

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

/// `item` with every tensor that reads one of the model's parameter buffers copied:
/// eagerly the item keeps the parameter as it was before the update, but a replay
/// writes the update into that same (pinned) buffer, so the item must not be it.
/// Called between the closure and the optimizer, in eager and recorded steps alike.
pub(crate) fn unaliased<B, M, T>(item: T, model: &M) -> T
where
    B: AutodiffBackend<InnerBackend: GraphBackend>,
    M: AutodiffModule<B>,
    T: StepInput<B>,
{
    let tensors = item.tensors();
    let ids: Vec<_> = tensors.iter().map(AnyTensor::allocation_id).collect();
    if ids.iter().all(Option::is_none) {
        return item;
    }
    let params = parameter_allocations(model);
    if !ids.iter().flatten().any(|id| params.contains(id)) {
        return item;
    }
    let copies: Vec<_> = tensors
        .into_iter()
        .zip(ids)
        .map(|(tensor, id)| match id {
            Some(id) if params.contains(&id) => tensor.fresh_copy(),
            _ => tensor,
        })
        .collect();
    item.with_tensors(&mut copies.into_iter())
}

/// The allocations of the model's float parameters.
fn parameter_allocations<B, M>(model: &M) -> HashSet<AllocationId>
where
    B: AutodiffBackend<InnerBackend: GraphBackend>,
    M: AutodiffModule<B>,
{
    struct Collect(HashSet<AllocationId>);
    impl<B: AutodiffBackend<InnerBackend: GraphBackend>> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let tensor =
                AnyTensor::<B::InnerBackend>::Float(param.val().inner().into_primitive().tensor());
            self.0.extend(tensor.allocation_id());
        }
    }
    let mut collect = Collect(HashSet::new());
    model.visit(&mut collect);
    collect.0
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

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::backend::Flex;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::Tensor;

    use super::unaliased;
    use crate::backend::{AnyTensor, TrainBackend};

    type B = TrainBackend<Flex>;

    fn id(tensor: &Tensor<B, 2>) -> crate::backend::AllocationId {
        let inner = tensor.clone().inner().into_primitive().tensor();
        AnyTensor::<crate::backend::GraphCapture<Flex>>::Float(inner)
            .allocation_id()
            .unwrap()
    }

    #[test]
    fn an_item_that_reads_a_parameter_is_copied_and_others_are_not() {
        let device = Default::default();
        let model: Linear<B> = LinearConfig::new(3, 2).init(&device);
        let weight = model.weight.val();
        let other = Tensor::<B, 2>::ones([3, 2], &device);
        let item = (weight.clone(), other.clone());
        let (copied, kept) = unaliased(item, &model);
        assert_ne!(id(&copied), id(&weight), "a parameter's buffer is copied");
        assert_eq!(copied.to_data(), weight.to_data(), "with its values");
        assert_eq!(id(&kept), id(&other), "other tensors stay as they are");
        let (untouched, _) = unaliased((other.clone(), other.clone()), &model);
        assert_eq!(id(&untouched), id(&other));
    }
}
