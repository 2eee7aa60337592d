//! Server start-up: environment checks, primary context, properties, stream and pools.
//!
//! CubeCL's `DeviceService::init` cannot return an error, so [`try_init_server`] does all
//! fallible work and returns a typed [`InitError`]; `init` turns it into a panic whose
//! message names the missing piece. [`CudaGraphRuntime::try_client`](super::CudaGraphRuntime::try_client)
//! runs the same checks first, so callers can get the error as a value instead.

use super::{
    compile::{KernelCache, nvrtc_options},
    environment::check_environment,
    error::InitError,
    properties::{DeviceAttributes, device_properties, memory_properties},
    server::CudaGraphServer,
    storage::{GpuStorage, PinnedStorage, pinned::PINNED_ALIGNMENT},
    stream::ServerStream,
    window::Window,
};
use cubecl_common::device::{DeviceId, DeviceService, ServerUtilitiesHandle};
use cubecl_core::{MemoryConfiguration, ir::MemoryDeviceProperties, server::ServerUtilities};
use cubecl_runtime::{
    allocator::PitchedMemoryLayoutPolicy,
    logging::ServerLogger,
    memory_management::{
        MemoryAllocationMode, MemoryManagement, MemoryManagementOptions,
        drop_queue::PendingDropQueue,
    },
};
use cudarc::driver::{CudaContext, sys::CUdevice_attribute};
use std::sync::Arc;

/// Number of CUDA devices, checking the driver library first.
pub fn device_count() -> Result<usize, InitError> {
    // SAFETY: only tries to dlopen libcuda.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(InitError::DriverLibraryMissing);
    }
    cudarc::driver::result::init().map_err(|e| InitError::driver("cuInit", e))?;
    CudaContext::device_count()
        .map(|n| n as usize)
        .map_err(|e| InitError::driver("cuDeviceGetCount", e))
}

/// Queries what the property table needs.
fn query_attributes(ctx: &CudaContext) -> Result<DeviceAttributes, InitError> {
    use CUdevice_attribute::*;
    let get = |attr| {
        ctx.attribute(attr)
            .map(|v| v.max(0) as u32)
            .map_err(|e| InitError::driver("cuDeviceGetAttribute", e))
    };
    let (major, minor) = (
        get(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        get(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    Ok(DeviceAttributes {
        arch_version: major * 10 + minor,
        warp_size: get(CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
        max_shared_memory_per_block_optin: get(
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )? as usize,
        max_threads_per_block: get(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_block_dim: (
            get(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
            get(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
            get(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
        ),
        max_grid_dim: (
            get(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
            get(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
            get(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
        ),
        multiprocessor_count: get(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        total_memory: ctx
            .total_mem()
            .map_err(|e| InitError::driver("cuDeviceTotalMem", e))? as u64,
    })
}

/// Builds the server for `device_id`, or says which piece is missing.
pub fn try_init_server(device_id: DeviceId) -> Result<CudaGraphServer, InitError> {
    let toolkit = check_environment()?;
    let index = device_id.index_id as usize;
    let count = device_count()?;
    if index >= count {
        return Err(InitError::NoSuchDevice { index, count });
    }

    // Retains the device's primary context (shared with the CUDA runtime API and with stock
    // cubecl-cuda) and binds it to this thread.
    let ctx =
        CudaContext::new(index).map_err(|e| InitError::driver("cuDevicePrimaryCtxRetain", e))?;
    // This runtime never uses `CudaSlice`; it orders all work on its single stream itself.
    // Event tracking would add cross-stream waits that break stream capture
    // (CUDA_ERROR_STREAM_CAPTURE_ISOLATION), so it is turned off.
    // SAFETY: nothing in this crate relies on cudarc's automatic event tracking.
    unsafe { ctx.disable_event_tracking() };

    let attrs = query_attributes(&ctx)?;
    let (properties, compilation_options) =
        device_properties(&attrs, cudarc::driver::sys::CUDA_VERSION);
    let mem_props = memory_properties(&attrs);
    let stream = ctx
        .new_stream()
        .map_err(|e| InitError::driver("cuStreamCreate", e))?;

    let logger = Arc::new(ServerLogger::default());
    let gpu = GpuStorage::pool(
        stream.clone(),
        &mem_props,
        logger.clone(),
        MemoryManagementOptions::new("CudaGraph device memory"),
    );
    // Pinned pages use the same pool layout as the device; hosts have at least as much RAM.
    let pinned = MemoryManagement::from_configuration(
        PinnedStorage::new(ctx.clone()),
        &MemoryDeviceProperties {
            max_page_size: mem_props.max_page_size,
            alignment: PINNED_ALIGNMENT as u64,
        },
        MemoryConfiguration::default(),
        logger.clone(),
        MemoryManagementOptions::new("CudaGraph pinned host memory")
            .mode(MemoryAllocationMode::Auto),
    );
    let arena = super::arena::new_arena(stream.clone(), &mem_props, logger.clone());
    let server_stream = ServerStream {
        stream,
        gpu,
        arena,
        graph_pools: Default::default(),
        memory_props: mem_props.clone(),
        window: Window::Closed,
        pinned,
        drop_queue: PendingDropQueue::default(),
        errors: Vec::new(),
        cursor: 0,
    };

    let kernels = KernelCache::new(
        ctx.clone(),
        compilation_options,
        properties.clone(),
        nvrtc_options(
            attrs.arch_version,
            &toolkit.include,
            toolkit.cccl_include.as_deref(),
        ),
    );
    let policy = PitchedMemoryLayoutPolicy::new(properties.memory.alignment as usize);
    let utilities = ServerUtilities::new(properties, logger, (), policy);
    Ok(CudaGraphServer::new(ctx, server_stream, kernels, utilities))
}

impl DeviceService for CudaGraphServer {
    fn init(device_id: DeviceId) -> Self {
        match try_init_server(device_id) {
            Ok(server) => server,
            // The trait has no error channel; `CudaGraphRuntime::try_client` offers one.
            Err(err) => panic!("{err}"),
        }
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        ComputeServerUtilities::utilities_handle(self)
    }
}

/// Small shim: `ComputeServer::utilities` returns a typed `Arc`; the device service wants
/// it type-erased.
trait ComputeServerUtilities {
    fn utilities_handle(&self) -> ServerUtilitiesHandle;
}

impl ComputeServerUtilities for CudaGraphServer {
    fn utilities_handle(&self) -> ServerUtilitiesHandle {
        cubecl_runtime::server::ComputeServer::utilities(self) as ServerUtilitiesHandle
    }
}
