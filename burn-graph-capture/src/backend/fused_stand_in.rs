//! Stand-ins on the fused stack (`CudaFused`), so that its replays are traced as the
//! plain stack's are.
//!
//! A fusion tensor exists only as an op registered on a fusion stream, and registering
//! one while the capture records would queue it among the step's ops, where it would
//! change what fusion merges into the captured kernels. So a stand-in is made once the
//! capture's window has closed (`StandIn::stand_in_later`): an empty `CudaCube` buffer of
//! the output's shape and dtype, registered as fusion registers an upload. A trace hands
//! out clones of it, which fusion sees as read-only handles (nothing is queued while a
//! trace matches, nor when the clones are dropped). Stand-ins here are never filled: a
//! trace that stops matching runs the step again from its start
//! (`GraphBackend::traces_run_again`), since ops recomputed apart from the closure
//! would reach fusion grouped otherwise than in the eager step.

use std::any::Any;

use burn::tensor::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn_backend::{DType, Shape};
use burn_fusion::{FusionBackend, FusionRuntime, FusionTensor, client::GlobalFusionClient};

use super::cuda::CudaCube;
use super::fusion::register;
use super::{AnyTensor, LaterStandIn, StandIn};

/// The fusion runtime of `CudaFused`: the only one whose tensors have stand-ins.
type Runtime = <CudaCube as FusionBackend>::FusionRuntime;

/// `tensor` as a tensor of `CudaFused`'s runtime, where `R` is that runtime.
fn on_cuda<R: FusionRuntime>(tensor: &FusionTensor<R>) -> Option<&FusionTensor<Runtime>> {
    (tensor as &dyn Any).downcast_ref()
}

/// Fusion tensors of other runtimes have no stand-ins: their replays stay untraced.
impl<R: FusionRuntime> StandIn for FusionTensor<R> {
    fn stand_in_later(&self) -> Option<LaterStandIn<Self>> {
        let tensor = on_cuda(self)?;
        if matches!(tensor.dtype, DType::QFloat(_)) {
            return None;
        }
        let (client, shape, dtype) = (tensor.client.clone(), tensor.shape.clone(), tensor.dtype);
        Some(Box::new(move || {
            let made: Box<dyn Any> = Box::new(empty(&client, shape.clone(), dtype));
            *made
                .downcast::<Self>()
                .expect("a stand-in is made for tensors of CudaFused's runtime only")
        }))
    }
}

/// An empty fusion tensor of `shape` and `dtype`: a `CudaCube` buffer, registered.
fn empty(
    client: &GlobalFusionClient<Runtime>,
    shape: Shape,
    dtype: DType,
) -> FusionTensor<Runtime> {
    let device = client.device();
    let inner = match dtype {
        DType::Bool(_) => AnyTensor::Bool(CudaCube::bool_empty(shape, device, dtype.into())),
        _ if dtype.is_float() => {
            AnyTensor::Float(CudaCube::float_empty(shape, device, dtype.into()))
        }
        _ => AnyTensor::Int(CudaCube::int_empty(shape, device, dtype.into())),
    };
    register::<CudaCube>(client, inner)
}
