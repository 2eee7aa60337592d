//! Capture windows: their life, what they retain, and the graphs they leave.
//!
//! A window records everything the server queues on its one stream into a CUDA graph
//! (`cuStreamBeginCapture` in THREAD_LOCAL mode: only the server's worker thread records,
//! and unsafe calls from other threads are not affected). While it is open (I5):
//! - no host sync: `read`, `sync`, profiling and dynamic cube counts break the window;
//! - no stream-ordered allocation: a device page the pools need inside the window comes
//!   from plain `cuMemAlloc` in relaxed capture mode (as PyTorch's caching allocator
//!   does), so the graph records no memory node; pinned host pages are refused. A page
//!   that cannot be had breaks the window with [`CaptureError::NeedsAllocation`]. With a
//!   private graph pool (`graph_pool`), the step's intermediates come from that pool;
//! - no free: page frees, the drop queue and storage flushes wait until the window closes;
//! - no first-time compile: a launch of a kernel not in the cache breaks the window;
//! - only the work of the stream that opened the window and of its pool stream is
//!   recorded (`CaptureWindow::records`); other threads' launches, copies, reads, syncs
//!   and replays are held by the server and run right after the window closes
//!   (`deferred.rs`), and their profiling fails instead of waiting.
//!
//! A broken window launches nothing more; `capture_end` ends the capture, throws the
//! graph away and returns the first error. Nothing recorded has run, so the caller can run
//! the step eagerly from the same state.
//!
//! Retention (I1): every binding a recorded launch or copy used (outside the
//! window's own graph pool, which the graph owns whole), every metadata upload and every
//! pinned staging area a recorded copy reads is kept by the graph. A kept
//! binding keeps its pool slice "in use", so the pools never hand it to another allocation
//! while the graph lives, and eager work between replays cannot reuse the graph's
//! intermediates (the cubecl#1612 failure).
//!
//! This module is data only: the server (`server/graphs.rs`) opens, breaks and closes
//! windows; callers reach it through `client.rs`.

use super::error::CaptureError;
use cubecl_common::{bytes::Bytes, stream_id::StreamId};
use cubecl_core::server::Binding;
use cudarc::driver::{CudaGraph, sys::CUdeviceptr};
use std::collections::HashMap;

/// What a graph keeps alive for its lifetime.
#[derive(Default)]
pub struct Retention {
    /// Device bindings by device address (one entry per address keeps the list short).
    bindings: HashMap<CUdeviceptr, (Binding, u64)>,
    /// Pinned host staging read by recorded host→device copies.
    staging: Vec<Bytes>,
}

impl core::fmt::Debug for Retention {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Retention")
            .field("bindings", &self.bindings.len())
            .field("device_bytes", &self.device_bytes())
            .field("staging", &self.staging.len())
            .finish()
    }
}

impl Retention {
    /// Keeps `binding` (resolved to `ptr`, `size` bytes) alive with the graph.
    pub fn keep(&mut self, binding: Binding, ptr: CUdeviceptr, size: u64) {
        self.bindings.entry(ptr).or_insert((binding, size));
    }

    /// Keeps a staging buffer alive with the graph.
    pub fn keep_staging(&mut self, bytes: Bytes) {
        self.staging.push(bytes);
    }

    /// Device bytes retained: the union of the retained ranges, so that views into one
    /// slice (a time step of a sequence, say) are counted once.
    pub fn device_bytes(&self) -> u64 {
        union_bytes(self.bindings.iter().map(|(ptr, (_, size))| (*ptr, *size)))
    }

    /// Host staging bytes retained.
    pub fn staging_bytes(&self) -> u64 {
        self.staging.iter().map(|b| b.len() as u64).sum()
    }

    /// Number of distinct device buffers retained.
    pub fn buffer_count(&self) -> usize {
        self.bindings.len()
    }
}

/// Bytes covered by the union of `[start, start + len)` ranges.
fn union_bytes(ranges: impl Iterator<Item = (u64, u64)>) -> u64 {
    let mut ranges: Vec<(u64, u64)> = ranges.map(|(start, len)| (start, start + len)).collect();
    ranges.sort_unstable();
    let mut total = 0;
    let mut covered_to = 0;
    for (start, end) in ranges {
        let start = start.max(covered_to);
        if end > start {
            total += end - start;
        }
        covered_to = covered_to.max(end);
    }
    total
}

/// The life of a stream's capture window. `open` leads from `Closed` to `Recording`;
/// the first error leads to `Broken`, which records nothing more and keeps that error for
/// `capture_end`; `close` leads back to `Closed` from either.
#[derive(Debug, Default)]
pub enum Window {
    /// No window: work runs eagerly.
    #[default]
    Closed,
    /// Recording the owner's and the pool stream's work.
    Recording(OpenWindow),
    /// Broken by its first error: launches nothing more until it closes.
    Broken(OpenWindow, CaptureError),
}

impl Window {
    /// Opens a window owned by `owner`, with the private pool `pool` if any.
    pub fn open(&mut self, owner: StreamId, pool: Option<StreamId>) {
        debug_assert!(matches!(self, Window::Closed), "a window is already open");
        *self = Window::Recording(OpenWindow::new(owner, pool));
    }

    /// Closes the window: what it held, and the error that broke it if one did.
    pub fn close(&mut self) -> Option<(OpenWindow, Option<CaptureError>)> {
        match std::mem::take(self) {
            Window::Closed => None,
            Window::Recording(window) => Some((window, None)),
            Window::Broken(window, error) => Some((window, Some(error))),
        }
    }

    /// Breaks an open window with `error`, keeping the first error; returns whether a
    /// window was open.
    pub fn break_with(&mut self, error: CaptureError) -> bool {
        match std::mem::take(self) {
            Window::Closed => false,
            Window::Recording(window) => {
                tracing::debug!("CudaGraphRuntime: capture window broken: {error}");
                *self = Window::Broken(window, error);
                true
            }
            broken @ Window::Broken(..) => {
                *self = broken;
                true
            }
        }
    }

    /// The open window, recording or broken.
    pub fn open_window(&self) -> Option<&OpenWindow> {
        match self {
            Window::Closed => None,
            Window::Recording(window) | Window::Broken(window, _) => Some(window),
        }
    }

    /// The open window, recording or broken, to keep what its work uses.
    pub fn open_window_mut(&mut self) -> Option<&mut OpenWindow> {
        match self {
            Window::Closed => None,
            Window::Recording(window) | Window::Broken(window, _) => Some(window),
        }
    }

    /// Whether a window is open (recording or broken).
    pub fn is_open(&self) -> bool {
        !matches!(self, Window::Closed)
    }

    /// Whether the open window is broken (it launches nothing more).
    pub fn is_broken(&self) -> bool {
        matches!(self, Window::Broken(..))
    }

    /// Whether an open window records work submitted under `stream_id`.
    pub fn records(&self, stream_id: StreamId) -> bool {
        self.open_window().is_some_and(|w| w.records(stream_id))
    }

    /// Whether an open window holds `stream_id`'s work until it closes (it does not
    /// record it: `deferred.rs`).
    pub fn holds(&self, stream_id: StreamId) -> bool {
        self.open_window().is_some_and(|w| !w.records(stream_id))
    }

    /// Counts a launch the open window recorded.
    pub fn count_launch(&mut self) {
        if let Some(window) = self.open_window_mut() {
            window.launches += 1;
        }
    }
}

/// What an open window holds.
#[derive(Debug)]
pub struct OpenWindow {
    /// What the recorded launches and copies use, kept for the graph's lifetime.
    pub retention: Retention,
    /// Graphs released while the window was open (their release needs a host wait).
    pub deferred_releases: Vec<CapturedGraph>,
    /// Kernel launches recorded.
    pub launches: usize,
    /// The capture stream whose handles the window's private pool serves, if it has one.
    pub pool: Option<StreamId>,
    /// The stream that opened the window. The window records its work and the pool
    /// stream's; work of any other stream is held until it closes (`deferred.rs`).
    pub owner: StreamId,
}

impl OpenWindow {
    fn new(owner: StreamId, pool: Option<StreamId>) -> Self {
        Self {
            retention: Retention::default(),
            deferred_releases: Vec::new(),
            launches: 0,
            pool,
            owner,
        }
    }

    /// Whether the window records work submitted under `stream_id`.
    pub fn records(&self, stream_id: StreamId) -> bool {
        stream_id == self.owner || Some(stream_id) == self.pool
    }
}

/// A graph instantiated by a window, with what it retains. Lives on the server thread.
pub struct CapturedGraph {
    /// Owns `cuGraphExec` and `cuGraph` and an `Arc` of the stream it replays on.
    pub graph: CudaGraph,
    /// What the graph's launches and copies use, kept while it lives.
    pub retention: Retention,
    /// Kernel launches in the graph.
    pub launches: usize,
    /// The graph's private pool (see `graph_pool.rs`), retired when the graph goes.
    pub pool: Option<StreamId>,
    /// Device bytes the private pool had reserved when the window closed.
    pub pool_bytes: u64,
}

// SAFETY: a `CapturedGraph` is created, launched and destroyed only on its server's
// worker thread (the server is moved there once, at start-up, and never shared); CUDA
// requires only that calls on one graph are not concurrent, which that thread guarantees.
unsafe impl Send for CapturedGraph {}

impl CapturedGraph {
    /// What the graph recorded and retains (read-only; the bench reports it).
    pub fn info(&self) -> GraphInfo {
        GraphInfo {
            launches: self.launches,
            retained_buffers: self.retention.buffer_count(),
            retained_device_bytes: self.retention.device_bytes(),
            retained_staging_bytes: self.retention.staging_bytes(),
            pool_bytes: self.pool_bytes,
        }
    }
}

impl core::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CapturedGraph")
            .field("retention", &self.retention)
            .field("launches", &self.launches)
            .finish()
    }
}

/// Facts about a graph, fixed at capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphInfo {
    /// Kernel launches recorded.
    pub launches: usize,
    /// Distinct device buffers retained.
    pub retained_buffers: usize,
    /// Device bytes retained.
    pub retained_device_bytes: u64,
    /// Pinned host bytes retained.
    pub retained_staging_bytes: u64,
    /// Device bytes of the graph's private pool (0 without one): the step's own memory,
    /// reused within the capture.
    pub pool_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::{CaptureError, StreamId, Window, union_bytes};

    #[test]
    fn a_window_records_its_owner_and_pool_streams_only() {
        let owner = StreamId::current();
        let pool = crate::runtime::capture_stream();
        let other_thread = std::thread::spawn(StreamId::current).join().unwrap();
        let mut window = Window::default();
        assert!(!window.records(owner) && !window.holds(owner), "closed");
        window.open(owner, Some(pool));
        assert!(window.records(owner) && window.records(pool));
        assert!(window.holds(other_thread), "another thread's work is held");
        assert!(!window.records(crate::runtime::capture_stream()));
        let mut no_pool = Window::default();
        no_pool.open(owner, None);
        assert!(no_pool.records(owner) && !no_pool.records(pool));
    }

    #[test]
    fn a_broken_window_keeps_its_first_error_until_closed() {
        let mut window = Window::default();
        assert!(
            !window.break_with(CaptureError::NotCapturing),
            "nothing open"
        );
        window.open(StreamId::current(), None);
        window.count_launch();
        assert!(window.break_with(CaptureError::FirstCompile("k".into())));
        assert!(window.break_with(CaptureError::WindowBusy));
        assert!(window.is_broken() && window.is_open());
        let (held, error) = window.close().expect("open");
        assert_eq!(held.launches, 1);
        assert!(matches!(error, Some(CaptureError::FirstCompile(_))));
        assert!(!window.is_open() && window.close().is_none());
    }
    #[test]
    fn overlapping_views_count_once() {
        // A slice of 100 bytes and two views into it; a separate slice of 10.
        let ranges = [(1000, 100), (1040, 60), (1000, 20), (2000, 10)];
        assert_eq!(union_bytes(ranges.into_iter()), 110);
    }

    #[test]
    fn adjacent_and_disjoint_ranges_add_up() {
        let ranges = [(0, 8), (8, 8), (32, 4)];
        assert_eq!(union_bytes(ranges.into_iter()), 20);
    }
}
