//! A fence: an event recorded on the server stream that the host can wait on later.
//!
//! Used for `sync`, for reads (the host waits before handing out bytes) and by the drop
//! queue (staging buffers are released only once the copies reading them are done).

use crate::runtime::error::server_err;
use crate::runtime::memory_lock::waiting_unlocked;
use cubecl_core::server::ServerError;
use cubecl_runtime::memory_management::drop_queue;
use cudarc::driver::{CudaEvent, CudaStream};

/// Work queued on a stream up to a point.
#[derive(Debug)]
pub struct Fence {
    event: Result<CudaEvent, ServerError>,
}

impl Fence {
    /// Records a fence after all work queued so far on `stream`. A failed record is kept
    /// and reported by [`Fence::wait`], so the caller's path stays panic-free.
    pub fn record(stream: &CudaStream) -> Self {
        // `None` flags: CU_EVENT_DISABLE_TIMING, the cheapest kind of event.
        let event = stream
            .record_event(None)
            .map_err(|err| server_err("cuEventRecord", err));
        Self { event }
    }

    /// Blocks the calling thread until the fenced work is done, with the device's memory
    /// lock let go meanwhile (`memory_lock::waiting_unlocked`).
    pub fn wait(self) -> Result<(), ServerError> {
        let event = self.event?;
        waiting_unlocked(|| event.synchronize())
            .map_err(|err| server_err("cuEventSynchronize", err))
    }
}

impl drop_queue::Fence for Fence {
    fn sync(self) {
        if let Err(err) = self.wait() {
            tracing::warn!("CudaGraphRuntime: drop-queue fence failed: {err}");
        }
    }
}
