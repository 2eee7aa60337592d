//! Slicing and conversions the recurrences share (`lstm`, `gru`): steps of batch-first
//! sequences, blocks of time-major ones, gate columns of packed projections.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive, backend::Backend};

/// A float primitive as a tensor of rank `D`.
pub(crate) fn tensor<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

/// A float tensor's primitive.
pub(crate) fn primitive<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> FloatTensor<B> {
    tensor.into_primitive().tensor()
}

/// Step `t` of a `[batch, time, width]` tensor, as `[batch, width]`.
pub(crate) fn step<B: Backend>(tensor: &Tensor<B, 3>, t: usize) -> Tensor<B, 2> {
    let [batch, _, width] = tensor.dims();
    tensor
        .clone()
        .slice([0..batch, t..t + 1, 0..width])
        .reshape([batch, width])
}

/// Block `[index]` of a `[n, batch, width]` tensor, as `[batch, width]`.
pub(crate) fn at<B: Backend>(tensor: &Tensor<B, 3>, index: usize) -> Tensor<B, 2> {
    let [_, batch, width] = tensor.dims();
    tensor
        .clone()
        .slice([index..index + 1, 0..batch, 0..width])
        .reshape([batch, width])
}

/// Columns `[k * width, (k + 1) * width)` of a `[batch, n * width]` tensor.
pub(crate) fn part<B: Backend>(tensor: &Tensor<B, 2>, k: usize, width: usize) -> Tensor<B, 2> {
    let [batch, _] = tensor.dims();
    tensor.clone().slice([0..batch, k * width..(k + 1) * width])
}
