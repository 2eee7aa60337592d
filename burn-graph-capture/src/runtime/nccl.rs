//! NCCL through cudarc: communicators on the runtime's one stream, collectives queued
//! like launches (and recorded into a window's graph like them), and an abort that any
//! thread can call.
//!
//! NCCL is loaded when first used (cudarc's dynamic loading, which looks for
//! `libnccl.so`); [`available`] says whether it can be, and whether it is recent enough
//! for collectives inside CUDA graphs (2.9) and averaging (`ncclAvg`, 2.10).
//!
//! A communicator is blocking: its calls return once queued. Once its connections are
//! up (the first collective, in an eager warmup step), queuing does not wait for peers.
//! [`Communicator::abort`] frees it from whatever thread notices a failure, which also
//! releases a kernel waiting for a peer that will never come; after that it refuses
//! every call.

use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUdeviceptr, CUstream};
use cudarc::nccl::{result, sys};

use super::error::{CaptureError, NcclFailure, NcclMissing};

/// The oldest NCCL whose collectives can be captured into graphs and average (`ncclAvg`).
const OLDEST: i32 = 2_10_00;

/// Whether NCCL can be loaded, and is recent enough; the error says what is missing.
pub fn available() -> Result<i32, CaptureError> {
    // SAFETY: only tries to open the library (and closes it).
    if !unsafe { sys::is_culib_present() } {
        return Err(CaptureError::NcclUnavailable(NcclMissing::NotFound));
    }
    let version = result::get_nccl_version().map_err(|err| nccl_err("ncclGetVersion", err))?;
    if version < OLDEST {
        return Err(CaptureError::NcclUnavailable(NcclMissing::TooOld {
            version,
        }));
    }
    Ok(version)
}

/// A new unique id for a communicator, as bytes (rank 0 makes it, every rank uses it).
pub fn unique_id() -> Result<Vec<u8>, CaptureError> {
    available()?;
    let id = result::get_uniqueid().map_err(|err| nccl_err("ncclGetUniqueId", err))?;
    Ok(id.internal.iter().map(|c| *c as u8).collect())
}

/// What a group of collectives does with each buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveOp {
    /// The elementwise mean over the ranks (fp32).
    Mean,
    /// The elementwise sum over the ranks (fp32).
    Sum,
    /// `root`'s buffer on every rank.
    Broadcast {
        /// The rank whose buffer is sent.
        root: usize,
    },
}

/// One buffer of a group of collectives: `count` fp32 values read at `src` and written
/// at `dst`.
#[derive(Clone, Copy, Debug)]
pub struct Transfer {
    /// Device address read.
    pub src: CUdeviceptr,
    /// Device address written (may equal `src`).
    pub dst: CUdeviceptr,
    /// Number of fp32 values.
    pub count: usize,
}

/// An NCCL communicator of one rank, usable from its device's worker thread, abortable
/// from any thread.
#[derive(Debug)]
pub struct Communicator {
    rank: usize,
    world: usize,
    /// The handle; null once aborted or closed. Swapped out by whoever frees it, so that
    /// it is freed once.
    raw: AtomicPtr<sys::ncclComm>,
    /// Held around every use of the handle: NCCL wants one thread at a time on it.
    calls: Mutex<()>,
    /// Why the handle is gone.
    closed: Mutex<Option<String>>,
}

impl Communicator {
    /// Joins the communicator `id` as `rank` of `world`; returns once every rank has
    /// (NCCL's init is collective). The device's context must be current.
    pub fn init(id: &[u8], rank: usize, world: usize) -> Result<Self, CaptureError> {
        available()?;
        let mut raw = sys::ncclUniqueId { internal: [0; 128] };
        if id.len() != raw.internal.len() {
            return Err(CaptureError::Nccl {
                call: "ncclCommInitRank",
                failure: NcclFailure::IdLength { len: id.len() },
            });
        }
        for (to, from) in raw.internal.iter_mut().zip(id) {
            *to = *from as _;
        }
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the new handle; the id is NCCL's own bytes.
        unsafe { result::comm_init_rank(&mut comm, world as i32, raw, rank as i32) }
            .map_err(|err| nccl_err("ncclCommInitRank", err))?;
        Ok(Self {
            rank,
            world,
            raw: AtomicPtr::new(comm),
            calls: Mutex::new(()),
            closed: Mutex::new(None),
        })
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Why the communicator no longer works, if it does not.
    pub fn closed(&self) -> Option<String> {
        self.closed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Queues `op` on every transfer, as one NCCL group, on `stream`.
    ///
    /// # Safety
    /// Every transfer's addresses must hold `count` fp32 values on this communicator's
    /// device, alive until the stream has run the group (or, recorded into a graph,
    /// for the graph's lifetime).
    pub unsafe fn queue(
        &self,
        op: CollectiveOp,
        transfers: &[Transfer],
        stream: CUstream,
    ) -> Result<(), CaptureError> {
        let _calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let comm = self.raw.load(Ordering::Acquire);
        if comm.is_null() {
            let reason = self.closed().unwrap_or_else(|| "closed".into());
            return Err(CaptureError::Nccl {
                call: "queue",
                failure: NcclFailure::Gone { reason },
            });
        }
        if let CollectiveOp::Broadcast { root } = op
            && root >= self.world
        {
            return Err(CaptureError::Nccl {
                call: "ncclBroadcast",
                failure: NcclFailure::RootOutOfRange {
                    root,
                    world: self.world,
                },
            });
        }
        result::group_start().map_err(|err| nccl_err("ncclGroupStart", err))?;
        let queued = transfers.iter().try_for_each(|transfer| {
            // SAFETY: the caller vouches for the addresses; `comm` is live (only freed
            // under `calls`, or by an abort of a stuck call, which this is not).
            unsafe { queue_one(op, transfer, comm, stream) }
        });
        // Always ended, so that a failed call leaves no group open on this thread.
        let ended = result::group_end().map_err(|err| nccl_err("ncclGroupEnd", err));
        queued.and(ended.map(|_| ()))
    }

    /// Aborts the communicator from any thread: kernels of it that wait for a peer
    /// return, and every later call is refused with `why`. A call in progress on the
    /// worker thread gets a few seconds to return first; one that does not (stuck on a
    /// peer) is aborted under it, which is what releases it.
    pub fn abort(&self, why: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let calls = loop {
            match self.calls.try_lock() {
                Ok(guard) => break Some(guard),
                Err(TryLockError::Poisoned(poisoned)) => break Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TryLockError::WouldBlock) => break None,
            }
        };
        if calls.is_none() {
            tracing::warn!("aborting an NCCL communicator under a call stuck on it");
        }
        self.free(why, "ncclCommAbort");
    }

    /// Frees the communicator after its last collective: the stream must have run
    /// everything queued with it. Local: it waits for no peer.
    pub fn close(&self) {
        let _calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        self.free("the rank left its group", "ncclCommAbort (close)");
    }

    /// Swaps the handle out and frees it (once, whoever comes first).
    fn free(&self, why: &str, call: &str) {
        let comm = self.raw.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if comm.is_null() {
            return;
        }
        *self.closed.lock().unwrap_or_else(PoisonError::into_inner) = Some(why.to_string());
        // SAFETY: `comm` was live and no other path can reach it any more. NCCL's abort
        // releases only this rank's resources and returns kernels waiting on peers.
        if let Err(err) = unsafe { result::comm_abort(comm) } {
            tracing::warn!("{call} failed: {:?}", err.0);
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        self.close();
    }
}

/// Queues `op` on one transfer.
///
/// # Safety
/// As [`Communicator::queue`], with `comm` live.
unsafe fn queue_one(
    op: CollectiveOp,
    transfer: &Transfer,
    comm: sys::ncclComm_t,
    stream: CUstream,
) -> Result<(), CaptureError> {
    let (src, dst) = (transfer.src as *const c_void, transfer.dst as *mut c_void);
    let float = sys::ncclDataType_t::ncclFloat32;
    let count = transfer.count;
    let reduce = match op {
        CollectiveOp::Mean => sys::ncclRedOp_t::ncclAvg,
        CollectiveOp::Sum => sys::ncclRedOp_t::ncclSum,
        CollectiveOp::Broadcast { root } => {
            // SAFETY: as the caller vouches.
            return unsafe {
                result::broadcast(src, dst, count, float, root as i32, comm, stream as _)
            }
            .map(|_| ())
            .map_err(|err| nccl_err("ncclBroadcast", err));
        }
    };
    // SAFETY: as the caller vouches.
    unsafe { result::all_reduce(src, dst, count, float, reduce, comm, stream as _) }
        .map(|_| ())
        .map_err(|err| nccl_err("ncclAllReduce", err))
}

fn nccl_err(call: &'static str, err: result::NcclError) -> CaptureError {
    CaptureError::Nccl {
        call,
        failure: NcclFailure::Status(err.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `libnccl.so` (as on CI) making an id is the typed `NotFound`; with it, an
    /// id of NCCL's size or the typed `TooOld`.
    #[test]
    fn a_missing_nccl_is_a_typed_error() {
        // SAFETY: only tries to open the library (and closes it).
        let present = unsafe { sys::is_culib_present() };
        match unique_id() {
            Err(CaptureError::NcclUnavailable(NcclMissing::NotFound)) => assert!(!present),
            Err(CaptureError::NcclUnavailable(NcclMissing::TooOld { .. })) | Ok(_) => {
                assert!(present)
            }
            Err(other) => panic!("{other}"),
        }
        if let Ok(id) = unique_id() {
            assert_eq!(id.len(), 128);
        }
    }
}
