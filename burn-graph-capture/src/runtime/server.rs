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

use super::fault::{self, FaultStage};
use super::{
    capture::{CaptureWindow, CapturedGraph, GraphInfo},
    compile::{CudaGraphCompiler, KernelCache},
    copy::{CopyPlan, copy_to_device, copy_to_host, plan_copy},
    deferred::{Deferred, after_window},
    error::{CaptureError, capture_as_server_err, launch_err, server_err},
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
use cudarc::driver::{
    CudaContext, result,
    sys::{CUgraphInstantiate_flags, CUstreamCaptureMode},
};
use std::{collections::HashMap, ffi::c_void, sync::Arc};

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
    /// Instantiated graphs by id, with what each retains (see `capture.rs`).
    graphs: HashMap<u64, CapturedGraph>,
    next_graph: u64,
    /// Other streams' work held while a window is open (see `deferred.rs`).
    deferred: Vec<Deferred>,
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
            graphs: HashMap::new(),
            next_graph: 0,
            deferred: Vec::new(),
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

    /// Whether a window is open that does not record `stream_id`'s work: that work is
    /// held until the window closes (see `deferred.rs`).
    fn holds(&mut self, stream_id: StreamId) -> bool {
        matches!(&self.streams.resolve(stream_id).window, Some(window) if !window.records(stream_id))
    }

    /// Runs the work held during the window that just closed, in submission order, each
    /// call under the stream id that submitted it. Errors are parked as for any call.
    fn run_deferred(&mut self) {
        for work in std::mem::take(&mut self.deferred) {
            work.stream_id().executes(|| match work {
                Deferred::Launch {
                    kernel,
                    count,
                    args,
                    mode,
                    stream_id,
                } => {
                    if let Err(err) = self.launch_checked(kernel, count, args, mode, stream_id) {
                        self.park(stream_id, err);
                    }
                }
                Deferred::Write {
                    descriptors,
                    stream_id,
                } => self.write(descriptors, stream_id),
                Deferred::Read {
                    descriptors,
                    stream_id,
                    reply,
                } => {
                    // A reader that stopped waiting is no error.
                    let _ = reply.send(self.read(descriptors, stream_id));
                }
                Deferred::Sync { stream_id, reply } => {
                    let _ = reply.send(self.sync(stream_id));
                }
                Deferred::Replay { id, stream_id } => {
                    if let Err(err) = self.replay(id) {
                        self.park(stream_id, capture_as_server_err(err));
                    }
                }
                Deferred::Copy {
                    src,
                    dst,
                    bytes,
                    stream_id,
                } => {
                    if let Err(err) = self.copy_device(src, dst, bytes) {
                        self.park(stream_id, capture_as_server_err(err));
                    }
                }
            });
        }
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

    /// Parks an error of an asynchronous call on the stream; inside a capture window it
    /// breaks the window instead (the window reports it at `capture_end`).
    fn park(&mut self, stream_id: StreamId, error: ServerError) {
        let stream = self.streams.resolve(stream_id);
        let refused = stream.gpu.storage().refused_bytes();
        let refused = refused.or(stream.arena.storage().refused_bytes());
        let pool = stream.window.as_ref().and_then(|window| window.pool);
        let refused = refused.or_else(|| {
            let pool = stream.graph_pools.get_mut(&pool?)?;
            pool.storage().refused_bytes()
        });
        match &mut stream.window {
            Some(window) if window.records(stream_id) => window.break_with(match refused {
                Some(bytes) => CaptureError::NeedsAllocation { bytes },
                None => CaptureError::Server(error.to_string()),
            }),
            _ => stream.errors.push(error),
        }
    }

    /// Breaks the open window (if any) with `error`; returns whether one was open.
    fn break_window(&mut self, stream_id: StreamId, error: CaptureError) -> bool {
        match &mut self.streams.resolve(stream_id).window {
            Some(window) => {
                window.break_with(error);
                true
            }
            None => false,
        }
    }

    /// Refuses a host synchronisation inside a window: breaks it and returns the error.
    fn refuse_sync(&mut self, stream_id: StreamId, what: &'static str) -> Option<ServerError> {
        let error = CaptureError::HostSync(what);
        if !self.break_window(stream_id, error.clone()) {
            return None;
        }
        Some(capture_as_server_err(error))
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

        let capturing = match &self.streams.resolve(stream_id).window {
            // A broken window records nothing more; `capture_end` reports why.
            Some(window) if window.broken.is_some() => return Ok(()),
            Some(_) => true,
            None => false,
        };
        if capturing {
            if !self.kernels.contains(&kernel_id) {
                let name = kernel.name().to_string();
                self.break_window(stream_id, CaptureError::FirstCompile(name));
                return Ok(());
            }
            if matches!(count, CubeCount::Dynamic(_)) {
                self.break_window(stream_id, CaptureError::HostSync("dynamic cube count"));
                return Ok(());
            }
        }

        let grid = match count {
            CubeCount::Static(x, y, z) => (x, y, z),
            CubeCount::Dynamic(binding) => self.read_cube_count(binding, stream_id)?,
        };
        // Which kernel ran, for diffing two runs' launch sequences (autotune benchmarks
        // show as `profiling`).
        tracing::trace!(
            target: "burn_graph_capture::launch",
            kernel = kernel.name(),
            ?grid,
            buffers = args.buffers.len(),
            profiling = !self.timestamps.is_empty(),
            capturing,
        );

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
        let metadata_binding = metadata.as_ref().map(|handle| handle.clone().binding());
        for binding in args.buffers.into_iter().chain(metadata_binding) {
            let slice = resource(stream, binding.clone())?;
            stream.keep_for_window(binding, &slice);
            pointers.push(slice.ptr);
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
        // `metadata` may drop now: the pools reuse it only for later stream work (inside a
        // window the retention list above keeps it).
        drop(metadata);
        if launched.is_ok()
            && let Some(window) = &mut stream.window
        {
            window.launches += 1;
        }
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
        // (never inside a window: `launch_checked` refuses dynamic counts there)
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

/// Resolves a binding to its device slice, in the pool its handle's stream names (the
/// arena, a graph's private pool, or the normal pools).
fn resource(stream: &mut ServerStream, binding: Binding) -> Result<GpuResource, IoError> {
    stream.pool_for(&binding.stream).get_resource(
        binding.memory,
        binding.offset_start,
        binding.offset_end,
    )
}

/// Pinned staging for a copy the stream will read later. Inside a window it must come from
/// pinned pages that already exist (pageable copies cannot be captured, and a new pinned
/// page is an allocation); a miss breaks the window.
fn staging_buffer(stream: &mut ServerStream, size: usize) -> Result<Bytes, ServerError> {
    if !stream.capturing() {
        return Ok(host_buffer(stream, size, true));
    }
    match reserve_pinned(stream, size) {
        Some(bytes) => Ok(bytes),
        None => {
            let error = CaptureError::StagingExhausted { bytes: size as u64 };
            if let Some(window) = &mut stream.window {
                window.break_with(error.clone());
            }
            Err(capture_as_server_err(error))
        }
    }
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
    let mut staging = staging_buffer(stream, data.len())?;
    staging.copy_from_slice(data);

    let owner = StreamId::current();
    let handle = Handle::new(owner, data.len() as u64);
    let cursor = stream.tick();
    let pool = stream.pool_for(&owner);
    let reserved = pool.reserve(data.len() as u64)?;
    pool.bind(reserved, handle.memory.clone(), cursor)
        .map_err(ServerError::from)?;
    let target = resource(stream, handle.clone().binding())?;
    // SAFETY: `target` is a fresh slice of `data.len()` bytes; `staging` is pinned and
    // kept alive by the drop queue until a fence after this copy (inside a window: by the
    // graph's retention, since every replay reads it again).
    unsafe {
        copy_to_device(
            CopyPlan::Linear { bytes: data.len() },
            &staging,
            target.ptr,
            stream.stream.cu_stream(),
        )?
    };
    stream.release_staging(staging);
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
        let held = self.holds(stream_id);
        let stream = self.streams.resolve(stream_id);
        if held {
            // The write runs after the window: pinned if a free page has room, else
            // plain memory (new pinned pages are refused while the window is open).
            return Ok(sizes
                .iter()
                .map(|size| host_buffer(stream, *size, false))
                .collect());
        }
        sizes
            .iter()
            .map(|size| staging_buffer(stream, *size))
            .collect()
    }

    fn initialize_memory(&mut self, memory: ManagedMemoryHandle, size: u64, stream_id: StreamId) {
        if let Err(err) = self.bind_context() {
            return self.park(stream_id, err);
        }
        let recorded =
            matches!(&self.streams.resolve(stream_id).window, Some(w) if w.records(stream_id));
        if recorded && fault::trip(FaultStage::WindowAllocation) {
            self.break_window(stream_id, CaptureError::NeedsAllocation { bytes: size });
        }
        let stream = self.streams.resolve(stream_id);
        let cursor = stream.tick();
        // Handles are created on the caller's stream, so `stream_id` names their pool.
        let pool = stream.pool_for(&stream_id);
        let bound = pool
            .reserve(size)
            .and_then(|reserved| pool.bind(reserved, memory, cursor));
        if let Err(err) = bound {
            self.park(stream_id, err.into());
        }
    }

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream_id: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        if self.holds(stream_id) {
            let (reply, wait) = oneshot::channel();
            self.deferred.push(Deferred::Read {
                descriptors,
                stream_id,
                reply,
            });
            return after_window(wait);
        }
        if let Some(err) = self.refuse_sync(stream_id, "read") {
            return Box::pin(async move { Err(err) });
        }
        if let Err(err) = self.enter_checked(stream_id) {
            return Box::pin(async move { Err(err) });
        }
        self.read_now(descriptors, stream_id)
    }

    fn write(&mut self, descriptors: Vec<(CopyDescriptor, Bytes)>, stream_id: StreamId) {
        if self.holds(stream_id) {
            self.deferred.push(Deferred::Write {
                descriptors,
                stream_id,
            });
            return;
        }
        if let Err(err) = self.bind_context() {
            return self.park(stream_id, err);
        }
        for (descriptor, data) in descriptors {
            let stream = self.streams.resolve(stream_id);
            if matches!(&stream.window, Some(window) if window.broken.is_some()) {
                return;
            }
            let written = (|| -> Result<(), IoError> {
                let plan = plan_copy(&descriptor.shape, &descriptor.strides, descriptor.elem_size)?;
                let target = resource(stream, descriptor.handle.clone())?;
                if let Some(window) = &mut stream.window {
                    window
                        .retention
                        .keep(descriptor.handle, target.ptr, target.size);
                }
                // File-backed bytes are not addressable memory: stage them first. Inside a
                // window every source must be pinned (pageable copies cannot be captured).
                let data = match data.property() {
                    AllocationProperty::File => {
                        let mut pinned = host_buffer(stream, data.len(), true);
                        data.copy_into(&mut pinned);
                        pinned
                    }
                    AllocationProperty::Pinned => data,
                    _ if stream.capturing() => {
                        let mut pinned =
                            staging_buffer(stream, data.len()).map_err(|err| IoError::Unknown {
                                description: err.to_string(),
                                backtrace: BackTrace::capture(),
                            })?;
                        pinned.copy_from_slice(&data);
                        pinned
                    }
                    _ => data,
                };
                // SAFETY: `target` covers the tensor; `data` stays alive in the drop queue
                // until a fence behind this copy.
                unsafe { copy_to_device(plan, &data, target.ptr, stream.stream.cu_stream())? };
                stream.release_staging(data);
                Ok(())
            })();
            if let Err(err) = written {
                return self.park(stream_id, err.into());
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
        if self.holds(stream_id) {
            self.deferred.push(Deferred::Launch {
                kernel,
                count,
                args: bindings,
                mode,
                stream_id,
            });
            return;
        }
        if let Err(err) = self.launch_checked(kernel, count, bindings, mode, stream_id) {
            self.park(stream_id, err);
        }
    }

    fn flush(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        if self.streams.resolve(stream_id).capturing() {
            // Deferred: flushing waits on fences and frees pages (see `capture_end`).
            return Ok(());
        }
        self.enter_checked(stream_id)?;
        let stream = self.streams.resolve(stream_id);
        let cuda_stream = stream.stream.clone();
        stream.drop_queue.flush(|| Fence::record(&cuda_stream));
        stream.gpu.storage().flush();
        Ok(())
    }

    fn sync(&mut self, stream_id: StreamId) -> DynFut<Result<(), ServerError>> {
        if self.holds(stream_id) {
            let (reply, wait) = oneshot::channel();
            self.deferred.push(Deferred::Sync { stream_id, reply });
            return after_window(wait);
        }
        if let Some(err) = self.refuse_sync(stream_id, "sync") {
            return Box::pin(async move { Err(err) });
        }
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
        let stream = self.streams.resolve(stream_id);
        if !stream.capturing() {
            stream.gpu.cleanup(true);
            collect_graph_pools(stream);
        }
    }

    fn start_profile(&mut self, stream_id: StreamId) -> Result<ProfilingToken, ServerError> {
        if self.holds(stream_id) {
            // Waiting here for the window would block the thread that must close it.
            return Err(ServerError::Generic {
                reason: "profiling while another thread's capture window is open".into(),
                backtrace: BackTrace::capture(),
            });
        }
        future::block_on(self.sync(stream_id))?;
        Ok(self.timestamps.start())
    }

    fn end_profile(
        &mut self,
        stream_id: StreamId,
        token: ProfilingToken,
    ) -> Result<ProfileDuration, ProfileError> {
        if self.holds(stream_id) {
            self.timestamps.error(ProfileError::Unknown {
                reason: "profile ended while another thread's capture window was open".into(),
                backtrace: BackTrace::capture(),
            });
        } else if let Err(err) = future::block_on(self.sync(stream_id)) {
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

/// Sets or clears what a capture window changes on the stream's storages, the window's
/// private `pool` included: page frees are held, new device, arena and pool pages come
/// from relaxed-mode `cuMemAlloc`, and new pinned pages are refused. Clearing flushes the
/// pool's held frees.
fn set_window_flags(stream: &mut ServerStream, pool: Option<StreamId>, open: bool) {
    stream.gpu.storage().hold_frees(open);
    stream.gpu.storage().set_capturing(open);
    stream.arena.storage().hold_frees(open);
    stream.arena.storage().set_capturing(open);
    stream.pinned.storage().refuse_allocs(open);
    if let Some(memory) = pool.and_then(|pool| stream.graph_pools.get_mut(&pool)) {
        memory.storage().hold_frees(open);
        memory.storage().set_capturing(open);
        if !open {
            memory.storage().flush();
        }
    }
}

/// Drops retired graph pools that nothing uses any more, after the stream has finished
/// the work queued so far (their pages are freed).
fn collect_graph_pools(stream: &mut ServerStream) {
    if stream.graph_pools.is_empty() {
        return;
    }
    if let Err(err) = stream.fence().wait() {
        tracing::warn!("CudaGraphRuntime: waiting before dropping graph pools failed: {err}");
        return;
    }
    stream.graph_pools.collect();
}

/// Frees a graph and what it retains once the stream has finished every queued replay.
///
/// `cuGraphExecDestroy` alone would be safe ("if the executable graph is in-flight, it
/// will not be terminated, but rather freed asynchronously on completion"), but the
/// retained pinned staging is host memory that the next eager write could reuse, so the
/// release waits for the stream first.
fn release_now(stream: &mut ServerStream, graph: CapturedGraph) {
    if let Err(err) = stream.fence().wait() {
        tracing::warn!("CudaGraphRuntime: waiting before a graph release failed: {err}");
    }
    let pool = graph.pool;
    drop(graph);
    if let Some(pool) = pool {
        stream.graph_pools.retire(&pool);
        stream.graph_pools.collect();
    }
}

fn capture_server_err(err: ServerError) -> CaptureError {
    CaptureError::Server(err.to_string())
}

/// Capture windows, replay and the arena (see `capture.rs` and `arena.rs`). Reached from
/// outside through `DeviceHandle::<CudaGraphServer>::submit_blocking`, so every call is
/// ordered with the kernels and copies queued before it.
impl CudaGraphServer {
    fn main_stream(&mut self) -> &mut ServerStream {
        self.streams.resolve(StreamId::current())
    }

    /// Whether a capture window is open.
    pub fn is_capturing(&mut self) -> bool {
        self.main_stream().capturing()
    }

    /// Opens a capture window on the stream (THREAD_LOCAL mode; see `capture.rs`).
    ///
    /// Deferred host work (drop queue, page frees) is settled first, outside the window.
    ///
    /// With `pool`, the window records into a private pool serving handles created on that
    /// stream (see `graph_pool.rs`); the caller runs the step under it.
    pub fn capture_begin(&mut self, pool: Option<StreamId>) -> Result<(), CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        if let Some(window) = &self.main_stream().window {
            return Err(if window.owner == Some(StreamId::current()) {
                CaptureError::AlreadyCapturing
            } else {
                CaptureError::WindowBusy
            });
        }
        let errors = self.take_errors(StreamId::current());
        if !errors.is_empty() {
            return Err(CaptureError::StreamUnhealthy(format!("{errors:?}")));
        }
        let logger = self.logger.clone();
        let stream = self.main_stream();
        let cuda_stream = stream.stream.clone();
        stream.drop_queue.flush(|| Fence::record(&cuda_stream));
        stream.gpu.storage().flush();
        stream.arena.storage().flush();
        // Pools of released graphs whose last handle has gone since.
        collect_graph_pools(stream);
        if let Some(pool) = pool {
            if stream.graph_pools.contains(&pool) {
                return Err(CaptureError::Unsupported("reusing a capture stream"));
            }
            let (cuda, props) = (stream.stream.clone(), stream.memory_props.clone());
            stream.graph_pools.open(pool, cuda, &props, logger);
        }
        set_window_flags(stream, pool, true);
        // "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: ... potentially unsafe API calls are
        // prohibited only from this thread": the worker thread is the only one that records.
        let begun = if fault::trip(FaultStage::CaptureBegin) {
            Err(fault::injected_driver_error())
        } else {
            cuda_stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        };
        if let Err(err) = begun {
            set_window_flags(stream, pool, false);
            if let Some(pool) = pool {
                stream.graph_pools.retire(&pool);
            }
            return Err(CaptureError::driver("cuStreamBeginCapture", err));
        }
        stream.window = Some(CaptureWindow {
            pool,
            owner: Some(StreamId::current()),
            ..CaptureWindow::default()
        });
        Ok(())
    }

    /// Closes the window: ends the capture, instantiates and uploads the graph, and keeps it
    /// with everything the window retained. A broken window's graph is thrown away and its
    /// first error returned; the stream has left capture mode either way.
    pub fn capture_end(&mut self) -> Result<(u64, GraphInfo), CaptureError> {
        if self.holds(StreamId::current()) {
            // Another thread's window: only its owner closes it.
            return Err(CaptureError::NotCapturing);
        }
        let closed = self.close_window();
        // Other threads' work held during the window runs now, after everything the
        // window recorded was queued... and before anything queued later.
        self.run_deferred();
        closed
    }

    /// Ends the capture and instantiates what it recorded (see [`Self::capture_end`]).
    fn close_window(&mut self) -> Result<(u64, GraphInfo), CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        let stream = self.main_stream();
        let Some(mut window) = stream.window.take() else {
            return Err(CaptureError::NotCapturing);
        };
        let ended = stream.stream.end_capture(CUgraphInstantiate_flags(0));
        // Injected: the stream has left capture mode; what it recorded is dropped.
        let ended = match ended {
            Ok(_) if fault::trip(FaultStage::EndInstantiate) => Err(fault::injected_driver_error()),
            ended => ended,
        };
        set_window_flags(stream, window.pool, false);
        let graph = match (window.broken.take(), ended) {
            (Some(err), _) => Err(err),
            (None, Err(err)) => Err(CaptureError::driver(
                "cuStreamEndCapture/cuGraphInstantiate",
                err,
            )),
            (None, Ok(None)) => Err(CaptureError::Unsupported("a window that recorded no work")),
            (None, Ok(Some(graph))) => {
                let uploaded = if fault::trip(FaultStage::Upload) {
                    Err(fault::injected_driver_error())
                } else {
                    graph.upload()
                };
                uploaded
                    .map(|()| graph)
                    .map_err(|err| CaptureError::driver("cuGraphUpload", err))
            }
        };
        // Work deferred by the window runs now.
        for deferred in window.deferred_releases.drain(..) {
            release_now(stream, deferred);
        }
        stream.gpu.storage().flush();
        stream.arena.storage().flush();
        let graph = match graph {
            Ok(graph) => graph,
            Err(err) => {
                // Nothing recorded ran; the pool goes once its handles are dropped.
                if let Some(pool) = window.pool {
                    stream.graph_pools.retire(&pool);
                }
                return Err(err);
            }
        };
        let pool_bytes = window
            .pool
            .map_or(0, |pool| stream.graph_pools.reserved_bytes(&pool));
        let info = GraphInfo {
            launches: window.launches,
            retained_buffers: window.retention.buffer_count(),
            retained_device_bytes: window.retention.device_bytes(),
            retained_staging_bytes: window.retention.staging_bytes(),
            pool_bytes,
        };
        let id = self.next_graph;
        self.next_graph += 1;
        self.graphs.insert(
            id,
            CapturedGraph {
                graph,
                retention: window.retention,
                launches: window.launches,
                pool: window.pool,
                pool_bytes,
            },
        );
        Ok((id, info))
    }

    /// Queues one replay of graph `id` on the stream.
    pub fn replay(&mut self, id: u64) -> Result<(), CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        let caller = StreamId::current();
        if self.holds(caller) {
            // Another thread's window is open: the replay runs once it closes.
            if !self.graphs.contains_key(&id) {
                return Err(CaptureError::UnknownGraph(id));
            }
            self.deferred.push(Deferred::Replay {
                id,
                stream_id: caller,
            });
            return Ok(());
        }
        if self.main_stream().capturing() {
            return Err(CaptureError::Unsupported("replaying a graph"));
        }
        let graph = self.graphs.get(&id).ok_or(CaptureError::UnknownGraph(id))?;
        if fault::trip(FaultStage::ReplayLaunch) {
            return Err(CaptureError::driver(
                "cuGraphLaunch",
                fault::injected_driver_error(),
            ));
        }
        graph
            .graph
            .launch()
            .map_err(|err| CaptureError::driver("cuGraphLaunch", err))
    }

    /// Releases graph `id` once the stream has finished with it (deferred to the end of an
    /// open window, which must not wait on the host).
    pub fn release_graph(&mut self, id: u64) {
        if let Err(err) = self.bind_context() {
            tracing::warn!("CudaGraphRuntime: releasing graph {id}: {err}");
        }
        let Some(graph) = self.graphs.remove(&id) else {
            return;
        };
        let stream = self.main_stream();
        match &mut stream.window {
            Some(window) => window.deferred_releases.push(graph),
            None => release_now(stream, graph),
        }
    }

    /// Number of live graphs.
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }

    /// Device bytes retained by all live graphs.
    pub fn retained_bytes(&self) -> u64 {
        self.graphs
            .values()
            .map(|g| g.retention.device_bytes())
            .sum()
    }

    /// Device bytes reserved by graphs' private pools (live graphs, and retired pools that
    /// still have handles).
    pub fn graph_pool_bytes(&mut self) -> u64 {
        self.main_stream().graph_pools.total_reserved_bytes()
    }

    /// Number of graph pools alive.
    pub fn graph_pool_count(&mut self) -> usize {
        self.main_stream().graph_pools.len()
    }

    /// What each live graph recorded and retains, for reports (read-only).
    pub fn graph_infos(&self) -> Vec<GraphInfo> {
        self.graphs.values().map(CapturedGraph::info).collect()
    }

    /// Allocates `size` bytes in the arena. The handle's address is fixed until every
    /// handle to it is dropped. Not inside a window (that would be an allocation).
    pub fn arena_alloc(&mut self, size: u64) -> Result<Handle, CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        // Another thread's window may be open: an allocation queues no stream work.
        let recording = !self.holds(StreamId::current());
        let stream = self.main_stream();
        if recording && stream.capturing() {
            return Err(CaptureError::Unsupported("allocating in the arena"));
        }
        if fault::trip(FaultStage::Pin) {
            return Err(CaptureError::Server(format!(
                "injected: the arena could not allocate {size} bytes"
            )));
        }
        let handle = Handle::new(super::arena::ARENA_STREAM, size);
        let reserved = stream
            .arena
            .reserve(size)
            .map_err(|err| capture_server_err(err.into()))?;
        let cursor = stream.tick();
        stream
            .arena
            .bind(reserved, handle.memory.clone(), cursor)
            .map_err(|err| capture_server_err(err.into()))?;
        Ok(handle)
    }

    /// Memory of the normal device pools (what `memory_usage` reports).
    pub fn pool_usage(&mut self) -> MemoryUsage {
        self.main_stream().gpu.memory_usage()
    }

    /// Memory held by the arena.
    pub fn arena_usage(&mut self) -> MemoryUsage {
        self.main_stream().arena.memory_usage()
    }

    /// Queues a device-to-device copy of `bytes` bytes from `src` to `dst`
    /// (`cuMemcpyDtoDAsync`). Inside a window it is recorded and both buffers are retained.
    pub fn copy_device(
        &mut self,
        src: Binding,
        dst: Binding,
        bytes: u64,
    ) -> Result<(), CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        let caller = StreamId::current();
        let held = self.holds(caller);
        let stream = self.main_stream();
        if !held && matches!(&stream.window, Some(window) if window.broken.is_some()) {
            return Ok(());
        }
        let from = resource(stream, src.clone()).map_err(|err| capture_server_err(err.into()))?;
        let to = resource(stream, dst.clone()).map_err(|err| capture_server_err(err.into()))?;
        if from.size < bytes || to.size < bytes {
            return Err(CaptureError::Server(format!(
                "device copy of {bytes} bytes between buffers of {} and {} bytes",
                from.size, to.size
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        if !held && stream.capturing() && fault::trip(FaultStage::CopyBack) {
            self.break_window(
                caller,
                CaptureError::Server("injected: a recorded device copy failed".into()),
            );
            return Ok(());
        }
        if held {
            self.deferred.push(Deferred::Copy {
                src,
                dst,
                bytes,
                stream_id: caller,
            });
            return Ok(());
        }
        let stream = self.main_stream();
        // SAFETY: both slices are live pool/arena slices of at least `bytes` bytes; inside a
        // window both are retained with the graph, outside it the stream orders the copy
        // before any later reuse of either slice.
        let copied = unsafe {
            result::memcpy_dtod_async(to.ptr, from.ptr, bytes as usize, stream.stream.cu_stream())
        };
        if let Err(err) = copied {
            let err = CaptureError::driver("cuMemcpyDtoDAsync", err);
            if let Some(window) = &mut stream.window {
                window.break_with(err.clone());
            }
            return Err(err);
        }
        stream.keep_for_window(src, &from);
        stream.keep_for_window(dst, &to);
        Ok(())
    }

    /// The device address of the slice behind `binding` (offsets ignored): a stable
    /// identity while the buffer lives.
    pub fn buffer_address(&mut self, mut binding: Binding) -> Result<u64, CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        binding.offset_start = None;
        binding.offset_end = None;
        let stream = self.main_stream();
        resource(stream, binding)
            .map(|slice| slice.ptr)
            .map_err(|err| capture_server_err(err.into()))
    }
}
