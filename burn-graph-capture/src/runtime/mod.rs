//! `CudaGraphRuntime`: this crate's CubeCL runtime for NVIDIA GPUs.
//!
//! cubecl-cuda 0.10 keeps its stream and memory pools private, so nothing outside it can
//! capture its launches; this runtime owns them instead (see ARCHITECTURE.md, layers). Outside a
//! capture window it behaves like stock cubecl-cuda: NVRTC-compiled CUDA C++ from
//! cubecl-cpp, pooled device memory, pinned staging for transfers.
//!
//! Modules, one job each:
//! - [`device`]: the device type and its own `DeviceId` type id;
//! - `environment`: finds libcuda, NVRTC and the toolkit headers;
//! - [`properties`]: which compute capability enables which CubeCL feature;
//! - `init`: builds a server (context, stream, pools, compiler);
//! - `server`: the `ComputeServer` (`server/mod.rs`), its kernel launches (`launch`), the
//!   stream's staging, reads and binding resolution (`stream_io`), the capture API
//!   (`graphs`: windows, replays, releases, the arena, device copies) and other threads'
//!   work held while a window is open (`deferred`);
//! - `stream`: the one CUDA stream every `StreamId` maps to;
//! - `storage`: device and pinned pages for the pools;
//! - `compile`: NVRTC compilation and the kernel cache; `source_kernel`: kernels written
//!   in CUDA C (the persistent LSTM recurrence), compiled and launched like CubeCL's;
//! - `copy`: host↔device copies; `fence`: host-waitable stream points;
//! - [`window`]: a capture window's life (closed, recording, broken), what it retains,
//!   the graphs it leaves (data only: it imports nothing from the server);
//! - [`client`]: what callers run on a device's server: capture begin/end, replays and
//!   releases through [`CudaGraphHandle`], tasks in queue order;
//! - [`fault`]: failures injected at each stage of a graph's life (tests, feature
//!   `fault-injection`);
//! - [`arena`]: the pool of pinned tensors (fixed addresses);
//! - [`nccl`]: NCCL communicators on the stream, abortable from any thread;
//! - [`error`]: typed errors.
//!
//! How capture fits the eager parts:
//! - one stream: the server holds one `ServerStream`, and every `StreamId`'s work runs on
//!   it; a window begins/ends capture on that one stream (no cross-stream waits exist);
//! - frees: `GpuStorage::hold_frees` keeps page frees queued while a window is open, and the
//!   drop queue is not flushed inside a window;
//! - allocations: both storages refuse new pages inside a window;
//! - retention: launches, copies and metadata uploads inside a window hand their bindings
//!   and staging to the window, which becomes the graph's retention list;
//! - arena: a second `MemoryManagement<GpuStorage>` beside `ServerStream::gpu`; its handles
//!   carry `arena::ARENA_STREAM` so `server::resource` knows which pool resolves them.

pub mod arena;
pub mod blas;
pub mod client;
mod compile;
mod copy;
pub mod device;
mod environment;
pub mod error;
pub mod fault;
mod fence;
pub mod graph_pool;
mod init;
mod memory_lock;
pub mod nccl;
pub mod properties;
mod ptx_cache;
mod server;
mod source_kernel;
mod storage;
mod stream;
pub mod window;

pub use client::{
    CudaGraphHandle, capture_begin, capture_begin_in_pool, capture_end, keep_server_polling,
    submit_to_server, try_with_server, with_server,
};
pub use compile::{CudaGraphCompiler, nvrtc_options};
pub use device::{CUDA_GRAPH_DEVICE_TYPE_ID, CudaGraphDevice};
pub use environment::{ToolkitPaths, check_environment, resolve_toolkit};
pub use error::{CaptureError, InitError, NcclFailure, NcclMissing};
pub use graph_pool::capture_stream;
pub use memory_lock::memory_at_rest;
pub use server::{CollectiveOperand, CudaGraphServer};
pub use source_kernel::SourceKernel;
pub use storage::GpuResource;
pub use window::GraphInfo;

use cubecl_common::device::Device;
use cubecl_core::{
    Runtime,
    client::ComputeClient,
    device::DeviceId,
    ir::{ContiguousElements, MatrixLayout, MmaProperties, TargetProperties},
    zspace::{Shape, Strides, striding::has_pitched_row_major_strides},
};
use cubecl_cpp::cuda::mma::contiguous_elements_cuda;

/// The CubeCL runtime of this crate, for NVIDIA GPUs.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaGraphRuntime;

impl CudaGraphRuntime {
    /// Like [`Runtime::client`], but checks the CUDA installation and the device first and
    /// returns what is missing as an error instead of panicking in the worker thread.
    pub fn try_client(device: &CudaGraphDevice) -> Result<ComputeClient<Self>, InitError> {
        check_environment()?;
        let count = init::device_count()?;
        if device.index >= count {
            return Err(InitError::NoSuchDevice {
                index: device.index,
                count,
            });
        }
        Ok(ComputeClient::load(device))
    }

    /// Number of CUDA devices visible to this process.
    pub fn device_count() -> Result<usize, InitError> {
        init::device_count()
    }
}

impl Runtime for CudaGraphRuntime {
    type Compiler = CudaGraphCompiler;
    type Server = CudaGraphServer;
    type Device = CudaGraphDevice;

    fn client(device: &Self::Device) -> ComputeClient<Self> {
        ComputeClient::load(device)
    }

    fn name(_client: &ComputeClient<Self>) -> &'static str {
        "cuda-graph"
    }

    fn require_array_lengths() -> bool {
        true
    }

    fn max_cube_count() -> (u32, u32, u32) {
        (i32::MAX as u32, u16::MAX as u32, u16::MAX as u32)
    }

    fn can_read_tensor(shape: &Shape, strides: &Strides) -> bool {
        has_pitched_row_major_strides(shape, strides)
    }

    fn target_properties() -> TargetProperties {
        TargetProperties {
            mma: MmaProperties {
                register_size_bits: 32,
                const_plane_size: 32,
                register_layout_a: MatrixLayout::RowMajor,
                register_layout_b: MatrixLayout::ColMajor,
                register_layout_acc: MatrixLayout::RowMajor,
                register_duplication_a: 1,
                register_duplication_b: 1,
                register_duplication_acc: 1,
                contiguous_elements: ContiguousElements::new(contiguous_elements_cuda),
            },
        }
    }

    fn enumerate_devices(type_id: u16, _info: &()) -> Vec<DeviceId> {
        if type_id != CUDA_GRAPH_DEVICE_TYPE_ID && type_id != 0 {
            return Vec::new();
        }
        let count = init::device_count().unwrap_or(0);
        (0..count)
            .map(|index| CudaGraphDevice::new(index).to_id())
            .collect()
    }
}
