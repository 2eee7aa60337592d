//! `RoutedMatmul::matmul` on `Fusion<B>`: a matmul that `B` routes elsewhere (cuBLAS) is
//! one custom fusion op running `B::matmul` on the resolved tensors. Fusion's own matmul
//! op would hand it to `B::float_matmul`, CubeCL's kernels, or fuse it into one of its
//! own.

use std::marker::PhantomData;

use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend};
use burn_ir::{CustomOpIr, OperationIr, OperationOutput};

use crate::backend::RoutedMatmul;
use crate::custom_op::{Handles, output};
use crate::runtime::blas::Gemm;

/// Inputs `[lhs, rhs]`, output their product.
#[derive(Debug)]
struct MatmulOp<B> {
    desc: CustomOpIr,
    backend: PhantomData<B>,
}

impl<B: FusionBackend + RoutedMatmul> Operation<B::FusionRuntime> for MatmulOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([lhs, rhs], [out]) = self.desc.as_fixed();
        let product = B::matmul(
            handles.get_float_tensor::<B>(lhs),
            handles.get_float_tensor::<B>(rhs),
        );
        handles.register_float_tensor::<B>(&out.id, product);
    }
}

/// `lhs @ rhs` on `Fusion<B>`, through `B::matmul` where `B` routes it.
pub(super) fn matmul<B: FusionBackend + RoutedMatmul>(
    lhs: FloatTensor<Fusion<B>>,
    rhs: FloatTensor<Fusion<B>>,
) -> FloatTensor<Fusion<B>> {
    let routed = lhs.dtype == rhs.dtype && B::routes_matmul(lhs.dtype);
    let Some(shape) = Gemm::output_shape(&lhs.shape, &rhs.shape)
        .ok()
        .filter(|_| routed)
    else {
        return Fusion::<B>::float_matmul(lhs, rhs);
    };
    let client = lhs.client.clone();
    let out = output::<B>(&lhs, shape, lhs.dtype);
    let streams = OperationStreams::with_inputs([&lhs, &rhs]);
    let desc = CustomOpIr::new("matmul", &[lhs.into_ir(), rhs.into_ir()], &[out]);
    let op = MatmulOp::<B> {
        desc: desc.clone(),
        backend: PhantomData,
    };
    client
        .register(streams, OperationIr::Custom(desc), op)
        .output()
}
