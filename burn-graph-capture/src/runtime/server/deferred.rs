//! Work of other threads that arrives while a capture window is open.
//!
//! A window records every kernel and copy queued on the server's one CUDA stream. Work of
//! a `StreamId` the window does not record (another trainer's thread, burn-train's
//! metrics thread) must not reach that stream before the window closes: it would be
//! recorded into the graph instead of running, and its host reads would break the window
//! and fail themselves. The server holds such work here, in submission order, and runs it
//! right after `capture_end` closes the window, under the stream id that submitted it.
//! Reads and syncs return at once with futures that complete once their turn has run;
//! allocations and resource lookups need no stream work and are served immediately.

use cubecl_common::{backtrace::BackTrace, bytes::Bytes, stream_id::StreamId};
use cubecl_core::{
    future::DynFut,
    server::{Binding, CopyDescriptor, CubeCount, ExecutionMode, KernelArguments, ServerError},
};
use cubecl_runtime::server::ComputeServer;

use super::CudaGraphServer;
use super::collective::CollectiveOperand;
use crate::runtime::blas::Gemm;
use crate::runtime::nccl::CollectiveOp;

/// A held call, with what it needs to run later.
pub enum Deferred {
    /// `ComputeServer::launch`.
    Launch {
        kernel: <CudaGraphServer as ComputeServer>::Kernel,
        count: CubeCount,
        args: KernelArguments,
        mode: ExecutionMode,
        stream_id: StreamId,
    },
    /// `ComputeServer::write`.
    Write {
        descriptors: Vec<(CopyDescriptor, Bytes)>,
        stream_id: StreamId,
    },
    /// `ComputeServer::read`: the reply carries the read's own future.
    Read {
        descriptors: Vec<CopyDescriptor>,
        stream_id: StreamId,
        reply: oneshot::Sender<DynFut<Result<Vec<Bytes>, ServerError>>>,
    },
    /// `ComputeServer::sync`.
    Sync {
        stream_id: StreamId,
        reply: oneshot::Sender<DynFut<Result<(), ServerError>>>,
    },
    /// A graph replay queued by another trainer.
    Replay { id: u64, stream_id: StreamId },
    /// A device-to-device copy queued by another trainer.
    Copy {
        src: Binding,
        dst: Binding,
        bytes: u64,
        stream_id: StreamId,
    },
    /// A cuBLAS GEMM of another thread: `operands` are `[a, b, c]`.
    Gemm {
        gemm: Gemm,
        operands: [Binding; 3],
        stream_id: StreamId,
    },
    /// A group of NCCL collectives of another thread.
    Collective {
        key: u64,
        op: CollectiveOp,
        operands: Vec<CollectiveOperand>,
        stream_id: StreamId,
    },
}

impl core::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let what = match self {
            Deferred::Launch { .. } => "launch",
            Deferred::Write { .. } => "write",
            Deferred::Read { .. } => "read",
            Deferred::Sync { .. } => "sync",
            Deferred::Replay { .. } => "replay",
            Deferred::Copy { .. } => "copy",
            Deferred::Gemm { .. } => "gemm",
            Deferred::Collective { .. } => "collective",
        };
        write!(f, "Deferred::{what}({:?})", self.stream_id())
    }
}

impl Deferred {
    /// The stream id that submitted the call.
    pub fn stream_id(&self) -> StreamId {
        match self {
            Deferred::Launch { stream_id, .. }
            | Deferred::Write { stream_id, .. }
            | Deferred::Read { stream_id, .. }
            | Deferred::Sync { stream_id, .. }
            | Deferred::Replay { stream_id, .. }
            | Deferred::Copy { stream_id, .. }
            | Deferred::Gemm { stream_id, .. }
            | Deferred::Collective { stream_id, .. } => *stream_id,
        }
    }
}

/// A future for a held call's own future: waits for the server to run the call (and
/// send its future), then for that future.
pub fn after_window<T: Send + 'static>(
    reply: oneshot::Receiver<DynFut<Result<T, ServerError>>>,
) -> DynFut<Result<T, ServerError>> {
    Box::pin(async move {
        match reply.await {
            Ok(future) => future.await,
            Err(_) => Err(ServerError::Generic {
                reason: "the server dropped a call held during a capture window".into(),
                backtrace: BackTrace::capture(),
            }),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl_core::future::block_on;

    #[test]
    fn a_held_call_completes_with_its_own_future_once_sent() {
        let (reply, wait) = oneshot::channel();
        let held = after_window::<u32>(wait);
        let ready: DynFut<Result<u32, ServerError>> = Box::pin(async { Ok(7u32) });
        let _ = reply.send(ready);
        assert_eq!(block_on(held).unwrap(), 7);
    }

    #[test]
    fn a_held_call_the_server_dropped_is_an_error_not_a_hang() {
        let (reply, wait) = oneshot::channel::<DynFut<Result<u32, ServerError>>>();
        drop(reply);
        let err = block_on(after_window(wait)).unwrap_err();
        assert!(err.to_string().contains("capture window"), "{err}");
    }
}
