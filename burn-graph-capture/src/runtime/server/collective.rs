//! NCCL collectives on the stream (see `nccl.rs`), under the window rules: a
//! communicator is made outside any window, a group of collectives inside a window is
//! recorded and retains its buffers, and another thread's group waits for the window to
//! close. Burn's own data-parallel path (`ServerCommunication`) runs through the same
//! calls.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use cubecl_core::device::DeviceId;
use cubecl_core::ir::{ElemType, FloatKind};
use cubecl_core::server::{CommunicationId, ReduceOperation, ServerCommunication};

use super::graphs::capture_server_err;
use super::*;
use crate::runtime::error::NcclFailure;
use crate::runtime::nccl::{self, CollectiveOp, Communicator, Transfer};

/// One buffer of a queued group: read `src`, write `dst`, `count` fp32 values.
#[derive(Debug)]
pub struct CollectiveOperand {
    /// The buffer read.
    pub src: Binding,
    /// The buffer written (the same memory for an in-place collective).
    pub dst: Binding,
    /// Number of fp32 values.
    pub count: usize,
}

impl CudaGraphServer {
    /// Joins communicator `key` (unique id `id`) as `rank` of `world`, once; returns it.
    /// Blocks this device's worker until every rank has joined. Never inside a window
    /// (NCCL's init allocates and synchronises).
    pub fn nccl_join(
        &mut self,
        key: u64,
        id: Vec<u8>,
        rank: usize,
        world: usize,
    ) -> Result<Arc<Communicator>, CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        if let Some(comm) = self.comms.get(&key) {
            return Ok(comm.clone());
        }
        if self.stream.capturing() {
            return Err(CaptureError::Unsupported("joining an NCCL communicator"));
        }
        // NCCL work must not overlap a communicator's creation on this stream.
        self.stream.fence().wait().map_err(capture_server_err)?;
        let comm = Arc::new(Communicator::init(&id, rank, world)?);
        self.comms.insert(key, comm.clone());
        Ok(comm)
    }

    /// Leaves communicator `key`: waits for the stream to run its collectives, then
    /// frees it. Graphs that recorded them must be released first.
    pub fn nccl_leave(&mut self, key: u64) {
        let Some(comm) = self.comms.remove(&key) else {
            return;
        };
        if self.bind_context().is_ok() && !self.stream.capturing() {
            let _ = self.stream.fence().wait();
        }
        comm.close();
    }

    /// [`Self::collective`] for a caller that does not wait: an error is parked on the
    /// caller's stream (the next sync or read returns it) and breaks an open window.
    pub fn queue_collective(
        &mut self,
        key: u64,
        op: CollectiveOp,
        operands: Vec<CollectiveOperand>,
    ) {
        if let Err(err) = self.collective(key, op, operands) {
            self.park(StreamId::current(), capture_as_server_err(err));
        }
    }

    /// Queues `op` over `operands` as one NCCL group on communicator `key`, in order
    /// with all work submitted before it; inside a window it is recorded and retains
    /// its buffers. `Err` means nothing was queued.
    pub(super) fn collective(
        &mut self,
        key: u64,
        op: CollectiveOp,
        operands: Vec<CollectiveOperand>,
    ) -> Result<(), CaptureError> {
        self.bind_context().map_err(capture_server_err)?;
        let caller = StreamId::current();
        if self.holds(caller) {
            self.deferred.push(Deferred::Collective {
                key,
                op,
                operands,
                stream_id: caller,
            });
            return Ok(());
        }
        let comm = self.comms.get(&key).cloned().ok_or(CaptureError::Nccl {
            call: "queue",
            failure: NcclFailure::NoCommunicator { key },
        })?;
        let stream = &mut self.stream;
        if stream.window.is_broken() {
            return Ok(());
        }
        let mut transfers = Vec::with_capacity(operands.len());
        let mut kept = Vec::with_capacity(2 * operands.len());
        for operand in operands {
            let bytes = (operand.count * size_of::<f32>()) as u64;
            let mut ptrs = [0; 2];
            for (ptr, binding) in ptrs.iter_mut().zip([operand.src, operand.dst]) {
                let slice = stream
                    .resource(binding.clone())
                    .map_err(|err| capture_server_err(err.into()))?;
                if slice.size < bytes {
                    return Err(CaptureError::OutOfBounds {
                        what: "a collective's buffer",
                        reach: bytes,
                        size: slice.size,
                    });
                }
                *ptr = slice.ptr;
                kept.push((binding, slice));
            }
            transfers.push(Transfer {
                src: ptrs[0],
                dst: ptrs[1],
                count: operand.count,
            });
        }
        let stream = &mut self.stream;
        // SAFETY: each address starts a live pool or arena slice of at least `count`
        // fp32 values (checked above), kept alive until the stream has run the group
        // (inside a window, with the graph: below).
        let queued = unsafe { comm.queue(op, &transfers, stream.stream.cu_stream()) };
        if let Err(err) = queued {
            stream.window.break_with(err.clone());
            return Err(err);
        }
        for (binding, slice) in kept {
            stream.keep_for_window(binding, &slice);
        }
        stream.window.count_launch();
        Ok(())
    }

    /// Number of NCCL communicators this device holds.
    pub fn nccl_communicators(&self) -> usize {
        self.comms.len()
    }

    /// This server's device index (its CUDA ordinal).
    fn device_index(&self) -> usize {
        self.ctx.ordinal()
    }
}

/// The unique ids of Burn's communicators in this process, by device set: the first
/// device to join one makes its id, the others take it (`ServerCommunication`).
static BURN_IDS: LazyLock<Mutex<HashMap<u64, Vec<u8>>>> = LazyLock::new(Mutex::default);

/// Burn's own data-parallel path (`DistributedBackend` on `CubeBackend` and `Fusion`):
/// one communicator per set of devices, all ranks of this process. The runtime has one
/// stream, so a collective is ordered with the compute around it as queued, and syncing
/// collectives needs no work.
impl ServerCommunication for CudaGraphServer {
    const SERVER_COMM_ENABLED: bool = false;

    fn comm_init(&mut self, device_ids: Vec<DeviceId>) -> Result<(), ServerError> {
        let _memory = self.hold_memory();
        let key = CommunicationId::from(device_ids.clone()).id;
        let mut ids: Vec<u16> = device_ids.iter().map(|id| id.index_id).collect();
        ids.sort_unstable();
        let own = self.device_index() as u16;
        let rank = ids
            .iter()
            .position(|id| *id == own)
            .ok_or_else(|| ServerError::Generic {
                reason: format!("device {own} is not in the collective's devices {ids:?}"),
                backtrace: BackTrace::capture(),
            })?;
        let id = {
            let mut known = BURN_IDS.lock().unwrap_or_else(PoisonError::into_inner);
            match known.get(&key) {
                Some(id) => id.clone(),
                None => {
                    let id = nccl::unique_id().map_err(capture_as_server_err)?;
                    known.insert(key, id.clone());
                    id
                }
            }
        };
        self.nccl_join(key, id, rank, ids.len())
            .map(|_| ())
            .map_err(capture_as_server_err)
    }

    fn all_reduce(
        &mut self,
        src: Binding,
        dst: Binding,
        dtype: ElemType,
        stream_id: StreamId,
        op: ReduceOperation,
        device_ids: Vec<DeviceId>,
    ) -> Result<(), ServerError> {
        let _memory = self.hold_memory();
        if dtype != ElemType::Float(FloatKind::F32) {
            return Err(ServerError::Generic {
                reason: format!("this runtime's collectives are fp32, not {dtype:?}"),
                backtrace: BackTrace::capture(),
            });
        }
        let key = CommunicationId::from(device_ids).id;
        let count = (dst.size_in_used() / size_of::<f32>() as u64) as usize;
        let op = match op {
            ReduceOperation::Sum => CollectiveOp::Sum,
            ReduceOperation::Mean => CollectiveOp::Mean,
        };
        let operand = CollectiveOperand { src, dst, count };
        stream_id
            .executes(|| self.collective(key, op, vec![operand]))
            .map_err(capture_as_server_err)
    }

    fn sync_collective(&mut self, _stream_id: StreamId) -> Result<(), ServerError> {
        Ok(())
    }
}
