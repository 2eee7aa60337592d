//! The client side of graphs: what callers on any thread run on a device's server
//! (capture begin/end, replays through [`CudaGraphHandle`], tasks in queue order).
//!
//! A graph lives in its server (CUDA graphs may not be used from two threads at once);
//! callers hold a [`CudaGraphHandle`]. Replays go through the server's queue, so they are
//! ordered with all other work. Dropping the handle releases the graph on the server: it
//! waits for the stream to finish the graph's replays, then frees graph and retention.

use super::{
    device::CudaGraphDevice, error::CaptureError, server::CudaGraphServer, window::GraphInfo,
};
use cubecl_common::{device::Device, device_handle::DeviceHandle, stream_id::StreamId};

/// Runs `task` on the server of `device`, in order with all work queued on it so far.
pub fn with_server<R: Send>(
    device: &CudaGraphDevice,
    task: impl FnOnce(&mut CudaGraphServer) -> R + Send,
) -> Result<R, CaptureError> {
    DeviceHandle::<CudaGraphServer>::new(device.to_id())
        .submit_blocking(|server| {
            let _memory = server.hold_memory();
            task(server)
        })
        .map_err(|_| CaptureError::Unreachable)
}

/// As [`with_server`], for a task that can fail itself: one error for both.
pub fn try_with_server<R: Send>(
    device: &CudaGraphDevice,
    task: impl FnOnce(&mut CudaGraphServer) -> Result<R, CaptureError> + Send,
) -> Result<R, CaptureError> {
    with_server(device, task)?
}

/// Queues `task` on the server of `device`, in order with all work queued on it so far,
/// without waiting for it (as kernel launches are queued).
pub fn submit_to_server(
    device: &CudaGraphDevice,
    task: impl FnOnce(&mut CudaGraphServer) + Send + 'static,
) {
    DeviceHandle::<CudaGraphServer>::new(device.to_id()).submit(|server| {
        let _memory = server.hold_memory();
        task(server)
    });
}

/// Has the server of `device` take up its queue now, as a blocking call would, without
/// waiting for it. CubeCL's server thread polls its queue, and after about half a
/// millisecond without work it sleeps between polls, 150 µs at a time: a blocking call
/// (a replay's launch) that finds it asleep waits for the sleep to end. A host that
/// runs long without queueing work (a trace) calls this now and then to keep it polling.
pub fn keep_server_polling(device: &CudaGraphDevice) {
    DeviceHandle::<CudaGraphServer>::new(device.to_id()).flush_queue();
}

/// Opens a capture window on `device`'s stream. Everything the window touches is
/// retained from the launch that touches it.
pub fn capture_begin(device: &CudaGraphDevice) -> Result<(), CaptureError> {
    try_with_server(device, |server| server.capture_begin(None))
}

/// Opens a capture window with a private pool serving the handles of `stream` (from
/// [`capture_stream`](super::capture_stream)); run the recorded step under that stream
/// (`stream.executes(..)`) so that its allocations land there and are reused within it.
pub fn capture_begin_in_pool(
    device: &CudaGraphDevice,
    stream: StreamId,
) -> Result<(), CaptureError> {
    try_with_server(device, move |server| server.capture_begin(Some(stream)))
}

/// Closes the window on `device` and instantiates what it recorded.
pub fn capture_end(device: &CudaGraphDevice) -> Result<CudaGraphHandle, CaptureError> {
    let (id, info) = try_with_server(device, |server| server.capture_end())?;
    Ok(CudaGraphHandle {
        device: *device,
        id,
        info,
    })
}

/// A replayable graph held by its server. Dropping it releases the graph once the stream
/// has finished with it.
#[derive(Debug)]
pub struct CudaGraphHandle {
    device: CudaGraphDevice,
    id: u64,
    info: GraphInfo,
}

impl CudaGraphHandle {
    /// Queues one replay on the stream (`cuGraphLaunch`), after all work queued so far.
    pub fn replay(&self) -> Result<(), CaptureError> {
        let id = self.id;
        try_with_server(&self.device, move |server| server.replay(id))
    }

    /// The server-side id of this graph.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The device the graph replays on.
    pub fn device(&self) -> CudaGraphDevice {
        self.device
    }

    /// What the graph recorded and retains.
    pub fn info(&self) -> GraphInfo {
        self.info
    }
}

impl Drop for CudaGraphHandle {
    fn drop(&mut self) {
        let id = self.id;
        // Queued behind this graph's replays; the server waits for them before freeing.
        DeviceHandle::<CudaGraphServer>::new(self.device.to_id())
            .submit(move |server| server.release_graph(id));
    }
}
