//! `linear` and the two backward ops of it that multiply, as the decorator runs them on
//! a backend that routes matmuls (`RoutedMatmul::routes_matmul`): Burn's default
//! arithmetic (which the CubeCL stacks keep), with the product through
//! `RoutedMatmul::matmul`, so that `nn::Linear` reaches cuBLAS like any matmul. Other
//! backends run their own ops; the bias gradient multiplies nothing and stays `B`'s.

use burn::tensor::ops::FloatTensor;
use burn_backend::{Shape, TensorMetadata};

use super::RoutedMatmul;

/// `tensor` with leading size-1 dimensions up to `rank` (a weight broadcast over a batch).
fn with_rank<B: RoutedMatmul>(tensor: FloatTensor<B>, rank: usize) -> FloatTensor<B> {
    let shape = tensor.shape();
    if shape.num_dims() >= rank {
        return tensor;
    }
    let mut dims = vec![1; rank - shape.num_dims()];
    dims.extend(shape.iter().copied());
    B::float_reshape(tensor, Shape::from(dims))
}

/// `x @ weight (+ bias)`, weight `[d_input, d_output]`.
pub(super) fn linear<B: RoutedMatmul>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    if !B::routes_matmul(x.dtype()) {
        return B::linear(x, weight, bias);
    }
    let rank = x.shape().num_dims();
    let output = B::matmul(x, with_rank::<B>(weight, rank));
    match bias {
        Some(bias) => B::float_add(output, with_rank::<B>(bias, rank)),
        None => output,
    }
}

/// `output_grad @ weightᵀ`.
pub(super) fn linear_x_backward<B: RoutedMatmul>(
    weight: FloatTensor<B>,
    output_grad: FloatTensor<B>,
) -> FloatTensor<B> {
    if !B::routes_matmul(output_grad.dtype()) {
        return B::linear_x_backward(weight, output_grad);
    }
    let rank = output_grad.shape().num_dims();
    let weight = with_rank::<B>(B::float_swap_dims(weight, 0, 1), rank);
    B::matmul(output_grad, weight)
}

/// `xᵀ @ output_grad`, summed over the batch dimensions.
pub(super) fn linear_weight_backward<B: RoutedMatmul>(
    x: FloatTensor<B>,
    output_grad: FloatTensor<B>,
) -> FloatTensor<B> {
    if !B::routes_matmul(x.dtype()) {
        return B::linear_weight_backward(x, output_grad);
    }
    let rank = x.shape().num_dims();
    let mut grad = B::matmul(B::float_swap_dims(x, rank - 2, rank - 1), output_grad);
    if rank == 2 {
        return grad;
    }
    for dim in 0..rank - 2 {
        grad = B::float_sum_dim(grad, dim);
    }
    let shape = grad.shape();
    B::float_reshape(grad, Shape::new([shape[rank - 2], shape[rank - 1]]))
}
