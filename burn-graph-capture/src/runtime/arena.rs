//! The arena: a device memory pool of its own for pinned tensors (parameters, optimizer
//! state, lr/step tensors), so their addresses stay fixed while a trainer lives (I2).
//!
//! It is a second `MemoryManagement` beside the server's normal pools, in persistent mode:
//! every slice is its own page, and a slice is handed out again only once every handle to
//! it is gone. Normal allocations never land here, and `memory_cleanup` never touches it.
//!
//! Arena handles are told apart from pool handles by their `StreamId`: they carry
//! [`ARENA_STREAM`], a value no thread is ever given. This runtime maps every stream to its
//! one CUDA stream, so nothing else reads a handle's stream (see `stream.rs`).

use super::storage::GpuStorage;
use cubecl_common::stream_id::StreamId;
use cubecl_core::ir::MemoryDeviceProperties;
use cubecl_runtime::{
    logging::ServerLogger,
    memory_management::{
        MemoryAllocationMode, MemoryManagement, MemoryManagementOptions, MemoryUsage,
    },
};
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// The `StreamId` carried by every arena handle ("ARENA\0CG" in ASCII, far above any
/// thread counter).
pub const ARENA_STREAM: StreamId = StreamId {
    value: 0x4152_454E_4100_4347,
};

/// Whether a handle or binding with this stream lives in the arena.
pub fn is_arena(stream: &StreamId) -> bool {
    *stream == ARENA_STREAM
}

/// The arena pool of one server.
pub fn new_arena(
    stream: Arc<CudaStream>,
    props: &MemoryDeviceProperties,
    logger: Arc<ServerLogger>,
) -> MemoryManagement<GpuStorage> {
    GpuStorage::pool(
        stream,
        props,
        logger,
        MemoryManagementOptions::new("CudaGraph arena").mode(MemoryAllocationMode::Persistent),
    )
}

/// Bytes the arena holds for live pinned tensors.
pub fn arena_usage(arena: &MemoryManagement<GpuStorage>) -> MemoryUsage {
    arena.memory_usage()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_stream_is_not_a_thread_stream() {
        assert!(is_arena(&ARENA_STREAM));
        assert!(!is_arena(&StreamId::current()));
        assert_ne!(StreamId::current(), ARENA_STREAM);
    }
}
