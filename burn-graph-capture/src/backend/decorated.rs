//! The decorator as a backend for the step API: `GraphCapture<B>` has `B`'s graphs,
//! pins, matmul routing, draws and collectives (each collective recorded as one op of
//! the session), and its primitives are `B`'s.

use burn::tensor::Distribution;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_backend::{DType, FloatDType, Shape, StreamId};

use super::base::GraphCapture;
use super::error::GraphError;
use super::graph_backend::{BufferId, Captured, GraphBackend};
use super::holder::Holder;
use super::identity::Allocated;
use super::primitive::AnyTensor;
use super::routed_matmul::RoutedMatmul;
use super::session;
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

    /// `B`'s, recorded as one op of the session: the step's graph holds it.
    fn all_reduce_mean(
        tensors: Vec<FloatTensor<Self>>,
        member: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError> {
        let reduced = B::all_reduce_mean(tensors.clone(), member)?;
        record_collective("all_reduce_mean", &tensors, &reduced, member, 0);
        Ok(reduced)
    }

    fn broadcast(
        tensors: Vec<FloatTensor<Self>>,
        root: usize,
        member: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError> {
        let received = B::broadcast(tensors.clone(), root, member)?;
        record_collective("broadcast", &tensors, &received, member, root);
        Ok(received)
    }
}

/// Records a collective into the open sessions: it reads `inputs` and makes `outputs`;
/// its group and root are attributes (a step on another group is another step).
fn record_collective<T: burn_backend::TensorMetadata + Allocated + 'static>(
    op: &'static str,
    inputs: &[T],
    outputs: &[T],
    member: &RankLink,
    root: usize,
) {
    if session::is_recording() {
        // A collective waits on the other ranks: an emulated graph does not replay one.
        crate::backend::emulated::program::refuse(op);
        session::record_op(op, None, |rec| {
            inputs.iter().for_each(|t| rec.tensor(t));
            outputs.iter().for_each(|t| rec.output(t));
            rec.attr(&(member.group_id(), member.world(), root));
        });
    }
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
