//! Stand-ins on the fused stack (`CudaFused`), so that its replays are traced as the
//! plain stack's are.
//!
//! A fusion tensor exists only as an op registered on a fusion stream, and registering
//! one while the capture records would queue it among the step's ops, where it would
//! change what fusion merges into the captured kernels. So a stand-in is made once the
//! capture's window has closed (`StandIn::stand_in_later`): an empty `CudaCube` buffer of
//! the output's shape and dtype, registered as fusion registers an upload. A trace hands
//! out clones of it, which fusion sees as read-only handles (nothing is queued while a
//! trace matches, nor when the clones are dropped). A trace that stops matching fills
//! it with one custom op that copies the value the recorded op computes now into its
//! buffer, queued after the ops that compute that value and before any that read the
//! stand-in.

use std::any::Any;

use burn::tensor::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn_backend::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionBackend, FusionRuntime, FusionTensor, client::GlobalFusionClient};
use burn_ir::{CustomOpIr, OperationIr, TensorIr};

use super::cuda::CudaCube;
use super::fusion::register;
use super::{AnyTensor, LaterStandIn, StandIn};
use crate::custom_op::Handles;
use crate::runtime::CudaGraphRuntime;

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

    fn fill(&self, value: &Self) -> bool {
        match (on_cuda(self), on_cuda(value)) {
            (Some(stand_in), Some(value)) => fill(stand_in, value),
            _ => false,
        }
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

/// Queues the copy of `value` into `stand_in`; false where they differ in shape or
/// dtype (the copy itself then cannot fail but for a device fault).
fn fill(stand_in: &FusionTensor<Runtime>, value: &FusionTensor<Runtime>) -> bool {
    if stand_in.shape != value.shape || stand_in.dtype != value.dtype {
        return false;
    }
    let streams = OperationStreams::with_inputs([value, stand_in]);
    let inputs = [value.clone().into_ir(), stand_in.clone().into_ir()];
    let desc = CustomOpIr::new("fill_stand_in", &inputs, &[]);
    let op = FillOp { desc: desc.clone() };
    stand_in
        .client
        .register(streams, OperationIr::Custom(desc), op);
    true
}

/// Inputs `[value, stand_in]`: writes the value into the stand-in's buffer.
#[derive(Debug)]
struct FillOp {
    desc: CustomOpIr,
}

impl Operation<Runtime> for FillOp {
    fn execute(&self, handles: &mut Handles<CudaCube>) {
        let ([value, stand_in], []) = self.desc.as_fixed();
        let (value, stand_in) = (inner(handles, value), inner(handles, stand_in));
        if !stand_in.fill(&value) {
            // Shapes and dtypes were checked when the op was queued: only a device
            // fault fails the copy, and it fails the ops after it too.
            tracing::error!("a stand-in could not be filled");
        }
    }
}

/// `CudaCube`'s tensor behind `tensor`: all three kinds are `CubeTensor`s.
fn inner(handles: &mut Handles<CudaCube>, tensor: &TensorIr) -> CubeTensor<CudaGraphRuntime> {
    match tensor.dtype {
        DType::Bool(_) => handles.get_bool_tensor::<CudaCube>(tensor),
        dtype if dtype.is_float() => handles.get_float_tensor::<CudaCube>(tensor),
        _ => handles.get_int_tensor::<CudaCube>(tensor),
    }
}
