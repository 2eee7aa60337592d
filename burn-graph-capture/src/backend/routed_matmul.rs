//! [`RoutedMatmul`]: a backend whose matmuls may run elsewhere than its op trait says.
//!
//! The decorator sends `float_matmul`, `linear` and its two multiplying gradients here,
//! so a backend can route fp32 GEMMs to cuBLAS (this crate's CUDA stacks do). The
//! defaults run the backend's own `float_matmul`.

use burn::tensor::ops::FloatTensor;
use burn_backend::{Backend, DType};

/// How the backend multiplies matrices for the decorator.
pub trait RoutedMatmul: Backend {
    /// `lhs @ rhs`, batched as `float_matmul`.
    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(lhs, rhs)
    }

    /// Whether [`matmul`](Self::matmul) routes matmuls of `dtype` (then `linear` is
    /// computed around it rather than by the backend's own `linear`).
    fn routes_matmul(_dtype: DType) -> bool {
        false
    }
}
