//! Private pools of captured steps: memory a graph owns, reused inside its capture.
//!
//! A graph's kernels read and write fixed addresses, so nothing they touch may be handed
//! to other work while the graph lives (I1). Retaining every buffer at the launch
//! that touches it keeps that promise but forbids reuse inside the captured step, so a
//! graph would hold every intermediate of the step at once. Instead, a window can record
//! into a pool of its own, as PyTorch's private graph pools do: work inside the window
//! allocates from it and reuses its freed slices (safe, since the graph runs them in the
//! stream order it recorded), and once the window closes only the graph and the handles
//! that outlived the window use it.
//!
//! Pools are told apart by the `StreamId` of the handles they serve: the step recorded
//! into a pool runs under a `StreamId` of its own ([`capture_stream`]), which CubeCL and
//! Burn's fusion give to every handle the step creates. A pool outlives its graph until
//! its last handle is gone.

use super::storage::GpuStorage;
use cubecl_common::stream_id::StreamId;
use cubecl_core::ir::MemoryDeviceProperties;
use cubecl_runtime::{
    logging::ServerLogger,
    memory_management::{MemoryManagement, MemoryManagementOptions},
};
use cudarc::driver::CudaStream;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// First value of capture streams ("GRAPH" in ASCII, shifted far above thread counters
/// and below the arena's marker).
const CAPTURE_STREAM_BASE: u64 = 0x4752_4150_4800_0000;

/// A `StreamId` no thread has: the step of one capture runs under it.
pub fn capture_stream() -> StreamId {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    StreamId {
        value: CAPTURE_STREAM_BASE + NEXT.fetch_add(1, Ordering::Relaxed),
    }
}

/// Whether `stream` was made by [`capture_stream`].
pub fn is_capture_stream(stream: &StreamId) -> bool {
    (CAPTURE_STREAM_BASE..CAPTURE_STREAM_BASE + (1 << 40)).contains(&stream.value)
}

/// One graph's pool.
#[derive(Debug)]
struct GraphPool {
    memory: MemoryManagement<GpuStorage>,
    /// The graph is gone (or was never made): drop the pool once nothing uses it.
    retired: bool,
}

/// The server's private graph pools, by the capture stream they serve.
#[derive(Debug, Default)]
pub struct GraphPools {
    pools: HashMap<StreamId, GraphPool>,
}

impl GraphPools {
    /// Creates the pool of the window recording under `stream`.
    pub fn open(
        &mut self,
        stream: StreamId,
        cuda_stream: Arc<CudaStream>,
        props: &MemoryDeviceProperties,
        logger: Arc<ServerLogger>,
    ) {
        let memory = GpuStorage::pool(
            cuda_stream,
            props,
            logger,
            MemoryManagementOptions::new("CudaGraph graph pool"),
        );
        self.pools.insert(
            stream,
            GraphPool {
                memory,
                retired: false,
            },
        );
    }

    /// The pool serving handles of `stream`, if it is a graph pool.
    pub fn get_mut(&mut self, stream: &StreamId) -> Option<&mut MemoryManagement<GpuStorage>> {
        self.pools.get_mut(stream).map(|pool| &mut pool.memory)
    }

    /// Whether `stream` has a pool.
    pub fn contains(&self, stream: &StreamId) -> bool {
        self.pools.contains_key(stream)
    }

    /// Marks the pool of `stream` as no longer used by a graph; it is dropped by
    /// [`collect`](Self::collect) once no handle uses it.
    pub fn retire(&mut self, stream: &StreamId) {
        if let Some(pool) = self.pools.get_mut(stream) {
            pool.retired = true;
        }
    }

    /// Drops retired pools that hold no live slice. The caller must have waited for the
    /// stream first: a dropped pool frees its pages.
    pub fn collect(&mut self) {
        self.pools
            .retain(|_, pool| !pool.retired || pool.memory.memory_usage().bytes_in_use > 0);
    }

    /// Device bytes the pool of `stream` has reserved.
    pub fn reserved_bytes(&self, stream: &StreamId) -> u64 {
        self.pools
            .get(stream)
            .map_or(0, |pool| pool.memory.memory_usage().bytes_reserved)
    }

    /// Device bytes all graph pools have reserved.
    pub fn total_reserved_bytes(&self) -> u64 {
        self.pools
            .values()
            .map(|pool| pool.memory.memory_usage().bytes_reserved)
            .sum()
    }

    /// Number of pools alive (retired ones still in use included).
    pub fn len(&self) -> usize {
        self.pools.len()
    }

    /// Whether no pool is alive.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::arena::{ARENA_STREAM, is_arena};

    #[test]
    fn capture_streams_are_fresh_and_distinct_from_threads_and_the_arena() {
        let (a, b) = (capture_stream(), capture_stream());
        assert_ne!(a, b);
        assert!(is_capture_stream(&a) && is_capture_stream(&b));
        assert!(!is_capture_stream(&StreamId::current()));
        assert!(!is_capture_stream(&ARENA_STREAM));
        assert!(!is_arena(&a));
    }
}
