//! Collectives of the CUDA stacks: NCCL on this crate's runtime (`runtime::nccl`).
//!
//! On `CudaCube` a collective is one group of NCCL calls queued on the stream like a
//! kernel launch, so a capture window records it into the step's graph. Every buffer is
//! packed (NCCL reads `count` consecutive values): a pitched or permuted gradient is
//! copied packed first, and the results are new packed tensors. On `Fusion<B>` it is one
//! custom fusion op running `B`'s collective on the resolved tensors, so fusion neither
//! reorders it around the gradients nor fuses it.

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn_backend::DType;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend};
use burn_ir::{CustomOpIr, OperationIr};
use cubecl_core::zspace::striding::row_major_contiguous_strides;

use super::layout;
use crate::cause::Cause;
use crate::custom_op::{Handles, output};
use crate::parallel::Collectives;
use crate::parallel::error::{CollectiveFailure, GroupMisuse};
use crate::parallel::{DistError, RankLink};
use crate::runtime::nccl::{self, CollectiveOp};
use crate::runtime::{
    CaptureError, CollectiveOperand, CudaGraphDevice, CudaGraphRuntime, submit_to_server,
    try_with_server, with_server,
};

/// Keys of this crate's groups on a server: apart from Burn's own communicators, which
/// are keyed by a hash of their devices.
const GROUP_KEY: u64 = 1 << 63;

fn key(link: &RankLink) -> u64 {
    link.group_id() | GROUP_KEY
}

fn collective_err(err: CaptureError) -> DistError {
    DistError::Collective(CollectiveFailure::Runtime(Cause::new(err)))
}

/// Joins `link`'s group on `device`: the ranks show their devices (one rank per GPU:
/// two on one device would wait for each other on its one worker), rank 0 makes the
/// NCCL id, and every rank makes its communicator with it (returning once all have).
/// A failure of the group aborts the communicator; leaving frees it once the stream has
/// run its collectives.
pub(super) fn join(device: &CudaGraphDevice, link: &RankLink) -> Result<(), DistError> {
    let made = (link.rank() == 0).then(nccl::unique_id);
    let mine = Seat::of(device);
    let mut payload = mine.to_bytes().to_vec();
    if let Some(Ok(id)) = &made {
        payload.extend_from_slice(id);
    }
    let all = link.all_gather(payload)?;
    let seats: Vec<Seat> = all.iter().map(|p| Seat::from_bytes(p)).collect();
    if let Some((second, first)) = (0..seats.len())
        .flat_map(|b| (0..b).map(move |a| (b, a)))
        .find(|&(b, a)| seats[a] == seats[b])
    {
        return Err(DistError::InvalidUse(GroupMisuse::SharedGpu {
            first,
            second,
            device: seats[first].device,
        }));
    }
    if let Some(Err(err)) = made {
        return Err(collective_err(err));
    }
    let id = all[0][Seat::BYTES..].to_vec();
    if id.is_empty() {
        return Err(DistError::Collective(CollectiveFailure::NoNcclId));
    }
    let (key, rank, world) = (key(link), link.rank(), link.world());
    let comm = try_with_server(device, move |server| server.nccl_join(key, id, rank, world))
        .map_err(collective_err)?;
    link.on_failure(move |error| comm.abort(&error.to_string()));
    let device = *device;
    link.on_leave(move || {
        // A device worker that is gone has nothing left to free.
        let _ = with_server(&device, move |server| server.nccl_leave(key));
    });
    Ok(())
}

/// Where a rank runs: its process and device. Two ranks of one process on one device
/// would wait for each other on the device's one worker (ranks of two processes on one
/// GPU are NCCL's to refuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seat {
    process: u64,
    device: u32,
}

impl Seat {
    const BYTES: usize = 12;

    fn of(device: &CudaGraphDevice) -> Self {
        Self {
            process: process_token(),
            device: device.index as u32,
        }
    }

    fn to_bytes(self) -> [u8; Self::BYTES] {
        let mut bytes = [0; Self::BYTES];
        bytes[..8].copy_from_slice(&self.process.to_le_bytes());
        bytes[8..].copy_from_slice(&self.device.to_le_bytes());
        bytes
    }

    fn from_bytes(bytes: &[u8]) -> Self {
        let mut seat = [0u8; Self::BYTES];
        let known = bytes.len().min(Self::BYTES);
        seat[..known].copy_from_slice(&bytes[..known]);
        let (process, device) = seat.split_at(8);
        Self {
            process: u64::from_le_bytes(process.try_into().expect("8 bytes")),
            device: u32::from_le_bytes(device.try_into().expect("4 bytes")),
        }
    }
}

/// This process, among the processes of a group (which may span machines): its id, hashed
/// with a key drawn for this process.
fn process_token() -> u64 {
    use std::hash::BuildHasher;
    static TOKEN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TOKEN
        .get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(std::process::id()))
}

/// `op` over `tensors` (fp32, one device) as one NCCL group on `link`'s communicator,
/// into new packed tensors. Queued without waiting; an NCCL error is parked on the
/// stream (and breaks an open window).
pub(super) fn run(
    tensors: Vec<CubeTensor<CudaGraphRuntime>>,
    op: CollectiveOp,
    link: &RankLink,
) -> Result<Vec<CubeTensor<CudaGraphRuntime>>, DistError> {
    let Some(device) = tensors.first().map(|t| t.device) else {
        return Ok(Vec::new());
    };
    let mut operands = Vec::with_capacity(tensors.len());
    let mut outputs = Vec::with_capacity(tensors.len());
    for tensor in tensors {
        if tensor.dtype != DType::F32 {
            return Err(DistError::Collective(CollectiveFailure::NotF32 {
                dtype: tensor.dtype,
            }));
        }
        if tensor.device != device {
            return Err(DistError::Collective(CollectiveFailure::MixedDevices));
        }
        let src = packed(tensor)?;
        let count = src.meta.shape().iter().product::<usize>();
        let out = CubeTensor {
            client: src.client.clone(),
            handle: src.client.empty(count * size_of::<f32>()),
            meta: src.meta.clone(),
            device: src.device,
            dtype: DType::F32,
            qparams: None,
        };
        operands.push(CollectiveOperand {
            src: src.handle.clone().binding(),
            dst: out.handle.clone().binding(),
            count,
        });
        outputs.push(out);
    }
    let key = key(link);
    // Queued like a kernel launch: the bindings keep the buffers alive until it is.
    submit_to_server(&device, move |server| {
        server.queue_collective(key, op, operands)
    });
    Ok(outputs)
}

/// `tensor` with its values packed row-major, as NCCL reads them.
fn packed(tensor: CubeTensor<CudaGraphRuntime>) -> Result<CubeTensor<CudaGraphRuntime>, DistError> {
    let is_packed = |t: &CubeTensor<CudaGraphRuntime>| {
        let shape = t.meta.shape();
        layout::same_placement(
            shape,
            t.meta.strides(),
            &row_major_contiguous_strides(shape),
        )
    };
    if is_packed(&tensor) {
        return Ok(tensor);
    }
    let copy = into_contiguous(tensor);
    if is_packed(&copy) {
        Ok(copy)
    } else {
        Err(DistError::Collective(CollectiveFailure::Unpackable {
            shape: copy.meta.shape().to_vec(),
            strides: copy.meta.strides().to_vec(),
        }))
    }
}

/// Inputs: the tensors; outputs: what `op` makes of them on every rank.
#[derive(Debug)]
struct CollectiveFusionOp<B> {
    desc: CustomOpIr,
    op: CollectiveOp,
    link: RankLink,
    backend: PhantomData<B>,
}

impl<B: FusionBackend + Collectives> Operation<B::FusionRuntime> for CollectiveFusionOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let inputs: Vec<_> = self
            .desc
            .inputs
            .iter()
            .map(|input| handles.get_float_tensor::<B>(input))
            .collect();
        let done = match self.op {
            CollectiveOp::Mean => B::all_reduce_mean(inputs.clone(), &self.link),
            CollectiveOp::Broadcast { root } => B::broadcast(inputs.clone(), root, &self.link),
            CollectiveOp::Sum => Err(DistError::Collective(CollectiveFailure::NoFusedSum)),
        };
        let results = done.unwrap_or_else(|error| {
            // The outputs must exist for fusion; the group's failure stops the step.
            self.link.fail(error);
            inputs
        });
        for (out, tensor) in self.desc.outputs.iter().zip(results) {
            handles.register_float_tensor::<B>(&out.id, tensor);
        }
    }
}

/// A collective on `Fusion<B>`: one custom op over all of `tensors`.
pub(super) fn fused<B: FusionBackend + Collectives>(
    tensors: Vec<FloatTensor<Fusion<B>>>,
    op: CollectiveOp,
    link: &RankLink,
) -> Result<Vec<FloatTensor<Fusion<B>>>, DistError> {
    let Some(first) = tensors.first() else {
        return Ok(Vec::new());
    };
    if let Some(other) = tensors.iter().find(|t| t.dtype != DType::F32) {
        return Err(DistError::Collective(CollectiveFailure::NotF32 {
            dtype: other.dtype,
        }));
    }
    let client = first.client.clone();
    let outputs: Vec<_> = tensors
        .iter()
        .map(|t| output::<B>(t, t.shape.clone(), DType::F32))
        .collect();
    let streams = OperationStreams::with_inputs(tensors.iter());
    let inputs: Vec<_> = tensors.into_iter().map(|t| t.into_ir()).collect();
    let name = match op {
        CollectiveOp::Broadcast { .. } => "broadcast",
        _ => "all_reduce",
    };
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    let fused_op = CollectiveFusionOp::<B> {
        desc: desc.clone(),
        op,
        link: link.clone(),
        backend: PhantomData,
    };
    Ok(client.register(streams, OperationIr::Custom(desc), fused_op))
}
