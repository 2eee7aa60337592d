//! The capture API of the server: windows, replays, graph release, the arena and device
//! copies (see `window.rs`, `graph_pool.rs` and `arena.rs` for what each keeps).

use super::*;

impl ServerStream {
    /// Sets or clears what a capture window changes on the stream's storages, the window's
    /// private `pool` included: page frees are held, new device, arena and pool pages come
    /// from relaxed-mode `cuMemAlloc`, and new pinned pages are refused. Clearing flushes the
    /// pool's held frees.
    pub(super) fn set_window_flags(&mut self, pool: Option<StreamId>, open: bool) {
        self.gpu.storage().hold_frees(open);
        self.gpu.storage().set_capturing(open);
        self.arena.storage().hold_frees(open);
        self.arena.storage().set_capturing(open);
        self.pinned.storage().refuse_allocs(open);
        if let Some(memory) = pool.and_then(|pool| self.graph_pools.get_mut(&pool)) {
            memory.storage().hold_frees(open);
            memory.storage().set_capturing(open);
            if !open {
                memory.storage().flush();
            }
        }
    }

    /// Drops retired graph pools that nothing uses any more, after the stream has finished
    /// the work queued so far (their pages are freed).
    pub(super) fn collect_graph_pools(&mut self) {
        if self.graph_pools.is_empty() {
            return;
        }
        if let Err(err) = self.fence().wait() {
            tracing::warn!("CudaGraphRuntime: waiting before dropping graph pools failed: {err}");
            return;
        }
        self.graph_pools.collect();
    }

    /// Frees a graph and what it retains once the stream has finished every queued replay.
    ///
    /// `cuGraphExecDestroy` alone would be safe ("if the executable graph is in-flight, it
    /// will not be terminated, but rather freed asynchronously on completion"), but the
    /// retained pinned staging is host memory that the next eager write could reuse, so the
    /// release waits for the stream first.
    pub(super) fn release_now(&mut self, graph: CapturedGraph) {
        if let Err(err) = self.fence().wait() {
            tracing::warn!("CudaGraphRuntime: waiting before a graph release failed: {err}");
        }
        let pool = graph.pool;
        drop(graph);
        if let Some(pool) = pool {
            self.graph_pools.retire(&pool);
            self.graph_pools.collect();
        }
    }
}

pub(super) fn capture_server_err(err: ServerError) -> CaptureError {
    CaptureError::Server(err)
}

/// Capture windows, replay and the arena (see `window.rs` and `arena.rs`). Reached from
/// outside through `DeviceHandle::<CudaGraphServer>::submit_blocking`, so every call is
/// ordered with the kernels and copies queued before it.
impl CudaGraphServer {
    /// Whether a capture window is open.
    pub fn is_capturing(&mut self) -> bool {
        self.stream.capturing()
    }

    /// Opens a capture window on the stream (THREAD_LOCAL mode; see `window.rs`).
    ///
    /// Deferred host work (drop queue, page frees) is settled first, outside the window.
    ///
    /// With `pool`, the window records into a private pool serving handles created on that
    /// stream (see `graph_pool.rs`); the caller runs the step under it.
    pub fn capture_begin(&mut self, pool: Option<StreamId>) -> Result<(), CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        if let Some(window) = self.stream.window.open_window() {
            return Err(if window.owner == StreamId::current() {
                CaptureError::AlreadyCapturing
            } else {
                CaptureError::WindowBusy
            });
        }
        let errors = self.take_errors();
        if !errors.is_empty() {
            return Err(CaptureError::StreamUnhealthy(
                ServerError::ServerUnhealthy {
                    errors,
                    backtrace: BackTrace::capture(),
                },
            ));
        }
        // Steps that reach cuBLAS only inside the window find its handle made.
        self.prepare_blas();
        let logger = self.logger.clone();
        let stream = &mut self.stream;
        let cuda_stream = stream.stream.clone();
        stream.drop_queue.flush(|| Fence::record(&cuda_stream));
        stream.gpu.storage().flush();
        stream.arena.storage().flush();
        // Pools of released graphs whose last handle has gone since.
        stream.collect_graph_pools();
        if let Some(pool) = pool {
            if stream.graph_pools.contains(&pool) {
                return Err(CaptureError::Unsupported("reusing a capture stream"));
            }
            let (cuda, props) = (stream.stream.clone(), stream.memory_props.clone());
            stream.graph_pools.open(pool, cuda, &props, logger);
        }
        stream.set_window_flags(pool, true);
        // "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: ... potentially unsafe API calls are
        // prohibited only from this thread": the worker thread is the only one that records.
        let begun = if fault::trip(FaultStage::CaptureBegin) {
            Err(fault::injected_driver_error())
        } else {
            cuda_stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        };
        if let Err(err) = begun {
            stream.set_window_flags(pool, false);
            if let Some(pool) = pool {
                stream.graph_pools.retire(&pool);
            }
            return Err(CaptureError::driver("cuStreamBeginCapture", err));
        }
        stream.window.open(StreamId::current(), pool);
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
        let stream = &mut self.stream;
        let Some((mut window, broken)) = stream.window.close() else {
            return Err(CaptureError::NotCapturing);
        };
        let ended = stream.stream.end_capture(CUgraphInstantiate_flags(0));
        // Injected: the stream has left capture mode; what it recorded is dropped.
        let ended = match ended {
            Ok(_) if fault::trip(FaultStage::EndInstantiate) => Err(fault::injected_driver_error()),
            ended => ended,
        };
        stream.set_window_flags(window.pool, false);
        let graph = match (broken, ended) {
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
            stream.release_now(deferred);
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
        if self.stream.capturing() {
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
        let stream = &mut self.stream;
        match stream.window.open_window_mut() {
            Some(window) => window.deferred_releases.push(graph),
            None => stream.release_now(graph),
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
        self.stream.graph_pools.total_reserved_bytes()
    }

    /// Number of graph pools alive.
    pub fn graph_pool_count(&mut self) -> usize {
        self.stream.graph_pools.len()
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
        let stream = &mut self.stream;
        if recording && stream.capturing() {
            return Err(CaptureError::Unsupported("allocating in the arena"));
        }
        if fault::trip(FaultStage::Pin) {
            let injected = server_err("cuMemAlloc", fault::injected_driver_error());
            return Err(capture_server_err(injected));
        }
        let handle = Handle::new(super::super::arena::ARENA_STREAM, size);
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
        self.stream.gpu.memory_usage()
    }

    /// Memory held by the arena.
    pub fn arena_usage(&mut self) -> MemoryUsage {
        self.stream.arena.memory_usage()
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
        let stream = &mut self.stream;
        if !held && stream.window.is_broken() {
            return Ok(());
        }
        let from = stream
            .resource(src.clone())
            .map_err(|err| capture_server_err(err.into()))?;
        let to = stream
            .resource(dst.clone())
            .map_err(|err| capture_server_err(err.into()))?;
        if from.size < bytes || to.size < bytes {
            return Err(CaptureError::OutOfBounds {
                what: "a device copy",
                reach: bytes,
                size: from.size.min(to.size),
            });
        }
        if bytes == 0 {
            return Ok(());
        }
        if !held && stream.capturing() && fault::trip(FaultStage::CopyBack) {
            self.break_window(CaptureError::driver(
                "cuMemcpyDtoDAsync",
                fault::injected_driver_error(),
            ));
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
        let stream = &mut self.stream;
        // SAFETY: both slices are live pool/arena slices of at least `bytes` bytes; inside a
        // window both are retained with the graph, outside it the stream orders the copy
        // before any later reuse of either slice.
        let copied = unsafe {
            result::memcpy_dtod_async(to.ptr, from.ptr, bytes as usize, stream.stream.cu_stream())
        };
        if let Err(err) = copied {
            let err = CaptureError::driver("cuMemcpyDtoDAsync", err);
            stream.window.break_with(err.clone());
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
        let stream = &mut self.stream;
        stream
            .resource(binding)
            .map(|slice| slice.ptr)
            .map_err(|err| capture_server_err(err.into()))
    }
}
