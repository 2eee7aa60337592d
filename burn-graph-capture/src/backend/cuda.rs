//! The plain CUDA stack as an inner backend: `CubeBackend<CudaGraphRuntime, f32, i32, u8>`
//! (graphs, pins and copies; matmuls routed to cuBLAS; draws and collectives on the device).
//!
//! Capture and replay go to the runtime's server through its device queue, so they are
//! ordered with every kernel queued before them (see `runtime::window`). Pinned tensors
//! live in the runtime's arena; `copy_into` is a device-to-device copy on the stream, which
//! a capture window records like any launch.

use std::time::{Duration, Instant};

use burn::tensor::Distribution;
use burn::tensor::ops::FloatTensorOps;
use burn_backend::{DType, FloatDType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::{CubeBackend, tensor::CubeTensor};
use cubecl_common::stream_id::StreamId;
use cubecl_core::server::Handle;

use crate::backend::emulated::program::{Program, Recording};
use crate::backend::trace::{TraceRecording, Untraced};
use crate::backend::{
    AnyTensor, BufferId, Captured, GraphBackend, GraphError, Holder, RoutedMatmul, RuntimeFailure,
    StandIn, layout,
};
use crate::cause::Cause;
use crate::parallel::{Collectives, DistError, RankLink};
use crate::rng::RandomDraws;
use crate::runtime::nccl::CollectiveOp;
use crate::runtime::{
    CaptureError, CudaGraphDevice, CudaGraphHandle, CudaGraphRuntime, capture_begin_in_pool,
    capture_end, capture_stream, try_with_server,
};

/// The plain CubeCL backend on this crate's runtime.
pub type CudaCube = CubeBackend<CudaGraphRuntime, f32, i32, u8>;

fn runtime_err(err: CaptureError) -> GraphError {
    GraphError::Runtime {
        kind: failure_kind(&err),
        cause: Cause::new(err),
    }
}

fn failure_kind(err: &CaptureError) -> RuntimeFailure {
    match err {
        CaptureError::AlreadyCapturing | CaptureError::WindowBusy | CaptureError::NotCapturing => {
            RuntimeFailure::WindowState
        }
        CaptureError::NeedsAllocation { .. } => RuntimeFailure::NeedsAllocation,
        CaptureError::StagingExhausted { .. } => RuntimeFailure::StagingExhausted,
        CaptureError::HostSync(_) => RuntimeFailure::HostSync,
        CaptureError::FirstCompile(_) => RuntimeFailure::FirstCompile,
        CaptureError::Unsupported(_) => RuntimeFailure::Unsupported,
        CaptureError::StreamUnhealthy(_) => RuntimeFailure::StreamUnhealthy,
        CaptureError::Server(_) | CaptureError::OutOfBounds { .. } => RuntimeFailure::Server,
        CaptureError::Driver { .. } => RuntimeFailure::Driver,
        CaptureError::Blas { .. } | CaptureError::BlasUnavailable => RuntimeFailure::Blas,
        CaptureError::Nccl { .. } | CaptureError::NcclUnavailable(_) => RuntimeFailure::Collective,
        CaptureError::UnknownGraph(_) => RuntimeFailure::UnknownGraph,
        CaptureError::Unreachable => RuntimeFailure::Unreachable,
    }
}

/// An open window, closed when dropped (a panic in the recorded step): the stream must
/// always leave capture mode. The graph of an abandoned window is thrown away.
struct OpenWindow<'a> {
    device: &'a CudaGraphDevice,
    open: bool,
}

impl OpenWindow<'_> {
    fn close(mut self) -> Result<CudaGraphHandle, GraphError> {
        self.open = false;
        capture_end(self.device).map_err(runtime_err)
    }
}

impl Drop for OpenWindow<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = capture_end(self.device);
        }
    }
}

/// Bytes from a tensor's first value to its last: its values and the padding between
/// them (the bytes a pin of it copies).
fn reach_bytes(tensor: &CubeTensor<CudaGraphRuntime>) -> u64 {
    let elements = layout::reach(tensor.meta.shape(), tensor.meta.strides());
    (elements * tensor.dtype.size()) as u64
}

/// Whether a pin or a lent copy keeps the tensor's layout (`layout::pinnable_as_it_lies`).
fn pinnable(tensor: &CubeTensor<CudaGraphRuntime>) -> bool {
    layout::pinnable_as_it_lies(tensor.meta.shape(), tensor.meta.strides())
}

/// `bytes` in the arena, for a pin of `tensor`.
fn arena_alloc(tensor: &CubeTensor<CudaGraphRuntime>, bytes: u64) -> Result<Handle, GraphError> {
    try_with_server(&tensor.device, move |server| server.arena_alloc(bytes)).map_err(runtime_err)
}

/// Whether a batch tensor's pin keeps its layout (`layout::input_pinnable_as_it_lies`).
fn input_kept(tensor: &CubeTensor<CudaGraphRuntime>) -> bool {
    let (shape, strides) = (tensor.meta.shape(), tensor.meta.strides());
    layout::input_pinnable_as_it_lies(shape, strides, tensor.dtype.size())
}

/// How long a capture waits for another thread's window to close before it gives up
/// (the step then runs eagerly, its reason `WindowState`). A window stays open for one
/// step's launches, milliseconds to a second.
const WINDOW_WAIT: Duration = Duration::from_secs(20);

/// `on` turns on constant pins on `CudaCube` (`GraphBackend::pins_constants`).
pub(crate) const CONSTANT_PINS_SWITCH: &str = "BURN_GRAPH_CAPTURE_CONSTANT_PINS";

/// Opens a window, waiting while another thread's is open: one device records one
/// window at a time, and a trainer on another thread must not lose its graph to that
/// (issue 14, threads). Other errors, a nested window included, return at once.
fn begin_when_free(device: &CudaGraphDevice, stream: StreamId) -> Result<(), CaptureError> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        match capture_begin_in_pool(device, stream) {
            Err(CaptureError::WindowBusy) if start.elapsed() < WINDOW_WAIT => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// A captured step on the plain stack: the device graph, and the recording its replays'
/// traces match (`None` where a trace could not follow the step: an op without
/// stand-ins, or traces off on the capturing thread).
#[derive(Debug)]
pub struct CubeGraph {
    graph: CudaGraphHandle,
    recording: Option<Program>,
}

/// The device graph's own API (launches, what it retains).
impl std::ops::Deref for CubeGraph {
    type Target = CudaGraphHandle;

    fn deref(&self) -> &CudaGraphHandle {
        &self.graph
    }
}

impl GraphBackend for CudaCube {
    type Graph = CubeGraph;

    fn supports_hardware_graphs(_device: &CudaGraphDevice) -> bool {
        true
    }

    /// The step runs under a fresh capture stream whose handles a private pool of the
    /// window serves, so the step reuses its own freed memory within the capture and the
    /// graph owns that pool whole (see `runtime::graph_pool`). Its ops are recorded for
    /// traces as they are captured; the recording names what the step reads from outside
    /// and holds none of it, so the captured ops decide in place as eager ops do.
    fn capture<R>(device: &CudaGraphDevice, step: impl FnOnce() -> R) -> Captured<R, Self::Graph> {
        let stream = capture_stream();
        if let Err(error) = begin_when_free(device, stream) {
            return Captured::Refused(runtime_err(error));
        }
        let window = OpenWindow { device, open: true };
        let traced = (!Untraced::active())
            .then(Recording::begin_unheld)
            .flatten();
        let output = stream.executes(step);
        let recording = traced.and_then(|traced| match traced.finish() {
            Ok(program) => Some(program),
            Err(refused) => {
                tracing::warn!(op = refused.op, "a step's graph has no trace: its replays are checked only every verify_every steps");
                None
            }
        });
        match window.close() {
            Ok(graph) => Captured::Recorded {
                output,
                graph: CubeGraph { graph, recording },
            },
            Err(error) => Captured::Broken { output, error },
        }
    }

    /// Under a fresh stream, as `capture` runs its step (no pool: the handles land in
    /// the normal pools). With fusion on top, the step then meets the same cross-stream
    /// inputs as the captured one, so its fused kernels are compiled before the window.
    fn rehearse<R>(_device: &CudaGraphDevice, step: impl FnOnce() -> R) -> R {
        capture_stream().executes(step)
    }

    fn replay(graph: &Self::Graph) -> Result<(), GraphError> {
        graph.graph.replay().map_err(runtime_err)
    }

    fn keep_ready(device: &CudaGraphDevice) {
        crate::runtime::keep_server_polling(device)
    }

    fn trace_recording(graph: &Self::Graph) -> Option<TraceRecording> {
        graph.recording.as_ref()?.traceable().map(TraceRecording)
    }

    fn pin(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        map_cube(tensor, |tensor| {
            let keep = pinnable(&tensor);
            copy_as_it_lies(tensor, keep, arena_alloc)
        })
    }

    fn duplicate(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        map_cube(tensor, |tensor| {
            let keep = pinnable(&tensor);
            copy_as_it_lies(tensor, keep, |tensor, bytes| {
                Ok(tensor.client.empty(bytes as usize))
            })
        })
    }

    fn copy_into(dst: &AnyTensor<Self>, src: &AnyTensor<Self>) -> Result<(), GraphError> {
        dst.check_copy_from(src)?;
        copy_placed(cube(dst), cube(src))
    }

    fn buffer_id(tensor: &AnyTensor<Self>) -> Option<BufferId> {
        let tensor = cube(tensor);
        let binding = tensor.handle.clone().binding();
        try_with_server(&tensor.device, move |server| server.buffer_address(binding))
            .ok()
            .map(BufferId)
    }

    /// As `pin`, but a view that reaches mostly other values (a column of a wider
    /// upload, an expanded mask) keeps its layout too, within a copy size per replay.
    fn pin_input(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        map_cube(tensor, |tensor| {
            let keep = input_kept(&tensor);
            copy_as_it_lies(tensor, keep, arena_alloc)
        })
    }

    /// Off unless `BURN_GRAPH_CAPTURE_CONSTANT_PINS=on`: with constant pins on, one
    /// program of the GPU fuzzer (seed 88: a GRU whose step reads a constant the loop
    /// refreshes before every step, a model reloaded before the capture) trained
    /// otherwise than plain code on an H200, for a cause not found. Until it is,
    /// constants are read as they are and a replaced one is a difference; the switch lets
    /// one build run both ways side by side.
    fn pins_constants() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::env::var(CONSTANT_PINS_SWITCH).is_ok_and(|value| value == "on"))
    }

    fn lies_alike(pin: &AnyTensor<Self>, tensor: &AnyTensor<Self>) -> bool {
        pin.check_copy_from(tensor).is_ok()
            && cube(pin).meta.strides() == cube(tensor).meta.strides()
    }

    /// A handle on the tensor's memory: CubeCL counts the handles of an allocation
    /// (one is its pool's own), while graphs retain bindings, which do not count. Once
    /// only the pool's and this one are left, no tensor holds the allocation.
    fn holder(tensor: &AnyTensor<Self>) -> Option<Holder> {
        let memory = cube(tensor).handle.memory.clone();
        Some(Holder::new(move || !memory.can_mut()))
    }
}

impl RoutedMatmul for CudaCube {
    fn matmul(
        lhs: CubeTensor<CudaGraphRuntime>,
        rhs: CubeTensor<CudaGraphRuntime>,
    ) -> CubeTensor<CudaGraphRuntime> {
        super::cublas::matmul_or(lhs, rhs, <Self as FloatTensorOps<Self>>::float_matmul)
    }

    fn routes_matmul(dtype: DType) -> bool {
        dtype == DType::F32 && crate::runtime::blas::enabled()
    }
}

impl RandomDraws for CudaCube {
    fn draws_random(shape: &Shape, dtype: FloatDType) -> bool {
        crate::rng::cube::draws(shape, dtype.into())
    }

    fn random(
        state: &CubeTensor<CudaGraphRuntime>,
        draw: u32,
        shape: Shape,
        distribution: Distribution,
        dtype: FloatDType,
    ) -> CubeTensor<CudaGraphRuntime> {
        crate::rng::cube::random(state, draw, shape, distribution, dtype.into())
    }

    fn advance_random(
        state: CubeTensor<CudaGraphRuntime>,
        draws: u32,
    ) -> CubeTensor<CudaGraphRuntime> {
        crate::rng::cube::advance(state, draws)
    }
}

impl Collectives for CudaCube {
    fn join_group(device: &CudaGraphDevice, link: &RankLink) -> Result<(), DistError> {
        super::collective::join(device, link)
    }

    /// NCCL's `ncclAvg` over the ranks, queued on the stream like a launch.
    fn all_reduce_mean(
        tensors: Vec<CubeTensor<CudaGraphRuntime>>,
        link: &RankLink,
    ) -> Result<Vec<CubeTensor<CudaGraphRuntime>>, DistError> {
        super::collective::run(tensors, CollectiveOp::Mean, link)
    }

    fn broadcast(
        tensors: Vec<CubeTensor<CudaGraphRuntime>>,
        root: usize,
        link: &RankLink,
    ) -> Result<Vec<CubeTensor<CudaGraphRuntime>>, DistError> {
        super::collective::run(tensors, CollectiveOp::Broadcast { root }, link)
    }
}

/// A copy of `tensor` in the buffer `alloc` returns for its span, laid out as
/// `tensor` lies (pitched rows stay pitched, a permuted layout permuted), so that steps
/// that read the copy launch the kernels, and autotune keys, that reads of `tensor` do
/// (`layout`). A layout a span copy cannot keep (a broadcast, a small view of a large
/// buffer) is packed first.
fn copy_as_it_lies(
    tensor: CubeTensor<CudaGraphRuntime>,
    keep: bool,
    alloc: impl FnOnce(&CubeTensor<CudaGraphRuntime>, u64) -> Result<Handle, GraphError>,
) -> Result<CubeTensor<CudaGraphRuntime>, GraphError> {
    let tensor = if keep {
        tensor
    } else {
        into_contiguous(tensor)
    };
    let bytes = reach_bytes(&tensor);
    let handle = alloc(&tensor, bytes)?;
    let (from, to) = (tensor.handle.clone().binding(), handle.clone().binding());
    try_with_server(&tensor.device, move |server| {
        server.copy_device(from, to, bytes)
    })
    .map_err(runtime_err)?;
    Ok(CubeTensor {
        client: tensor.client.clone(),
        handle,
        meta: tensor.meta.clone(),
        device: tensor.device,
        dtype: tensor.dtype,
        qparams: None,
    })
}

/// Copies `src` into `dst` of the same shape and dtype, on the stream: one copy of what
/// the view reaches where both lie alike, else `src` packed into a packed `dst`.
fn copy_placed(
    dst: &CubeTensor<CudaGraphRuntime>,
    src: &CubeTensor<CudaGraphRuntime>,
) -> Result<(), GraphError> {
    let shape: &[usize] = dst.meta.shape();
    let packed;
    let src = if layout::same_placement(shape, src.meta.strides(), dst.meta.strides()) {
        src
    } else if layout::is_packed(shape, dst.meta.strides()) && !input_kept(src) {
        // A batch tensor too wide to pin as it lies (`pin_input`) was pinned packed:
        // it is packed again for each copy.
        packed = into_contiguous(src.clone());
        &packed
    } else {
        return Err(GraphError::LayoutDiffers {
            shape: shape.to_vec(),
            pinned: dst.meta.strides().to_vec(),
            given: src.meta.strides().to_vec(),
        });
    };
    // Every value lies where the pin keeps it: one copy of what the view reaches
    // (which depends only on the strides `same_placement` compared).
    let bytes = reach_bytes(dst);
    let (from, to) = (src.handle.clone().binding(), dst.handle.clone().binding());
    try_with_server(&dst.device, move |server| {
        server.copy_device(from, to, bytes)
    })
    .map_err(runtime_err)
}

/// A stand-in is a buffer of the output's reach, laid out as it lies, allocated where
/// the step allocates (inside a capture: the graph's own pool, which keeps it as long
/// as the recording does). A trace hands it out in place of the output; only a trace
/// that stops matching writes it, with the value the op computes then.
impl StandIn for CubeTensor<CudaGraphRuntime> {
    fn stand_in(&self) -> Option<Self> {
        if self.qparams.is_some() {
            return None;
        }
        let bytes = reach_bytes(self).max(1) as usize;
        Some(CubeTensor {
            client: self.client.clone(),
            handle: self.client.empty(bytes),
            meta: self.meta.clone(),
            device: self.device,
            dtype: self.dtype,
            qparams: None,
        })
    }

    fn fill(&self, value: &Self) -> bool {
        if self.dtype != value.dtype || self.meta.shape() != value.meta.shape() {
            return false;
        }
        let shape: &[usize] = self.meta.shape();
        let packed;
        let value = if !layout::same_placement(shape, value.meta.strides(), self.meta.strides())
            && layout::is_packed(shape, self.meta.strides())
        {
            // Computed out of place where the capture worked in place (or the reverse).
            packed = into_contiguous(value.clone());
            &packed
        } else {
            value
        };
        copy_placed(self, value).is_ok()
    }
}

/// The CubeCL tensor behind any kind: all three are `CubeTensor`s.
fn cube(tensor: &AnyTensor<CudaCube>) -> &CubeTensor<CudaGraphRuntime> {
    let (AnyTensor::Float(t) | AnyTensor::Int(t) | AnyTensor::Bool(t)) = tensor;
    t
}

/// Applies `f` to the CubeCL tensor behind `tensor`, keeping its kind.
fn map_cube(
    tensor: AnyTensor<CudaCube>,
    f: impl FnOnce(CubeTensor<CudaGraphRuntime>) -> Result<CubeTensor<CudaGraphRuntime>, GraphError>,
) -> Result<AnyTensor<CudaCube>, GraphError> {
    Ok(match tensor {
        AnyTensor::Float(t) => AnyTensor::Float(f(t)?),
        AnyTensor::Int(t) => AnyTensor::Int(f(t)?),
        AnyTensor::Bool(t) => AnyTensor::Bool(f(t)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_errors_keep_their_kind_and_message() {
        let err = runtime_err(CaptureError::NeedsAllocation { bytes: 512 });
        let GraphError::Runtime { kind, cause } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*kind, RuntimeFailure::NeedsAllocation);
        assert!(cause.to_string().contains("512 bytes"), "{cause}");
        assert!(matches!(
            cause.downcast_ref::<CaptureError>(),
            Some(CaptureError::NeedsAllocation { bytes: 512 })
        ));
        let first = runtime_err(CaptureError::FirstCompile("gemm".into()));
        assert!(matches!(
            first,
            GraphError::Runtime {
                kind: RuntimeFailure::FirstCompile,
                ..
            }
        ));
        let sync = runtime_err(CaptureError::HostSync("read"));
        assert_ne!(sync, first);
    }
}
