//! `CudaGraphServer`: the CubeCL `ComputeServer` of this runtime.
//!
//! One server per device runs on CubeCL's device worker thread. It owns the one CUDA
//! stream with its memory pools (`ServerStream`), the kernel cache and the profiler. Every
//! trait entry point binds the primary context to the calling thread first, because
//! cudarc's raw `result` calls (launch, copies, stream-ordered allocation) do not.
//!
//! Asynchronous entry points (`launch`, `write`, `initialize_memory`) cannot return
//! errors; theirs are parked on the stream and returned by the next `sync`, `read` or
//! `flush`, like stock cubecl-cuda. Kernel launch and compile errors during an autotune
//! profile go to the profiler instead, so a failing candidate does not poison the stream.

use super::fault::{self, FaultStage};
use super::{
    blas::{Blas, Gemm},
    compile::{CudaGraphCompiler, KernelCache},
    copy::{CopyPlan, copy_to_device, copy_to_host, plan_copy},
    error::{CaptureError, capture_as_server_err, launch_err, server_err},
    fence::Fence,
    memory_lock::{self, MemoryHold},
    storage::{GpuResource, GpuStorage, PinnedStagingController},
    stream::ServerStream,
    window::{CapturedGraph, GraphInfo},
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
        LaunchError, ProfileError, ProfilingToken, ServerError, ServerUtilities,
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
use deferred::{Deferred, after_window};
use std::{collections::HashMap, ffi::c_void, sync::Arc};

mod collective;
mod deferred;
pub use collective::CollectiveOperand;
mod gemm;
mod graphs;
mod launch;
mod stream_io;

/// The compute server of [`CudaGraphRuntime`](super::CudaGraphRuntime).
#[derive(Debug)]
pub struct CudaGraphServer {
    ctx: Arc<CudaContext>,
    /// The one stream every `StreamId`'s work runs on (see `stream.rs`).
    stream: ServerStream,
    kernels: KernelCache,
    timestamps: TimestampProfiler,
    logger: Arc<ServerLogger>,
    utilities: Arc<ServerUtilities<Self>>,
    /// Instantiated graphs by id, with what each retains (see `window.rs`).
    graphs: HashMap<u64, CapturedGraph>,
    next_graph: u64,
    /// Other streams' work held while a window is open (see `deferred.rs`).
    deferred: Vec<Deferred>,
    /// cuBLAS, made at the first GEMM (see `gemm.rs`); the error if it could not be.
    blas: Option<Result<Blas, CaptureError>>,
    /// NCCL communicators this device joined, by key (see `collective.rs`).
    comms: HashMap<u64, Arc<super::nccl::Communicator>>,
    /// The device whose memory lock it holds through every entry point, so that other
    /// threads may read memory handles while it does not (see `memory_lock.rs`).
    memory_lock: usize,
}

impl CudaGraphServer {
    pub(crate) fn new(
        ctx: Arc<CudaContext>,
        stream: ServerStream,
        kernels: KernelCache,
        utilities: ServerUtilities<Self>,
    ) -> Self {
        let memory_lock = ctx.ordinal();
        Self {
            ctx,
            stream,
            kernels,
            timestamps: TimestampProfiler::default(),
            logger: utilities.logger.clone(),
            utilities: Arc::new(utilities),
            graphs: HashMap::new(),
            next_graph: 0,
            deferred: Vec::new(),
            blas: None,
            comms: HashMap::new(),
            memory_lock,
        }
    }

    /// Holds this device's memory lock for an entry point (see `memory_lock.rs`).
    pub(crate) fn hold_memory(&self) -> MemoryHold {
        memory_lock::hold(self.memory_lock)
    }

    /// The context this server runs in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn bind_context(&self) -> Result<(), ServerError> {
        self.ctx
            .bind_to_thread()
            .map_err(|err| server_err("cuCtxSetCurrent", err))
    }

    /// Whether a window is open that does not record `stream_id`'s work: that work is
    /// held until the window closes (see `deferred.rs`).
    fn holds(&mut self, stream_id: StreamId) -> bool {
        self.stream.window.holds(stream_id)
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
                    if let Err(err) = self.launch_checked(kernel, count, args, mode) {
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
                Deferred::Gemm {
                    gemm,
                    operands,
                    stream_id,
                } => {
                    if let Err(err) = self.gemm(gemm, operands) {
                        self.park(stream_id, capture_as_server_err(err));
                    }
                }
                Deferred::Collective {
                    key,
                    op,
                    operands,
                    stream_id,
                } => {
                    if let Err(err) = self.collective(key, op, operands) {
                        self.park(stream_id, capture_as_server_err(err));
                    }
                }
            });
        }
    }

    /// Takes the errors parked on the stream. When there were some, profiles in flight are
    /// marked wrong and the pools drop their free pages (as after any failure).
    fn take_errors(&mut self) -> Vec<ServerError> {
        let stream = &mut self.stream;
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
    fn enter_checked(&mut self) -> Result<(), ServerError> {
        self.bind_context()?;
        let errors = self.take_errors();
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
        let stream = &mut self.stream;
        let refused = stream.gpu.storage().refused_bytes();
        let refused = refused.or(stream.arena.storage().refused_bytes());
        let pool = stream.window.open_window().and_then(|window| window.pool);
        let refused = refused.or_else(|| {
            let pool = stream.graph_pools.get_mut(&pool?)?;
            pool.storage().refused_bytes()
        });
        if stream.window.records(stream_id) {
            stream.window.break_with(match refused {
                Some(bytes) => CaptureError::NeedsAllocation { bytes },
                None => CaptureError::Server(error),
            });
        } else {
            stream.errors.push(error);
        }
    }

    /// Breaks the open window (if any) with `error`; returns whether one was open.
    fn break_window(&mut self, error: CaptureError) -> bool {
        self.stream.window.break_with(error)
    }

    /// Refuses a host synchronisation inside a window: breaks it and returns the error.
    fn refuse_sync(&mut self, what: &'static str) -> Option<ServerError> {
        let error = CaptureError::HostSync(what);
        if !self.break_window(error.clone()) {
            return None;
        }
        Some(capture_as_server_err(error))
    }

    fn read_now(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let stream = &mut self.stream;
        let mut outputs = Vec::with_capacity(descriptors.len());
        let mut keep_alive = Vec::with_capacity(descriptors.len());
        for descriptor in descriptors {
            match stream.read_one(descriptor) {
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
        let _memory = self.hold_memory();
        self.bind_context()?;
        let held = self.holds(stream_id);
        let stream = &mut self.stream;
        if held {
            // The write runs after the window: pinned if a free page has room, else
            // plain memory (new pinned pages are refused while the window is open).
            return Ok(sizes
                .iter()
                .map(|size| stream.host_buffer(*size, false))
                .collect());
        }
        sizes
            .iter()
            .map(|size| stream.staging_buffer(*size))
            .collect()
    }

    fn initialize_memory(&mut self, memory: ManagedMemoryHandle, size: u64, stream_id: StreamId) {
        let _memory = self.hold_memory();
        if let Err(err) = self.bind_context() {
            return self.park(stream_id, err);
        }
        let recorded = self.stream.window.records(stream_id);
        if recorded && fault::trip(FaultStage::WindowAllocation) {
            self.break_window(CaptureError::NeedsAllocation { bytes: size });
        }
        let stream = &mut self.stream;
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
        let _memory = self.hold_memory();
        if self.holds(stream_id) {
            let (reply, wait) = oneshot::channel();
            self.deferred.push(Deferred::Read {
                descriptors,
                stream_id,
                reply,
            });
            return after_window(wait);
        }
        if let Some(err) = self.refuse_sync("read") {
            return Box::pin(async move { Err(err) });
        }
        if let Err(err) = self.enter_checked() {
            return Box::pin(async move { Err(err) });
        }
        self.read_now(descriptors)
    }

    fn write(&mut self, descriptors: Vec<(CopyDescriptor, Bytes)>, stream_id: StreamId) {
        let _memory = self.hold_memory();
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
            let stream = &mut self.stream;
            if stream.window.is_broken() {
                return;
            }
            let written = (|| -> Result<(), IoError> {
                let plan = plan_copy(&descriptor.shape, &descriptor.strides, descriptor.elem_size)?;
                let target = stream.resource(descriptor.handle.clone())?;
                if let Some(window) = stream.window.open_window_mut() {
                    window
                        .retention
                        .keep(descriptor.handle, target.ptr, target.size);
                }
                // File-backed bytes are not addressable memory: stage them first. Inside a
                // window every source must be pinned (pageable copies cannot be captured).
                let data = match data.property() {
                    AllocationProperty::File => {
                        let mut pinned = stream.host_buffer(data.len(), true);
                        data.copy_into(&mut pinned);
                        pinned
                    }
                    AllocationProperty::Pinned => data,
                    _ if stream.capturing() => {
                        let mut pinned =
                            stream
                                .staging_buffer(data.len())
                                .map_err(|err| IoError::Unknown {
                                    description: err.to_string(),
                                    backtrace: BackTrace::capture(),
                                })?;
                        pinned.copy_from_slice(&data);
                        pinned
                    }
                    _ => data,
                };
                // A copy from pageable memory first waits for the stream's work, so readers
                // are let in meanwhile (it touches no memory handle).
                let cu_stream = stream.stream.cu_stream();
                // SAFETY: `target` covers the tensor; `data` stays alive in the drop queue
                // until a fence behind this copy.
                memory_lock::waiting_unlocked(|| unsafe {
                    copy_to_device(plan, &data, target.ptr, cu_stream)
                })?;
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
        let _memory = self.hold_memory();
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
        if let Err(err) = self.launch_checked(kernel, count, bindings, mode) {
            self.park(stream_id, err);
        }
    }

    fn flush(&mut self, _stream_id: StreamId) -> Result<(), ServerError> {
        let _memory = self.hold_memory();
        if self.stream.capturing() {
            // Deferred: flushing waits on fences and frees pages (see `capture_end`).
            return Ok(());
        }
        self.enter_checked()?;
        let stream = &mut self.stream;
        let cuda_stream = stream.stream.clone();
        stream.drop_queue.flush(|| Fence::record(&cuda_stream));
        stream.gpu.storage().flush();
        Ok(())
    }

    fn sync(&mut self, stream_id: StreamId) -> DynFut<Result<(), ServerError>> {
        let _memory = self.hold_memory();
        if self.holds(stream_id) {
            let (reply, wait) = oneshot::channel();
            self.deferred.push(Deferred::Sync { stream_id, reply });
            return after_window(wait);
        }
        if let Some(err) = self.refuse_sync("sync") {
            return Box::pin(async move { Err(err) });
        }
        if let Err(err) = self.enter_checked() {
            return Box::pin(async move { Err(err) });
        }
        let fence = self.stream.fence();
        Box::pin(async move { fence.wait() })
    }

    fn get_resource(
        &mut self,
        binding: Binding,
        _stream_id: StreamId,
    ) -> Result<ManagedResource<GpuResource>, ServerError> {
        let _memory = self.hold_memory();
        self.bind_context()?;
        let stream = &mut self.stream;
        let memory = binding.memory.clone();
        let resource = stream.resource(binding)?;
        Ok(ManagedResource::new(memory, resource))
    }

    fn memory_usage(&mut self, _stream_id: StreamId) -> Result<MemoryUsage, ServerError> {
        let _memory = self.hold_memory();
        Ok(self.stream.gpu.memory_usage())
    }

    fn memory_cleanup(&mut self, stream_id: StreamId) {
        let _memory = self.hold_memory();
        if let Err(err) = self.bind_context() {
            return self.park(stream_id, err);
        }
        let stream = &mut self.stream;
        if !stream.capturing() {
            stream.gpu.cleanup(true);
            stream.collect_graph_pools();
        }
    }

    fn start_profile(&mut self, stream_id: StreamId) -> Result<ProfilingToken, ServerError> {
        let _memory = self.hold_memory();
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
        let _memory = self.hold_memory();
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

    fn allocation_mode(&mut self, mode: MemoryAllocationMode, _stream_id: StreamId) {
        let _memory = self.hold_memory();
        self.stream.gpu.mode(mode);
    }
}
