//! What an inner backend can do for graph capture.
//!
//! The step API talks to hardware graphs only through this trait, so the same trainer
//! code runs on CUDA (real graphs) and on CPU backends (honest "no graphs": every step
//! eager, every guard still exercised).

use burn::tensor::Distribution;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_backend::{Backend, DType, FloatDType, Shape, StreamId};
use serde::{Deserialize, Serialize};

use super::error::GraphError;
use super::holder::Holder;
use super::identity::Allocated;
use super::primitive::AnyTensor;
use crate::nn::{GruKernels, LstmKernels};
use crate::parallel::{DistError, RankLink};

/// Identity of a tensor's storage, stable while that storage lives.
///
/// Views of one buffer share an identity. Once a buffer is freed its identity may be
/// reused, so the step API keeps pinned buffers alive while it compares identities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferId(pub u64);

/// Capture, replay and pinning, as an inner backend provides them.
///
/// Every tensor primitive names its allocation ([`Allocated`]), so that a capture
/// session can tell which buffers a step reads without producing them. The backend also
/// says how it runs [`FusedLstm`](crate::nn::FusedLstm)'s and
/// [`FusedGru`](crate::nn::FusedGru)'s recurrences ([`LstmKernels`], [`GruKernels`]: an
/// empty impl takes the plain tensor ops), which the decorator forwards to it.
pub trait GraphBackend:
    Backend<
        FloatTensorPrimitive: Allocated,
        IntTensorPrimitive: Allocated,
        BoolTensorPrimitive: Allocated,
        QuantizedTensorPrimitive: Allocated,
    > + LstmKernels
    + GruKernels
{
    /// An instantiated, replayable graph. Dropping it releases the graph and everything
    /// retained for it, once the device has finished with it.
    type Graph: Send + 'static;

    /// Whether this device can capture and replay hardware graphs.
    fn supports_hardware_graphs(device: &Self::Device) -> bool;

    /// Records `step` into a graph: opens a window on `device`, runs `step`, closes the
    /// window (on every path, a panic in `step` included).
    ///
    /// `Err` means no window could be opened and `step` did not run. Otherwise `step`'s
    /// result comes back with the graph, or with why the window failed; nothing a
    /// window records runs until its graph is launched.
    fn capture<R>(
        device: &Self::Device,
        step: impl FnOnce() -> R,
    ) -> Result<(R, Result<Self::Graph, GraphError>), GraphError>;

    /// Runs an eager step the way [`capture`](Self::capture) will run the step it
    /// records, minus the window, so that the last warmup step compiles and tunes
    /// exactly what the capture will launch (a backend that records under a stream of
    /// its own rehearses under a stream of its own too).
    fn rehearse<R>(_device: &Self::Device, step: impl FnOnce() -> R) -> R {
        step()
    }

    /// Runs an eager step with its kernels apart from the work queued before and after
    /// it, as [`capture`](Self::capture) and [`rehearse`](Self::rehearse) run theirs.
    /// A backend that fuses across op boundaries (`Fusion`) would otherwise fuse the
    /// step with whatever the caller queued around it (burn-train's metrics, the next
    /// batch), and a fused multiply-add rounds unlike a multiply and an add apart: eager
    /// steps would then round unlike the graphed steps they stand for.
    fn isolate<R>(_device: &Self::Device, step: impl FnOnce() -> R) -> R {
        step()
    }

    /// Launches the graph once.
    fn replay(graph: &Self::Graph) -> Result<(), GraphError>;

    /// `tensor`, made inside a [`capture`](Self::capture)'s step, as a tensor of the
    /// caller's stream `caller` (the same buffer): what a captured step hands back.
    /// Fusion tracks the stream each tensor was made on, and a capture stream runs
    /// nothing after its window, so a tensor of it that the caller's stream used would
    /// stay tracked as shared, its buffer (and the graph's pool) never freed. The
    /// default, for backends without streams of their own, returns `tensor`.
    fn hand_over(tensor: AnyTensor<Self>, _caller: StreamId) -> AnyTensor<Self> {
        tensor
    }

    /// Moves a tensor's values into the arena, where its address stays fixed.
    fn pin(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError>;

    /// [`pin`](Self::pin) for a batch tensor, the static input of a graph: a backend
    /// whose kernels follow strides keeps the layout of views that `pin` would pack (a
    /// column of a wider upload, an expanded mask), so that the graph reads its input as
    /// eager kernels read the batch. The default pins.
    fn pin_input(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        Self::pin(tensor)
    }

    /// Copies `src`'s values into the storage of `dst`, which must be pinned and of the
    /// same kind, shape, dtype and layout ([`GraphError::LayoutDiffers`] otherwise).
    /// Inside a capture this is recorded as a device copy.
    fn copy_into(dst: &AnyTensor<Self>, src: &AnyTensor<Self>) -> Result<(), GraphError>;

    /// The tensor's values in a buffer of their own, laid out as they lie: what the
    /// trainer lends out, so that code on the copy launches the kernels code on the
    /// original would. The default copies through an identity op, whose output layout
    /// the backend picks (backends whose kernels do not follow strides).
    fn duplicate(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        Ok(tensor.fresh_copy())
    }

    /// The address of a tensor's storage, where the backend exposes one.
    fn buffer_id(tensor: &AnyTensor<Self>) -> Option<BufferId>;

    /// A handle on `tensor`'s allocation that tells whether anything else still holds
    /// it ([`Holder`]): what a replay checks of each constant its graph reads. `None`
    /// where the backend cannot tell (its graphs are then checked only every
    /// `verify_every` replays); the default.
    fn holder(_tensor: &AnyTensor<Self>) -> Option<Holder> {
        None
    }

    /// `lhs @ rhs` for the decorator's `float_matmul`: the backend's own, unless it has a
    /// faster one (cuBLAS on this crate's runtime, `backend::cublas`).
    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(lhs, rhs)
    }

    /// Whether [`matmul`](Self::matmul) of `dtype` tensors may take another path than
    /// `float_matmul` (so that a wrapping backend routes it through `matmul` too).
    fn routes_matmul(_dtype: DType) -> bool {
        false
    }

    /// Whether [`random`](Self::random) draws values of `shape` and `dtype` from a
    /// generator state on the device (`rng::state`). Where it does not, a trainer's
    /// random ops are the backend's own, host-seeded, and break captures.
    fn draws_random(_shape: &Shape, _dtype: FloatDType) -> bool {
        false
    }

    /// Draw `draw` of a step from the generator `state`: the values `rng::draw` gives
    /// at offset `offset + draw` under the state's key, read from the device when the
    /// kernel runs (a replay draws from the state as it is then). Called only where
    /// [`draws_random`](Self::draws_random) holds; the default is the backend's own
    /// `float_random`.
    fn random(
        state: &IntTensor<Self>,
        _draw: u32,
        shape: Shape,
        distribution: Distribution,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        Self::float_random(shape, distribution, &Self::int_device(state), dtype)
    }

    /// The generator `state` after `draws` more draws (its offset advanced), as a new
    /// tensor.
    fn advance_random(state: IntTensor<Self>, _draws: u32) -> IntTensor<Self> {
        state
    }

    /// Makes what `member`'s group needs for collectives on `device` (an NCCL
    /// communicator on GPUs). Called once per rank, outside any window; returns once
    /// every rank has joined. The default: this backend has no collectives.
    fn join_group(_device: &Self::Device, _member: &RankLink) -> Result<(), DistError> {
        Err(no_collectives())
    }

    /// Each of `tensors` averaged elementwise over the ranks of `member`'s group, as new
    /// tensors holding the same bits on every rank. Every rank calls it with tensors of
    /// the same shapes, in the same order. Inside a capture window it is recorded like a
    /// kernel. An error means the group can no longer be trusted: the caller fails it.
    fn all_reduce_mean(
        _tensors: Vec<FloatTensor<Self>>,
        _member: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError> {
        Err(no_collectives())
    }

    /// `root`'s `tensors` on every rank of `member`'s group, as new tensors.
    fn broadcast(
        _tensors: Vec<FloatTensor<Self>>,
        _root: usize,
        _member: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError> {
        Err(no_collectives())
    }
}

fn no_collectives() -> DistError {
    DistError::Collective("this backend has no collectives".into())
}

/// A graph that cannot exist: the type of graphs on backends without them.
#[derive(Debug)]
pub enum NoGraph {}

/// The decorator exposes its inner backend's graph support unchanged.
impl<B: GraphBackend> GraphBackend for super::GraphCapture<B> {
    type Graph = B::Graph;

    fn supports_hardware_graphs(device: &Self::Device) -> bool {
        B::supports_hardware_graphs(device)
    }

    fn capture<R>(
        device: &Self::Device,
        step: impl FnOnce() -> R,
    ) -> Result<(R, Result<Self::Graph, GraphError>), GraphError> {
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

    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        B::matmul(lhs, rhs)
    }

    fn routes_matmul(dtype: DType) -> bool {
        B::routes_matmul(dtype)
    }

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
    if super::session::is_recording() {
        super::session::record_op(op, None, |rec| {
            inputs.iter().for_each(|t| rec.tensor(t));
            outputs.iter().for_each(|t| rec.output(t));
            rec.attr(&(member.group_id(), member.world(), root));
        });
    }
}
