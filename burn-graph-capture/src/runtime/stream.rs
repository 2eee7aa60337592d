//! The server's single CUDA stream and everything ordered by it.
//!
//! CubeCL tags every call with the caller's `StreamId` (one per thread). Stock
//! cubecl-cuda maps those onto several CUDA streams and synchronises them with events and
//! a GC thread. This runtime runs **every** `StreamId`'s work on one CUDA stream (the
//! server holds one `ServerStream`; stream ids only choose pools), so ordering is program
//! order, there are no cross-stream waits, and a later capture window sees all work of the
//! step on the stream it captures (ARCHITECTURE.md, hazards).

use super::{
    arena::is_arena,
    fence::Fence,
    graph_pool::GraphPools,
    storage::{GpuResource, GpuStorage, PinnedStorage},
    window::Window,
};
use cubecl_common::bytes::Bytes;
use cubecl_common::stream_id::StreamId;
use cubecl_core::ir::MemoryDeviceProperties;
use cubecl_core::server::{Binding, ServerError};
use cubecl_runtime::memory_management::{MemoryManagement, drop_queue::PendingDropQueue};
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// The CUDA stream of a server with its pools, drop queue and pending errors.
#[derive(Debug)]
pub struct ServerStream {
    pub stream: Arc<CudaStream>,
    /// Device memory pools (tensors, per-launch metadata).
    pub gpu: MemoryManagement<GpuStorage>,
    /// The arena: pinned tensors at fixed addresses (see `arena.rs`).
    pub arena: MemoryManagement<GpuStorage>,
    /// Private pools of captured steps (see `graph_pool.rs`).
    pub graph_pools: GraphPools,
    /// Page size and alignment of device pools, for new graph pools.
    pub memory_props: MemoryDeviceProperties,
    /// The capture window's state (see `window.rs`).
    pub window: Window,
    /// Pinned host pools (staging for reads and writes).
    pub pinned: MemoryManagement<PinnedStorage>,
    /// Host buffers that in-flight copies still read, released after a fence.
    pub drop_queue: PendingDropQueue<Fence>,
    /// Errors from asynchronous calls (`launch`, `write`), reported at the next sync/read.
    pub errors: Vec<ServerError>,
    /// Logical clock of submissions, stored by the pools with each binding.
    pub cursor: u64,
}

impl ServerStream {
    /// Records a fence after all work queued so far.
    pub fn fence(&self) -> Fence {
        Fence::record(&self.stream)
    }

    /// Advances and returns the submission clock.
    pub fn tick(&mut self) -> u64 {
        self.cursor += 1;
        self.cursor
    }

    /// The pool holding the memory of handles created on `owner`: the arena, a graph's
    /// private pool, or the normal pools.
    pub fn pool_for(&mut self, owner: &StreamId) -> &mut MemoryManagement<GpuStorage> {
        if is_arena(owner) {
            &mut self.arena
        } else if self.graph_pools.contains(owner) {
            self.graph_pools.get_mut(owner).expect("checked above")
        } else {
            &mut self.gpu
        }
    }

    /// Inside a window, keeps a binding that a recorded launch or copy uses for the
    /// graph's lifetime (I1), unless it lives in the window's private pool: the graph owns
    /// that pool whole, so its bindings need no retention of their own.
    pub fn keep_for_window(&mut self, binding: Binding, slice: &GpuResource) {
        if let Some(window) = self.window.open_window_mut()
            && window.pool.as_ref() != Some(&binding.stream)
        {
            window.retention.keep(binding, slice.ptr, slice.size);
        }
    }

    /// Whether a capture window is open.
    pub fn capturing(&self) -> bool {
        self.window.is_open()
    }

    /// Releases a staging buffer that queued copies read: into the open window's retention
    /// (the graph reads it on every replay), else into the drop queue (freed after a fence).
    pub fn release_staging(&mut self, bytes: Bytes) {
        match self.window.open_window_mut() {
            Some(window) => window.retention.keep_staging(bytes),
            None => self.drop_queue.push(bytes),
        }
    }

    /// Flushes the drop queue if its policy says so (cheap check, called per launch).
    /// Never inside a window: a flush records and waits on fences.
    pub fn maybe_flush_drop_queue(&mut self) {
        if !self.capturing() && self.drop_queue.should_flush() {
            let stream = self.stream.clone();
            self.drop_queue.flush(|| Fence::record(&stream));
        }
    }
}
