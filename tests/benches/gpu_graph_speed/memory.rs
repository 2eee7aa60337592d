//! Device memory of the pools, as the runtimes report it.
//!
//! Eager memory is the growth of the normal pools' reserved bytes from just before the
//! model exists (after a cleanup that frees unused pages) to just after the timed steps.
//! Pools keep the pages a step used for the next step (idle pages are freed only after
//! many allocations), so this is the steady-state reservation of eager training: weights,
//! Adam state, activations, gradients and temporaries at their peak, plus page rounding.
//! The graphed side is the trainer's pinned bytes (arena) plus the device bytes its graph
//! retains; both are read from this crate's runtime.

use burn::prelude::Backend;
use burn_graph_capture::runtime::{CudaGraphDevice, with_server};
use cubecl_core::Runtime;
use cubecl_cuda::{CudaDevice, CudaRuntime};

/// Reserved and in-use bytes of a runtime's normal pools.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub reserved: u64,
    pub in_use: u64,
}

/// Growth of the pools between two readings.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolDelta {
    /// Reserved bytes added (the eager peak footprint of the step).
    pub reserved: u64,
    /// In-use bytes added, read between steps (weights, optimizer state, last loss).
    pub in_use: u64,
}

impl PoolDelta {
    pub fn between(before: Usage, after: Usage) -> Self {
        Self {
            reserved: after.reserved.saturating_sub(before.reserved),
            in_use: after.in_use.saturating_sub(before.in_use),
        }
    }
}

/// This crate's runtime (all streams map to its one stream, so one reading covers all).
pub fn ours(device: &CudaGraphDevice) -> Usage {
    let usage = with_server(device, |server| server.pool_usage()).expect("server");
    Usage {
        reserved: usage.bytes_reserved,
        in_use: usage.bytes_in_use,
    }
}

/// Like [`ours`], after draining `B`'s queue and freeing the pools' unused pages.
pub fn ours_after_cleanup<B: Backend<Device = CudaGraphDevice>>(
    sync: impl Fn(),
    device: &CudaGraphDevice,
) -> Usage {
    sync();
    B::memory_cleanup(device);
    ours(device)
}

/// Stock cubecl-cuda, for the calling thread's stream (the one its eager steps use).
pub fn stock(device: &CudaDevice) -> Usage {
    let usage = CudaRuntime::client(device)
        .memory_usage()
        .expect("memory usage");
    Usage {
        reserved: usage.bytes_reserved,
        in_use: usage.bytes_in_use,
    }
}

/// Like [`stock`], after draining `B`'s queue and freeing the pools' unused pages.
pub fn stock_after_cleanup<B: Backend<Device = CudaDevice>>(
    sync: impl Fn(),
    device: &CudaDevice,
) -> Usage {
    sync();
    B::memory_cleanup(device);
    stock(device)
}
