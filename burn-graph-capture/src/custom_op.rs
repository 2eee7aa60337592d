//! What this crate's custom fusion ops share (the matmul routed to cuBLAS, `FusedLstm`'s
//! recurrence): the handles an op resolves its tensors from, and how it declares an
//! output.

use burn_backend::{DType, Shape};
use burn_fusion::{FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{HandleContainer, TensorIr};

/// The handles a custom op of `Fusion<B>` resolves its inputs from and registers its
/// outputs into.
pub(crate) type Handles<B> =
    HandleContainer<<<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle>;

/// An output of `shape` and `dtype`, to be made by a custom op of `like`'s client.
pub(crate) fn output<B: FusionBackend>(
    like: &FusionTensor<B::FusionRuntime>,
    shape: impl Into<Shape>,
    dtype: DType,
) -> TensorIr {
    TensorIr::uninit(like.client.create_empty_handle(), shape.into(), dtype)
}
