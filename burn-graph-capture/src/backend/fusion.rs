//! `Fusion<B>` as an inner backend: graph capture on top of Burn's operation fusion.
//!
//! Fusion queues operations and launches them later, as fused kernels. A window must
//! record exactly one step's kernels, so the calling thread's fusion stream is drained
//! (its queued kernels launched onto B's stream; no host sync) before a window opens,
//! before it closes (the stream the step ran on) and before a replay. Pinning, copies and identities act on B's
//! tensors behind the fusion handles, resolved through a clone so that fusion sees a
//! read-only use and keeps the handle.
//!
//! Steps must run on one thread: fusion keeps one queue per thread, and only the caller's
//! queue is drained.

use burn_fusion::{Fusion, FusionBackend, FusionTensor, NoOp, client::GlobalFusionClient};
use burn_ir::{InitOperationIr, OperationIr, OperationOutput};

use burn::tensor::Distribution;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_backend::{DType, FloatDType, Shape, StreamId};

use crate::backend::trace::TraceRecording;
use crate::backend::{
    AnyTensor, BufferId, Captured, GraphBackend, GraphError, Holder, RoutedMatmul,
};
use crate::parallel::{Collectives, DistError, RankLink};
use crate::rng::RandomDraws;
use crate::runtime::nccl::CollectiveOp;

/// The fused stack on this crate's runtime, as burn-cuda builds it for `CudaRuntime`.
#[cfg(feature = "cuda")]
pub type CudaFused = Fusion<super::CudaCube>;

/// Launches everything the calling thread queued on `device`'s fusion stream.
fn drain<B: FusionBackend>(device: &B::Device) {
    GlobalFusionClient::<B::FusionRuntime>::load(device).sync(|| ());
}

/// B's tensor behind `tensor`, with `tensor` still owning it.
fn resolve<B: FusionBackend>(tensor: &AnyTensor<Fusion<B>>) -> AnyTensor<B> {
    match tensor {
        AnyTensor::Float(t) => AnyTensor::Float(t.client.resolve_tensor_float::<B>(t.clone())),
        AnyTensor::Int(t) => AnyTensor::Int(t.client.resolve_tensor_int::<B>(t.clone())),
        AnyTensor::Bool(t) => AnyTensor::Bool(t.client.resolve_tensor_bool::<B>(t.clone())),
    }
}

/// Wraps B's tensor in a fusion tensor, as `Fusion::float_from_data` does.
pub(super) fn register<B: FusionBackend>(
    client: &GlobalFusionClient<B::FusionRuntime>,
    tensor: AnyTensor<B>,
) -> FusionTensor<B::FusionRuntime> {
    let (shape, dtype) = (tensor.shape(), tensor.dtype());
    let handle = match tensor {
        AnyTensor::Float(t) => B::float_tensor_handle(t),
        AnyTensor::Int(t) => B::int_tensor_handle(t),
        AnyTensor::Bool(t) => B::bool_tensor_handle(t),
    };
    let init = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    client
        .register(
            Default::default(),
            OperationIr::Init(init),
            NoOp::<B>::new(),
        )
        .output()
}

/// `inner` (B's copy of `tensor`) as a fusion tensor of `tensor`'s kind.
fn rewrapped<B: FusionBackend>(
    tensor: &AnyTensor<Fusion<B>>,
    inner: AnyTensor<B>,
) -> AnyTensor<Fusion<B>> {
    let registered = register::<B>(&fused(tensor).client, inner);
    match tensor {
        AnyTensor::Float(_) => AnyTensor::Float(registered),
        AnyTensor::Int(_) => AnyTensor::Int(registered),
        AnyTensor::Bool(_) => AnyTensor::Bool(registered),
    }
}

/// The fusion tensor behind any kind: all three are `FusionTensor`s.
fn fused<B: FusionBackend>(tensor: &AnyTensor<Fusion<B>>) -> &FusionTensor<B::FusionRuntime> {
    let (AnyTensor::Float(t) | AnyTensor::Int(t) | AnyTensor::Bool(t)) = tensor;
    t
}

/// B's graph with the device it was captured on, whose fusion queue a replay drains.
pub struct FusedGraph<B: GraphBackend> {
    graph: B::Graph,
    device: B::Device,
}

impl<B: GraphBackend + FusionBackend> GraphBackend for Fusion<B> {
    type Graph = FusedGraph<B>;

    fn supports_hardware_graphs(device: &Self::Device) -> bool {
        B::supports_hardware_graphs(device)
    }

    fn capture<R>(device: &Self::Device, step: impl FnOnce() -> R) -> Captured<R, Self::Graph> {
        drain::<B>(device);
        B::capture(device, || {
            let out = step();
            // B may run the step under a stream of its own: drain the one it ran on.
            drain::<B>(device);
            out
        })
        .map_graph(|graph| {
            // The window is closed: the stand-ins its traces hand out are made now
            // (`backend::fused_stand_in`), queued after the step.
            if let Some(recording) = B::trace_recording(&graph) {
                recording.0.make_stand_ins();
            }
            FusedGraph {
                graph,
                device: device.clone(),
            }
        })
    }

    fn trace_recording(graph: &Self::Graph) -> Option<TraceRecording> {
        B::trace_recording(&graph.graph)
    }

    /// A stand-in filled by a custom op splits fusion's kernels where the eager step's
    /// are whole, and the ops recomputed from the recording reach fusion with other
    /// handle counts (so other in-place choices and drops): the step would round
    /// otherwise than plain code.
    fn traces_run_again() -> bool {
        true
    }

    fn rehearse<R>(device: &Self::Device, step: impl FnOnce() -> R) -> R {
        // The step runs under another stream than the one its batch was built on (a
        // target computed lazily from the inputs, say): launch the caller's queued work
        // first, as before a capture window, so the step never runs ahead of it.
        drain::<B>(device);
        B::rehearse(device, || {
            let out = step();
            drain::<B>(device);
            out
        })
    }

    fn isolate<R>(device: &Self::Device, step: impl FnOnce() -> R) -> R {
        drain::<B>(device);
        let out = step();
        drain::<B>(device);
        out
    }

    /// Fusion's own server thread sleeps when idle as CubeCL's does, and the launch
    /// waits on both (a drain, then the graph's launch).
    fn keep_ready(device: &Self::Device) {
        GlobalFusionClient::<B::FusionRuntime>::load(device).flush_queue();
        B::keep_ready(device)
    }

    fn replay(graph: &Self::Graph) -> Result<(), GraphError> {
        // Work queued before the replay (its inputs, reads of the last loss) runs first.
        drain::<B>(&graph.device);
        B::replay(&graph.graph)
    }

    fn hand_over(tensor: AnyTensor<Self>, caller: StreamId) -> AnyTensor<Self> {
        if fused(&tensor).stream == caller {
            return tensor;
        }
        // Resolved on the stream that made it (no cross-stream use), registered anew on
        // the caller's; `tensor` itself is dropped on its own stream, whose queue the
        // capture drains before its window closes.
        let inner = resolve::<B>(&tensor);
        caller.executes(|| rewrapped(&tensor, inner))
    }

    fn pin(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        Ok(rewrapped(&tensor, B::pin(resolve::<B>(&tensor))?))
    }

    fn pin_input(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        Ok(rewrapped(&tensor, B::pin_input(resolve::<B>(&tensor))?))
    }

    fn duplicate(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        Ok(rewrapped(&tensor, B::duplicate(resolve::<B>(&tensor))?))
    }

    fn copy_into(dst: &AnyTensor<Self>, src: &AnyTensor<Self>) -> Result<(), GraphError> {
        dst.check_copy_from(src)?;
        drain::<B>(fused(dst).client.device());
        B::copy_into(&resolve::<B>(dst), &resolve::<B>(src))
    }

    fn buffer_id(tensor: &AnyTensor<Self>) -> Option<BufferId> {
        B::buffer_id(&resolve::<B>(tensor))
    }

    /// B's holder of the tensor behind the fusion handle. Fusion frees that tensor when
    /// the last fusion handle is dropped, by a drop op it runs with its queue, so the
    /// queue is drained before each answer.
    fn holder(tensor: &AnyTensor<Self>) -> Option<Holder> {
        let inner = B::holder(&resolve::<B>(tensor))?;
        let device = fused(tensor).client.device().clone();
        Some(Holder::new(move || {
            drain::<B>(&device);
            inner.held_elsewhere()
        }))
    }
}

impl<B: GraphBackend + FusionBackend> RoutedMatmul for Fusion<B> {
    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        super::fused_matmul::matmul::<B>(lhs, rhs)
    }

    fn routes_matmul(dtype: DType) -> bool {
        B::routes_matmul(dtype)
    }
}

impl<B: GraphBackend + FusionBackend> RandomDraws for Fusion<B> {
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
        crate::rng::fusion::random::<B>(state, draw, shape, distribution, dtype)
    }

    fn advance_random(state: IntTensor<Self>, draws: u32) -> IntTensor<Self> {
        crate::rng::fusion::advance::<B>(state, draws)
    }
}

impl<B: GraphBackend + Collectives + FusionBackend> Collectives for Fusion<B> {
    fn join_group(device: &Self::Device, link: &RankLink) -> Result<(), DistError> {
        B::join_group(device, link)
    }

    /// One custom op running `B`'s collective (`backend::collective`).
    fn all_reduce_mean(
        tensors: Vec<FloatTensor<Self>>,
        link: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError> {
        super::collective::fused::<B>(tensors, CollectiveOp::Mean, link)
    }

    fn broadcast(
        tensors: Vec<FloatTensor<Self>>,
        root: usize,
        link: &RankLink,
    ) -> Result<Vec<FloatTensor<Self>>, DistError> {
        super::collective::fused::<B>(tensors, CollectiveOp::Broadcast { root }, link)
    }
}
