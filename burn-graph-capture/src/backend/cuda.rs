//! `GraphBackend` for the CUDA stack: `CubeBackend<CudaGraphRuntime, f32, i32, u8>`.
//!
//! Capture and replay go to the runtime's server through its device queue, so they are
//! ordered with every kernel queued before them (see `runtime::capture`). Pinned tensors
//! live in the runtime's arena; `copy_into` is a device-to-device copy on the stream, which
//! a capture window records like any launch.

use std::time::{Duration, Instant};

use burn_backend::TensorMetadata;
use burn_cubecl::{CubeBackend, kernel::into_contiguous, ops::permute, tensor::CubeTensor};
use cubecl_common::stream_id::StreamId;

use crate::backend::{AnyTensor, BufferId, GraphBackend, GraphError, RuntimeFailure};
use crate::runtime::{
    CaptureError, CudaGraphDevice, CudaGraphHandle, CudaGraphRuntime, capture_begin_in_pool,
    capture_end, capture_stream, with_server,
};

/// The plain CubeCL backend on this crate's runtime.
pub type CudaCube = CubeBackend<CudaGraphRuntime, f32, i32, u8>;

fn runtime_err(err: CaptureError) -> GraphError {
    GraphError::Runtime {
        kind: failure_kind(&err),
        detail: err.to_string(),
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
        CaptureError::Server(_) => RuntimeFailure::Server,
        CaptureError::Driver { .. } => RuntimeFailure::Driver,
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

/// Bytes of a contiguous tensor's values.
fn value_bytes(tensor: &CubeTensor<CudaGraphRuntime>) -> u64 {
    (tensor.shape().num_elements() * tensor.dtype.size()) as u64
}

/// The dimensions of a tensor from the slowest-varying in memory to the fastest, if its
/// values fill its buffer exactly, each once (a contiguous layout or a permutation of
/// one, as a transposed weight has): then its bytes can be copied as they are.
fn dense_order(tensor: &CubeTensor<CudaGraphRuntime>) -> Option<Vec<usize>> {
    if !(tensor.is_contiguous_buffer() && tensor.is_nonoverlapping()) {
        return None;
    }
    let shape: &[usize] = tensor.meta.shape();
    order_of_strides(shape, tensor.meta.strides())
}

/// The dimensions from the slowest-varying in memory to the fastest, if the strides are
/// exactly those of that order (size-1 dimensions go anywhere).
fn order_of_strides(shape: &[usize], strides: &[usize]) -> Option<Vec<usize>> {
    let mut order: Vec<usize> = (0..shape.len()).collect();
    order.sort_by_key(|&dim| std::cmp::Reverse(strides[dim]));
    let mut expected = 1;
    for &dim in order.iter().rev() {
        if shape[dim] != 1 && strides[dim] != expected {
            return None;
        }
        expected *= shape[dim];
    }
    Some(order)
}

/// `src`'s values laid out in memory as `dst`, whose dimensions lie in memory in `order`
/// (its [`dense_order`]), in a buffer of their own (no copy when `src` already is).
fn in_layout_of(
    src: &CubeTensor<CudaGraphRuntime>,
    dst: &CubeTensor<CudaGraphRuntime>,
    order: &[usize],
) -> CubeTensor<CudaGraphRuntime> {
    if src.meta.strides() == dst.meta.strides() && dense_order(src).is_some() {
        return src.clone();
    }
    // Contiguous in `order` is `dst`'s memory order.
    into_contiguous(permute(src.clone(), order))
}

/// How long a capture waits for another thread's window to close before it gives up
/// (the step then runs eagerly, its reason `WindowState`). A window stays open for one
/// step's launches, milliseconds to a second.
const WINDOW_WAIT: Duration = Duration::from_secs(20);

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

impl GraphBackend for CudaCube {
    type Graph = CudaGraphHandle;

    fn supports_hardware_graphs(_device: &CudaGraphDevice) -> bool {
        true
    }

    /// The step runs under a fresh capture stream whose handles a private pool of the
    /// window serves, so the step reuses its own freed memory within the capture and the
    /// graph owns that pool whole (see `runtime::graph_pool`).
    fn capture<R>(
        device: &CudaGraphDevice,
        step: impl FnOnce() -> R,
    ) -> Result<(R, Result<Self::Graph, GraphError>), GraphError> {
        let stream = capture_stream();
        begin_when_free(device, stream).map_err(runtime_err)?;
        let window = OpenWindow { device, open: true };
        let out = stream.executes(step);
        Ok((out, window.close()))
    }

    /// Under a fresh stream, as `capture` runs its step (no pool: the handles land in
    /// the normal pools). With fusion on top, the step then meets the same cross-stream
    /// inputs as the captured one, so its fused kernels are compiled before the window.
    fn rehearse<R>(_device: &CudaGraphDevice, step: impl FnOnce() -> R) -> R {
        capture_stream().executes(step)
    }

    fn replay(graph: &Self::Graph) -> Result<(), GraphError> {
        graph.replay().map_err(runtime_err)
    }

    fn pin(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        map_cube(tensor, |tensor| {
            // Pinned as it lies (a permuted layout stays permuted): the steps that read the
            // pin launch the kernels, and autotune keys, that they launched before.
            let tensor = if dense_order(&tensor).is_some() {
                tensor
            } else {
                into_contiguous(tensor)
            };
            let bytes = value_bytes(&tensor);
            let src = tensor.handle.clone().binding();
            let device = tensor.device;
            let handle = with_server(&device, move |server| {
                let handle = server.arena_alloc(bytes)?;
                server.copy_device(src, handle.clone().binding(), bytes)?;
                Ok::<_, CaptureError>(handle)
            })
            .and_then(|r| r)
            .map_err(runtime_err)?;
            Ok(CubeTensor {
                client: tensor.client.clone(),
                handle,
                meta: tensor.meta.clone(),
                device,
                dtype: tensor.dtype,
                qparams: None,
            })
        })
    }

    fn copy_into(dst: &AnyTensor<Self>, src: &AnyTensor<Self>) -> Result<(), GraphError> {
        dst.check_same_kind(src)?;
        let (dst, src) = (cube(dst), cube(src));
        if dst.shape() != src.shape() || dst.dtype != src.dtype {
            return Err(GraphError::CopyMismatch(format!(
                "dst {:?} {:?}, src {:?} {:?}",
                dst.shape(),
                dst.dtype,
                src.shape(),
                src.dtype
            )));
        }
        let order = dense_order(dst).ok_or_else(|| {
            GraphError::CopyMismatch("the destination is not a dense (pinned) buffer".into())
        })?;
        let src = in_layout_of(src, dst, &order);
        let bytes = value_bytes(&src);
        let (from, to) = (src.handle.clone().binding(), dst.handle.clone().binding());
        with_server(&dst.device, move |server| {
            server.copy_device(from, to, bytes)
        })
        .and_then(|r| r)
        .map_err(runtime_err)
    }

    fn buffer_id(tensor: &AnyTensor<Self>) -> Option<BufferId> {
        let tensor = cube(tensor);
        let binding = tensor.handle.clone().binding();
        with_server(&tensor.device, move |server| server.buffer_address(binding))
            .ok()?
            .ok()
            .map(BufferId)
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
        let GraphError::Runtime { kind, detail } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*kind, RuntimeFailure::NeedsAllocation);
        assert!(detail.contains("512 bytes"), "{detail}");
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

    #[test]
    fn memory_order_follows_the_strides_of_dense_layouts_only() {
        assert_eq!(order_of_strides(&[2, 3], &[3, 1]), Some(vec![0, 1]));
        // A transposed [2, 3] buffer.
        assert_eq!(order_of_strides(&[3, 2], &[1, 3]), Some(vec![1, 0]));
        assert_eq!(
            order_of_strides(&[2, 3, 4], &[4, 8, 1]),
            Some(vec![1, 0, 2])
        );
        // A size-1 dimension may carry any stride.
        assert!(order_of_strides(&[2, 1, 3], &[3, 99, 1]).is_some());
        // Gaps (a slice of a wider buffer) and broadcasts are not dense.
        assert_eq!(order_of_strides(&[2, 3], &[4, 1]), None);
        assert_eq!(order_of_strides(&[2, 3], &[0, 1]), None);
    }
}
