//! Stand-ins on the fusion stack (`CudaFused`): a trace hands them out for the outputs
//! of matched ops, as `CubeTensor` stand-ins on the plain stack.
//!
//! A stand-in is made while the capture records, from the output's shape and dtype
//! only: resolving the output itself would launch the fusion queue at every op and
//! capture unfused kernels. It is a packed buffer of B's (in the graph's pool, as any
//! allocation of the captured step), registered with fusion as a tensor of its own on
//! the trainer's stream, not the capture's, so that the ops of a step that diverged use
//! it on the stream they run on. The recording keeps one handle on it, so fusion never
//! sees it as the last use (it neither writes it in place nor frees it). A trace that
//! stops matching fills it: the value fusion computed is resolved to B's tensor and
//! copied into the stand-in's buffer, on the one stream, after the queue that made it.

use std::any::Any;
use std::cell::Cell;

use burn_backend::{StreamId, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::{FusionRuntime, FusionTensor};
use cubecl_core::Runtime;

use super::fusion::register;
use super::{AnyTensor, CudaCube, StandIn};
use crate::runtime::CudaGraphRuntime;

/// A tensor of the fusion stack on this crate's runtime.
type Fused = FusionTensor<<CudaCube as burn_fusion::FusionBackend>::FusionRuntime>;

thread_local! {
    /// The stream a capture on this thread was called from: its stand-ins are
    /// registered there (`Fusion::capture` sets it).
    static CALLER: Cell<Option<StreamId>> = const { Cell::new(None) };
}

/// Registers stand-ins made while `run` runs on `caller`'s stream.
pub(super) fn made_for<R>(caller: StreamId, run: impl FnOnce() -> R) -> R {
    let before = CALLER.with(|c| c.replace(Some(caller)));
    let out = run();
    CALLER.with(|c| c.set(before));
    out
}

/// Fusion tensors of any runtime: only the runtime of `CudaFused` has stand-ins (an
/// `Any` check picks it, since the op traits are implemented for every runtime).
impl<R: FusionRuntime + 'static> StandIn for FusionTensor<R> {
    fn stand_in(&self) -> Option<Self> {
        let fused = (self as &dyn Any).downcast_ref::<Fused>()?;
        let stand_in: Box<dyn Any> = Box::new(stand_in(fused)?);
        stand_in.downcast::<Self>().ok().map(|stand_in| *stand_in)
    }

    fn fill(&self, value: &Self) -> bool {
        let (Some(stand_in), Some(value)) = (
            (self as &dyn Any).downcast_ref::<Fused>(),
            (value as &dyn Any).downcast_ref::<Fused>(),
        ) else {
            return false;
        };
        if stand_in.shape != value.shape || stand_in.dtype != value.dtype {
            return false;
        }
        inner(stand_in).fill(&inner(value))
    }
}

fn stand_in(output: &Fused) -> Option<Fused> {
    if matches!(output.dtype, burn_backend::DType::QFloat(_)) {
        return None;
    }
    let device = *output.client.device();
    let client = CudaGraphRuntime::client(&device);
    let bytes = output.shape.num_elements() * output.dtype.size();
    // Allocated on the stream the step runs on: inside a capture, the graph's pool.
    let handle = client.empty(bytes.max(1));
    let buffer =
        CubeTensor::new_contiguous(client, device, output.shape.clone(), handle, output.dtype);
    let caller = CALLER.with(Cell::get).unwrap_or_else(StreamId::current);
    Some(caller.executes(|| register::<CudaCube>(&output.client, AnyTensor::Float(buffer))))
}

/// B's tensor behind `tensor` (its queue launched first), `tensor` keeping its handle.
fn inner(tensor: &Fused) -> CubeTensor<CudaGraphRuntime> {
    let client = &tensor.client;
    let tensor = tensor.clone();
    match tensor.dtype() {
        dtype if dtype.is_float() => client.resolve_tensor_float::<CudaCube>(tensor),
        burn_backend::DType::Bool(_) => client.resolve_tensor_bool::<CudaCube>(tensor),
        _ => client.resolve_tensor_int::<CudaCube>(tensor),
    }
}
