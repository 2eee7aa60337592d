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

use super::ranks::Rank;
use crate::backend::GraphBackend;
use crate::cause::Cause;
use crate::optim::CapturableOptimizer;
use crate::parallel::{Collectives, Disagreement, DistError, RankLink};
use crate::step::error::StepError;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Replaces every gradient in `grads` by its mean over the ranks of `rank`'s group.
pub(crate) fn average_gradients<B, M>(
    model: &M,
    grads: &mut GradientsParams,
    rank: &Rank<Inner<B>>,
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
    let reduced = rank.all_reduce_mean(tensors)?;
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
    member: &RankLink,
) -> Result<M, DistError>
where
    B: AutodiffBackend<InnerBackend: GraphBackend + Collectives>,
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
    let mut received = <Inner<B> as Collectives>::broadcast(all, 0, member)?.into_iter();
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

/// `model` with rank 0's parameter ids, once every rank has shown the same parameter
/// shapes in the same order. Optimizers key their state by parameter id, so ranks must
/// agree on ids for rank 0's state to land on the same parameters everywhere (models
/// built on each rank draw ids of their own; models loaded from one record share them).
pub(crate) fn same_structure_as_rank_zero<B, M>(model: M, member: &RankLink) -> Result<M, StepError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    let mut params = Structure::default();
    model.visit(&mut params);
    let payload = serde_json::to_vec(&params.0).expect("ids and shapes serialize");
    let all = member
        .all_gather(payload)
        .map_err(StepError::DataParallel)?;
    let fail = |how| StepError::DataParallel(member.fail(DistError::Mismatch(how)));
    let all = all
        .iter()
        .enumerate()
        .map(|(rank, bytes)| {
            serde_json::from_slice::<Vec<ParamShape>>(bytes).map_err(|err| {
                fail(Disagreement::UnreadableParameters {
                    rank,
                    cause: Cause::new(err),
                })
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let shapes =
        |params: &[(u64, Vec<usize>)]| params.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>();
    if let Some(rank) = all
        .iter()
        .position(|theirs| shapes(theirs) != shapes(&all[0]))
    {
        return Err(fail(Disagreement::ParameterShapes { rank }));
    }
    let ids = all[0]
        .iter()
        .map(|(id, _)| ParamId::from(*id))
        .collect::<Vec<_>>();
    Ok(model.map(&mut Rekey {
        ids: ids.into_iter(),
    }))
}

/// A parameter's id and shape.
type ParamShape = (u64, Vec<usize>);

/// Parameter ids and shapes in visit order.
#[derive(Default)]
struct Structure(Vec<ParamShape>);

impl<B: AutodiffBackend> ModuleVisitor<B> for Structure {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push((param.id.val(), param.val().dims().to_vec()));
    }
}

/// Gives each parameter, in visit order, the next id.
struct Rekey<I> {
    ids: I,
}

impl<B: AutodiffBackend, I: Iterator<Item = ParamId>> ModuleMapper<B> for Rekey<I> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(self.ids.next().unwrap_or(id), tensor, mapper)
    }
}
