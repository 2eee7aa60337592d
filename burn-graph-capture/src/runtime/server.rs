//! `CudaGraphServer`: the CubeCL `ComputeServer` of this runtime.
//!
//! One server per device runs on CubeCL's device worker thread. It owns the CUDA stream
//! (through [`StreamMap`]), the memory pools, the kernel cache and the profiler. Every
//! trait entry point binds the primary context to the calling thread first, because
//! cudarc's raw `result` calls (launch, copies, stream-ordered allocation) do not.
//!
//! Asynchronous entry points (`launch`, `write`, `initialize_memory`) cannot return
//! errors; theirs are parked on the stream and returned by the next `sync`, `read` or
//! `flush`, like stock cubecl-cuda. Kernel launch and compile errors during an autotune
//! profile go to the profiler instead, so a failing candidate does not poison the stream.

use super::{
    compile::{CudaGraphCompiler, KernelCache},
    copy::{CopyPlan, copy_to_device, copy_to_host, plan_copy},
    error::{launch_err, server_err},
    fence::Fence,
    storage::{GpuResource, GpuStorage, PinnedStagingController},
    stream::{ServerStream, StreamMap},
};
use cubecl_common::{
    backtrace::BackTrace,
    bytes::{AllocationProperty, Bytes},
    profile::ProfileDuration,
    stream_id::StreamId,
};
use cubecl_core::{
    future::{self, DynFut},
    server::{
        Binding, CopyDescriptor, CubeCount, ExecutionMode, Handle, IoError, KernelArguments,
        LaunchError, ProfileError, ProfilingToken, ServerCommunication, ServerError,
        ServerUtilities,
    },
};
use cubecl_runtime::{
    allocator::PitchedMemoryLayoutPolicy,
    compiler::CubeTask,
    logging::ServerLogger,
    memory_management::{ManagedMemoryHandle, MemoryAllocationMode, MemoryUsage},
    server::ComputeServer,
    storage::{ComputeStorage, ManagedResource},
    timestamp_profiler::TimestampProfiler,
};
use cudarc::driver::{CudaContext, result};
use std::{ffi::c_void, sync::Arc};

/// Host transfers above this size skip pinned staging unless asked (as stock does).
const PINNED_STAGING_LIMIT: usize = 100 * 1024 * 1024;

/// The compute server of [`CudaGraphRuntime`](super::CudaGraphRuntime).
#[derive(Debug)]
pub struct CudaGraphServer {
    ctx: Arc<CudaContext>,
    streams: StreamMap,
    kernels: KernelCache,
    timestamps: TimestampProfiler,
    logger: Arc<ServerLogger>,
    utilities: Arc<ServerUtilities<Self>>,
}

impl CudaGraphServer {
    pub(crate) fn new(
        ctx: Arc<CudaContext>,
        stream: ServerStream,
        kernels: KernelCache,
        utilities: ServerUtilities<Self>,
    ) -> Self {
        Self {
            ctx,
            streams: StreamMap::new(stream),
            kernels,
            timestamps: TimestampProfiler::default(),
            logger: utilities.logger.clone(),
            utilities: Arc::new(utilities),
        }
    }

    /// The context this server runs in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The server's stream state for `stream_id` (always the same CUDA stream).
    pub fn stream(&mut self, stream_id: StreamId) -> &mut ServerStream {
        self.streams.resolve(stream_id)
    }

    /// Number of kernels compiled by this server so far.
    pub fn compiled_kernels(&self) -> usize {
        self.kernels.compiled_count()
    }

    fn bind_context(&self) -> Result<(), ServerError> {
        self.ctx
            .bind_to_thread()
            .map_err(|err| server_err("cuCtxSetCurrent", err))
    }

    /// Takes the errors parked on the stream. When there were some, profiles in flight are
    /// marked wrong and the pools drop their free pages (as after any failure).
    fn take_errors(&mut self, stream_id: StreamId) -> Vec<ServerError> {
        let stream = self.streams.resolve(stream_id);
        let errors = core::mem::take(&mut stream.errors);
        if !errors.is_empty() {
            stream.gpu.cleanup(false);
            self.timestamps.error(ProfileError::Unknown {
                reason: format!("{errors:?}"),
                backtrace: BackTrace::capture(),
            });
        }
        errors
    }

    /// Binds the context and fails with the parked errors, if any: the entry for calls
    /// whose caller waits on the result (`read`, `sync`, `flush`).
    fn enter_checked(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        self.bind_context()?;
        let errors = self.take_errors(stream_id);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ServerError::ServerUnhealthy {
                errors,
                backtrace: BackTrace::capture(),
            })
        }
    }

    /// Parks an error of an asynchronous call on the stream.
    fn park(&mut self, stream_id: StreamId, error: ServerError) {
        self.streams.resolve(stream_id).errors.push(error);
    }

    fn launch_checked(
        &mut self,
        kernel: Box<dyn CubeTask<CudaGraphCompiler>>,
        count: CubeCount,
        args: KernelArguments,
        mode: ExecutionMode,
        stream_id: StreamId,
    ) -> Result<(), ServerError> {
        self.bind_context()?;
        if !args.tensor_maps.is_empty() {
            return Err(LaunchError::Unknown {
                reason: "CudaGraphRuntime does not support TMA tensor maps".into(),
                backtrace: BackTrace::capture(),
            }
            .into());
        }
        let mut kernel_id = kernel.id();
        kernel_id.mode(mode);
        let grid_constants = self.kernels.grid_constants();

        let grid = match count {
            CubeCount::Static(x, y, z) => (x, y, z),
            CubeCount::Dynamic(binding) => self.read_cube_count(binding, stream_id)?,
        };

        let stream = self.streams.resolve(stream_id);
        let info = &args.info;
        // With grid constants, static metadata and scalars go by value and only the
        // dynamic tail is uploaded; otherwise the whole block is uploaded.
        let (by_value, upload): (Option<*mut c_void>, &[u64]) = if grid_constants {
            let tail = info.data.get(info.dynamic_metadata_offset..).unwrap_or(&[]);
            (Some(info.data.as_ptr() as *mut c_void), tail)
        } else {
            (None, &info.data)
        };
        let metadata = if upload.is_empty() {
            None
        } else {
            Some(upload_metadata(stream, upload)?)
        };

        let mut pointers = Vec::with_capacity(args.buffers.len() + 1);
        for binding in args.buffers {
            pointers.push(resource(stream, binding)?.ptr);
        }
        if let Some(handle) = &metadata {
            pointers.push(resource(stream, handle.clone().binding())?.ptr);
        }
        let mut params: Vec<*mut c_void> = pointers
            .iter_mut()
            .map(|ptr| ptr as *mut u64 as *mut c_void)
            .collect();
        params.extend(by_value);

        let launched = launch_on(
            &mut self.kernels,
            stream,
            &kernel_id,
            kernel.as_ref(),
            mode,
            &self.logger,
            grid,
            &mut params,
        );
        // `metadata` may drop now: the pools reuse it only for later stream work.
        drop(metadata);
        stream.maybe_flush_drop_queue();

        if let Err(err) = launched {
            if self.timestamps.is_empty() {
                return Err(err.into());
            }
            self.timestamps.error(ProfileError::Launch(err));
        }
        Ok(())
    }

    /// `CubeCount::Dynamic`: reads the three counts back (a host sync, as in stock).
    fn read_cube_count(
        &mut self,
        binding: Binding,
        stream_id: StreamId,
    ) -> Result<(u32, u32, u32), ServerError> {
        let descriptor = CopyDescriptor::new(binding, [3].into(), [1].into(), 4);
        let bytes = future::block_on(self.read_now(vec![descriptor], stream_id))?;
        let data = bytes.first().map(|b| &b[..]).unwrap_or(&[]);
        if data.len() < 12 {
            return Err(IoError::Unknown {
                description: "dynamic cube count holds fewer than 3 u32".into(),
                backtrace: BackTrace::capture(),
            }
            .into());
        }
        let word = |i: usize| u32::from_ne_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        Ok((word(0), word(4), word(8)))
    }

    fn read_now(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream_id: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let stream = self.streams.resolve(stream_id);
        let mut outputs = Vec::with_capacity(descriptors.len());
        let mut keep_alive = Vec::with_capacity(descriptors.len());
        for descriptor in descriptors {
            match read_one(stream, descriptor) {
                Ok((bytes, binding)) => {
                    outputs.push(bytes);
                    keep_alive.push(binding);
                }
                Err(err) => return Box::pin(async move { Err(err.into()) }),
            }
        }
        let fence = stream.fence();
        Box::pin(async move {
            let waited = fence.wait();
            drop(keep_alive);
            waited?;
            Ok(outputs)
        })
    }
}

/// Resolves a binding to its device slice.
fn resource(stream: &mut ServerStream, binding: Binding) -> Result<GpuResource, IoError> {
    stream
        .gpu
        .get_resource(binding.memory, binding.offset_start, binding.offset_end)
}

/// Reserves pinned staging for `size` bytes, or `None` when the pinned pool can't.
fn reserve_pinned(stream: &mut ServerStream, size: usize) -> Option<Bytes> {
    let handle = stream.pinned.reserve(size as u64).ok()?;
    let binding = handle.binding();
    let resource = stream
        .pinned
        .get_resource(binding.clone(), None, None)
        .ok()?;
    let controller = PinnedStagingController::new(binding, resource);
    // SAFETY: the controller's memory covers at least `size` bytes (the pool reserved it).
    Some(unsafe { Bytes::from_controller(Box::new(controller), size) })
}

/// Host buffer for a transfer: pinned when small enough (or asked), else plain memory.
fn host_buffer(stream: &mut ServerStream, size: usize, force_pinned: bool) -> Bytes {
    if size == 0 || (!force_pinned && size > PINNED_STAGING_LIMIT) {
        return Bytes::from_bytes_vec(vec![0; size]);
    }
    reserve_pinned(stream, size).unwrap_or_else(|| Bytes::from_bytes_vec(vec![0; size]))
}

/// Queues the device→host copy of one tensor; returns the (not yet valid) bytes.
fn read_one(
    stream: &mut ServerStream,
    descriptor: CopyDescriptor,
) -> Result<(Bytes, Binding), IoError> {
    let plan = plan_copy(&descriptor.shape, &descriptor.strides, descriptor.elem_size)?;
    let source = resource(stream, descriptor.handle.clone())?;
    let mut bytes = host_buffer(stream, plan.host_bytes(), true);
    // SAFETY: `source` is a live pool slice covering the tensor; `bytes` is returned only
    // after the fence recorded behind this copy has been waited on.
    unsafe { copy_to_host(plan, source.ptr, &mut bytes, stream.stream.cu_stream())? };
    Ok((bytes, descriptor.handle))
}

/// Uploads per-launch metadata into a fresh device slice, through pinned staging.
fn upload_metadata(stream: &mut ServerStream, words: &[u64]) -> Result<Handle, ServerError> {
    // SAFETY: u64 words viewed as their bytes.
    let data = unsafe {
        std::slice::from_raw_parts(words.as_ptr() as *const u8, std::mem::size_of_val(words))
    };
    // Pinned when the pool can serve it; plain memory otherwise (the copy then stages
    // synchronously in the driver, still correct).
    let mut staging = host_buffer(stream, data.len(), true);
    staging.copy_from_slice(data);

    let handle = Handle::new(StreamId::current(), data.len() as u64);
    let reserved = stream.gpu.reserve(data.len() as u64)?;
    let cursor = stream.tick();
    stream
        .gpu
        .bind(reserved, handle.memory.clone(), cursor)
        .map_err(ServerError::from)?;
    let target = resource(stream, handle.clone().binding())?;
    // SAFETY: `target` is a fresh slice of `data.len()` bytes; `staging` is pinned and
    // kept alive by the drop queue until a fence after this copy.
    unsafe {
        copy_to_device(
            CopyPlan::Linear { bytes: data.len() },
            &staging,
            target.ptr,
            stream.stream.cu_stream(),
        )?
    };
    stream.drop_queue.push(staging);
    Ok(handle)
}

/// Compiles (first time) and launches one kernel on the stream.
#[allow(clippy::too_many_arguments)]
fn launch_on(
    kernels: &mut KernelCache,
    stream: &mut ServerStream,
    kernel_id: &cubecl_runtime::id::KernelId,
    kernel: &dyn CubeTask<CudaGraphCompiler>,
    mode: ExecutionMode,
    logger: &ServerLogger,
    grid: (u32, u32, u32),
    params: &mut [*mut c_void],
) -> Result<(), LaunchError> {
    let loaded = kernels.get_or_compile(kernel_id, kernel, mode, logger)?;
    if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
        // An empty grid is a no-op; the driver would reject it as invalid.
        return Ok(());
    }
    let block = (loaded.cube_dim.x, loaded.cube_dim.y, loaded.cube_dim.z);
    // SAFETY: `params` holds one pointer per kernel parameter, in the order the CUDA
    // dialect declares them (buffers, metadata buffer, by-value info struct); each points
    // to a value that outlives this call (the driver copies them at launch).
    unsafe {
        result::launch_kernel(
            loaded.function.cu_function(),
            grid,
            block,
            loaded.shared_mem_bytes,
            stream.stream.cu_stream(),
            params,
        )
    }
    .map_err(|err| launch_err("cuLaunchKernel", err))
}

impl ComputeServer for CudaGraphServer {
    type Kernel = Box<dyn CubeTask<CudaGraphCompiler>>;
    type Storage = GpuStorage;
    type MemoryLayoutPolicy = PitchedMemoryLayoutPolicy;
    type Info = ();

    fn logger(&self) -> Arc<ServerLogger> {
        self.logger.clone()
    }

    fn utilities(&self) -> Arc<ServerUtilities<Self>> {
        self.utilities.clone()
    }

    fn staging(&mut self, sizes: &[usize], stream_id: StreamId) -> Result<Vec<Bytes>, ServerError> {
        self.bind_context()?;
        let stream = self.streams.resolve(stream_id);
        Ok(sizes
            .iter()
            .map(|size| host_buffer(stream, *size, true))
            .collect())
    }

    fn initialize_memory(&mut self, memory: ManagedMemoryHandle, size: u64, stream_id: StreamId) {
        if let Err(err) = self.bind_context() {
            return self.park(stream_id, err);
        }
        let stream = self.streams.resolve(stream_id);
        let bound = stream.gpu.reserve(size).and_then(|reserved| {
            let cursor = stream.tick();
            stream.gpu.bind(reserved, memory, cursor)
        });
        if let Err(err) = bound {
            self.park(stream_id, err.into());
        }
    }

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream_id: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        if let Err(err) = self.enter_checked(stream_id) {
            return Box::pin(async move { Err(err) });
        }
        self.read_now(descriptors, stream_id)
    }

    fn write(&mut self, descriptors: Vec<(CopyDescriptor, Bytes)>, stream_id: StreamId) {
        if let Err(err) = self.bind_context() {
            return self.park(stream_id, err);
        }
        let stream = self.streams.resolve(stream_id);
        for (descriptor, data) in descriptors {
            let written = (|| -> Result<(), IoError> {
                let plan = plan_copy(&descriptor.shape, &descriptor.strides, descriptor.elem_size)?;
                let target = resource(stream, descriptor.handle)?;
                // File-backed bytes are not addressable memory: stage them first.
                let data = match data.property() {
                    AllocationProperty::File => {
                        let mut pinned = host_buffer(stream, data.len(), true);
                        data.copy_into(&mut pinned);
                        pinned
                    }
                    _ => data,
                };
                // SAFETY: `target` covers the tensor; `data` stays alive in the drop queue
                // until a fence behind this copy.
                unsafe { copy_to_device(plan, &data, target.ptr, stream.stream.cu_stream())? };
                stream.drop_queue.push(data);
                Ok(())
            })();
            if let Err(err) = written {
                stream.errors.push(err.into());
                return;
            }
        }
    }

    unsafe fn launch(
        &mut self,
        kernel: Self::Kernel,
        count: CubeCount,
        bindings: KernelArguments,
        mode: ExecutionMode,
        stream_id: StreamId,
    ) {
        if let Err(err) = self.launch_checked(kernel, count, bindings, mode, stream_id) {
            self.park(stream_id, err);
        }
    }

    fn flush(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        self.enter_checked(stream_id)?;
        let stream = self.streams.resolve(stream_id);
        let cuda_stream = stream.stream.clone();
        stream.drop_queue.flush(|| Fence::record(&cuda_stream));
        stream.gpu.storage().flush();
        Ok(())
    }

    fn sync(&mut self, stream_id: StreamId) -> DynFut<Result<(), ServerError>> {
        if let Err(err) = self.enter_checked(stream_id) {
            return Box::pin(async move { Err(err) });
        }
        let fence = self.streams.resolve(stream_id).fence();
        Box::pin(async move { fence.wait() })
    }

    fn get_resource(
        &mut self,
        binding: Binding,
        stream_id: StreamId,
    ) -> Result<ManagedResource<GpuResource>, ServerError> {
        self.bind_context()?;
        let stream = self.streams.resolve(stream_id);
        let memory = binding.memory.clone();
        let resource = resource(stream, binding)?;
        Ok(ManagedResource::new(memory, resource))
    }

    fn memory_usage(&mut self, stream_id: StreamId) -> Result<MemoryUsage, ServerError> {
        Ok(self.streams.resolve(stream_id).gpu.memory_usage())
    }

    fn memory_cleanup(&mut self, stream_id: StreamId) {
        if let Err(err) = self.bind_context() {
            return self.park(stream_id, err);
        }
        self.streams.resolve(stream_id).gpu.cleanup(true);
    }

    fn start_profile(&mut self, stream_id: StreamId) -> Result<ProfilingToken, ServerError> {
        future::block_on(self.sync(stream_id))?;
        Ok(self.timestamps.start())
    }

    fn end_profile(
        &mut self,
        stream_id: StreamId,
        token: ProfilingToken,
    ) -> Result<ProfileDuration, ProfileError> {
        if let Err(err) = future::block_on(self.sync(stream_id)) {
            self.timestamps.error(ProfileError::Server(Box::new(err)));
        }
        self.timestamps.stop(token)
    }

    fn allocation_mode(&mut self, mode: MemoryAllocationMode, stream_id: StreamId) {
        self.streams.resolve(stream_id).gpu.mode(mode);
    }
}

impl ServerCommunication for CudaGraphServer {
    const SERVER_COMM_ENABLED: bool = false;
}
