//! The decorator as a backend for the step API: `GraphCapture<B>` has `B`'s graphs,
//! pins, matmul routing, draws and collectives (each collective recorded as one op of
//! the session), and its primitives are `B`'s.

use burn::tensor::Distribution;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_backend::{DType, FloatDType, Shape, StreamId};

use super::base::GraphCapture;
use super::emulated::program;
use super::error::GraphError;
use super::graph_backend::{BufferId, Captured, GraphBackend};
use super::holder::Holder;
use super::primitive::AnyTensor;
use super::routed_matmul::RoutedMatmul;
use super::session;
use super::trace;
use crate::parallel::{Collectives, DistError, RankLink};
use crate::rng::RandomDraws;

/// The decorator exposes its inner backend's graph support unchanged.
impl<B: GraphBackend> GraphBackend for GraphCapture<B> {
    type Graph = B::Graph;

    fn supports_hardware_graphs(device: &Self::Device) -> bool {
        B::supports_hardware_graphs(device)
    }

    fn capture<R>(device: &Self::Device, step: impl FnOnce() -> R) -> Captured<R, Self::Graph> {
        B::capture(device, step)
    }

    fn rehearse<R>(device: &Self::Device, step: impl FnOnce() -> R) -> R {
        B::rehearse(device, step)
    }

    fn isolate<R>(device: &Self::Device, step: impl FnOnce() -> R) -> R {
        B::isolate(device, step)
    }

    fn replay(graph: &Self::Graph) -> Result<(), GraphError> {
        B::replay(graph)
    }

    fn traces_run_again() -> bool {
        B::traces_run_again()
    }

    fn hand_over(tensor: AnyTensor<Self>, caller: StreamId) -> AnyTensor<Self> {
        AnyTensor::from_inner(B::hand_over(tensor.into_inner(), caller))
    }

    fn pin(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        B::pin(tensor.into_inner()).map(AnyTensor::from_inner)
    }

    fn pin_input(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        B::pin_input(tensor.into_inner()).map(AnyTensor::from_inner)
    }

    fn copy_into(dst: &AnyTensor<Self>, src: &AnyTensor<Self>) -> Result<(), GraphError> {
        B::copy_into(&dst.clone().into_inner(), &src.clone().into_inner())
    }

    fn duplicate(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        B::duplicate(tensor.into_inner()).map(AnyTensor::from_inner)
    }

    fn buffer_id(tensor: &AnyTensor<Self>) -> Option<BufferId> {
        B::buffer_id(&tensor.clone().into_inner())
    }

    fn holder(tensor: &AnyTensor<Self>) -> Option<Holder> {
        B::holder(&tensor.clone().into_inner())
    }
}

impl<B: GraphBackend> RoutedMatmul for GraphCapture<B> {
    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        B::matmul(lhs, rhs)
    }

    fn routes_matmul(dtype: DType) -> bool {
        B::routes_matmul(dtype)
    }
}

impl<B: GraphBackend> RandomDraws for GraphCapture<B> {
    fn draws_random(shape: &Shape, dtype: FloatDType) -> bool {
        B::draws_random(shape, dtype)
    }

    fn random(
        state: &IntTensor<Self>,
        draw: u32,
        shape: Shape,
        distribution: Distribution,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        B::random(state, draw, shape, distribution, dtype)
    }

    fn advance_random(state: IntTensor<Self>, draws: u32) -> IntTensor<Self> {
        B::advance_random(state, draws)
    }
}

impl<B: GraphBackend + Collectives> Collectives for GraphCapture<B> {
    fn join_group(device: &Self::Device, member: &RankLink) -> Result<(), DistError> {
        B::join_group(device, member)
    }

    /// `B`'s, as one op of the step: the step's graph holds it.
    fn all_reduce_mean(
        tensors: Vec<FloatTensor<Self>>,
        member: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError> {
        collective::<B>("all_reduce_mean", tensors, member, 0, B::all_reduce_mean)
    }

    fn broadcast(
        tensors: Vec<FloatTensor<Self>>,
        root: usize,
        member: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError> {
        collective::<B>(
            "broadcast",
            tensors,
            member,
            root,
            move |tensors, member| B::broadcast(tensors, root, member),
        )
    }
}

/// A collective of `B` as one op of the step: recorded into the open sessions (its group
/// and root are attributes: a step on another group is another step), matched by a
/// trace like any op (a matched collective runs nowhere: the graph that launches holds
/// it), and an emulated graph's step that runs it again at replay, when every rank
/// replays its own.
fn collective<B: GraphBackend>(
    op: &'static str,
    tensors: Vec<FloatTensor<B>>,
    member: &RankLink,
    root: usize,
    run: impl Fn(Vec<FloatTensor<B>>, &RankLink) -> Result<Vec<FloatTensor<B>>, DistError>
    + Send
    + Sync
    + 'static,
) -> Result<Vec<FloatTensor<B>>, DistError> {
    // Inputs are recorded before the call, which consumes them.
    let recorder = session::is_recording().then(|| {
        let mut rec = trace::recorder();
        tensors.iter().for_each(|t| rec.tensor(t));
        rec.attr(&(member.group_id(), member.world(), root));
        let kept = program::recording().then(|| {
            tensors
                .iter()
                .map(|t| program::input(op, t))
                .collect::<Vec<_>>()
        });
        (rec, kept)
    });
    if let Some((rec, _)) = &recorder
        && trace::active()
    {
        let keys: trace::Inputs<'_> = tensors.iter().map(trace::input).collect();
        let handed = trace::matched(op, rec, None, &keys, |stand_ins| {
            (0..stand_ins.len())
                .map(|index| trace::hand_out(stand_ins, index))
                .collect::<Vec<FloatTensor<B>>>()
        });
        if let Some(outputs) = handed {
            if trace::observing() {
                let mut rec = rec.clone();
                outputs.iter().for_each(|t| rec.output(t));
                rec.commit(op, None);
            }
            return Ok(outputs);
        }
    }
    let outputs = run(tensors, member)?;
    if let Some((mut rec, kept)) = recorder {
        outputs.iter().for_each(|t| rec.output(t));
        if let Some(kept) = kept {
            let slots: Vec<_> = outputs.iter().map(|t| program::output(op, t)).collect();
            let link = member.clone();
            let replay: program::Thunk = Box::new(move |env| {
                let inputs = kept
                    .iter()
                    .map(|slot| env.take(slot))
                    .collect::<Result<Vec<FloatTensor<B>>, _>>()?;
                // A failed collective has failed the group: every rank's next step says so.
                let outputs = run(inputs, &link).map_err(|_| program::Missing {
                    op,
                    what: "group to reduce with (the collective failed)",
                })?;
                slots
                    .iter()
                    .zip(outputs)
                    .for_each(|(slot, output)| env.bind(slot, output));
                Ok(())
            });
            let stand_ins = outputs
                .iter()
                .map(program::StandInValue::of)
                .collect::<Option<Vec<_>>>();
            program::push_traced(op, replay, rec.op_record(op), true, stand_ins);
        }
        rec.commit(op, None);
    }
    Ok(outputs)
}

/// The decorator reuses its inner backend's primitives: relabelling moves, never copies.
impl<B: GraphBackend> AnyTensor<GraphCapture<B>> {
    /// The same primitive, typed as the inner backend's.
    pub fn into_inner(self) -> AnyTensor<B> {
        match self {
            AnyTensor::Float(t) => AnyTensor::Float(t),
            AnyTensor::Int(t) => AnyTensor::Int(t),
            AnyTensor::Bool(t) => AnyTensor::Bool(t),
        }
    }

    /// The inner backend's primitive, typed as the decorator's.
    pub fn from_inner(inner: AnyTensor<B>) -> Self {
        match inner {
            AnyTensor::Float(t) => AnyTensor::Float(t),
            AnyTensor::Int(t) => AnyTensor::Int(t),
            AnyTensor::Bool(t) => AnyTensor::Bool(t),
        }
    }
}
