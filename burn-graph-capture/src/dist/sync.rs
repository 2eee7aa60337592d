//! A data-parallel step's collectives over a model: its gradients averaged over the
//! ranks (in every step, between backward and the optimizer), and the starting state,
//! rank 0's, broadcast when a trainer joins its group.
//!
//! Tensors go in the order the module visits its parameters: the same on every rank,
//! since every rank trains the same model structure. A parameter without a gradient
//! (frozen, unused) is skipped on every rank alike.

use std::collections::BTreeMap;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::error::DistError;
use super::group::RankMember;
use crate::backend::GraphBackend;
use crate::optim::CapturableOptimizer;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Replaces every gradient in `grads` by its mean over the ranks of `member`'s group.
pub(crate) fn average_gradients<B, M>(
    model: &M,
    grads: &mut GradientsParams,
    member: &RankMember,
) -> Result<(), DistError>
where
    B: AutodiffBackend<InnerBackend: GraphBackend>,
    M: AutodiffModule<B>,
{
    let mut taken = TakeGrads::<B> {
        grads,
        taken: Vec::new(),
    };
    model.visit(&mut taken);
    let (ids, tensors): (Vec<ParamId>, Vec<FloatTensor<Inner<B>>>) =
        taken.taken.into_iter().unzip();
    let reduced = <Inner<B> as GraphBackend>::all_reduce_mean(tensors, member)?;
    let mut back = PutGrads::<B> {
        grads,
        reduced: ids.into_iter().zip(reduced).collect(),
    };
    model.visit(&mut back);
    Ok(())
}

/// Takes every parameter's gradient out of `grads`, in visit order (a tied parameter
/// once: its second visit finds the gradient taken).
struct TakeGrads<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    taken: Vec<(ParamId, FloatTensor<Inner<B>>)>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for TakeGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.remove::<Inner<B>, D>(param.id) {
            self.taken.push((param.id, grad.into_primitive().tensor()));
        }
    }
}

/// Puts the averaged gradients back, each with its parameter's rank.
struct PutGrads<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    reduced: BTreeMap<ParamId, FloatTensor<Inner<B>>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for PutGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.reduced.remove(&param.id) {
            let grad = Tensor::<Inner<B>, D>::from_primitive(TensorPrimitive::Float(grad));
            self.grads.register::<Inner<B>, D>(param.id, grad);
        }
    }
}

/// `model` and `optimizer`'s state as rank 0 holds them, on every rank: parameters (and
/// every float tensor the module maps, running statistics included), the learning rate,
/// the step count and per-parameter state.
pub(crate) fn broadcast_start<B, M, O>(
    model: M,
    optimizer: &mut O,
    member: &RankMember,
) -> Result<M, DistError>
where
    B: AutodiffBackend<InnerBackend: GraphBackend>,
    M: AutodiffModule<B>,
    O: CapturableOptimizer<M, B>,
{
    let mut params = CollectParams::<B> { values: Vec::new() };
    model.visit(&mut params);
    let mut state = Vec::new();
    optimizer.visit_state(&mut |_, tensor| {
        state.push(tensor.clone().into_primitive().tensor());
    });
    let count = params.values.len();
    let mut all = params.values;
    all.extend(state);
    let mut received = <Inner<B> as GraphBackend>::broadcast(all, 0, member)?.into_iter();
    let params: Vec<_> = received.by_ref().take(count).collect();
    let model = model.map(&mut SetParams {
        values: params.into_iter(),
    });
    optimizer.visit_state(&mut |_, tensor| {
        if let Some(value) = received.next() {
            *tensor = Tensor::from_primitive(TensorPrimitive::Float(value));
        }
    });
    Ok(model)
}

struct CollectParams<B: AutodiffBackend> {
    values: Vec<FloatTensor<Inner<B>>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for CollectParams<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.values
            .push(param.val().inner().into_primitive().tensor());
    }
}

/// Seats each parameter on the next received value, keeping its id and whether it
/// requires gradients.
struct SetParams<I> {
    values: I,
}

impl<B, I> ModuleMapper<B> for SetParams<I>
where
    B: AutodiffBackend,
    I: Iterator<Item = FloatTensor<Inner<B>>>,
{
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(value) = self.values.next() else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let inner = Tensor::<Inner<B>, D>::from_primitive(TensorPrimitive::Float(value));
        let mut seated = Tensor::<B, D>::from_inner(inner);
        if tensor.is_require_grad() {
            seated = seated.require_grad();
        }
        Param::from_mapped_value(id, seated, mapper)
    }
}
