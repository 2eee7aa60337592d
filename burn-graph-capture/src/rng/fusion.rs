//! The generator on `Fusion<B>`: a draw and an advance are each one custom fusion op
//! running `B`'s kernels on the resolved state, so fusion neither reorders them around
//! the state nor fuses them with anything.

use std::marker::PhantomData;

use burn::tensor::Distribution;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_backend::{FloatDType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend};
use burn_ir::{CustomOpIr, OperationIr, OperationOutput};

use super::RandomDraws;
use crate::custom_op::{Handles, output};

/// Input `[state]`, output the draw.
#[derive(Debug)]
struct RandomOp<B> {
    desc: CustomOpIr,
    draw: u32,
    distribution: Distribution,
    dtype: FloatDType,
    backend: PhantomData<B>,
}

impl<B: FusionBackend + RandomDraws> Operation<B::FusionRuntime> for RandomOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([state], [out]) = self.desc.as_fixed();
        let values = B::random(
            &handles.get_int_tensor::<B>(state),
            self.draw,
            out.shape.clone(),
            self.distribution,
            self.dtype,
        );
        handles.register_float_tensor::<B>(&out.id, values);
    }
}

/// Input `[state]`, output the advanced state.
#[derive(Debug)]
struct AdvanceOp<B> {
    desc: CustomOpIr,
    draws: u32,
    backend: PhantomData<B>,
}

impl<B: FusionBackend + RandomDraws> Operation<B::FusionRuntime> for AdvanceOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([state], [out]) = self.desc.as_fixed();
        let next = B::advance_random(handles.get_int_tensor::<B>(state), self.draws);
        handles.register_int_tensor::<B>(&out.id, next);
    }
}

/// `RandomDraws::random` on `Fusion<B>`.
pub(crate) fn random<B: FusionBackend + RandomDraws>(
    state: &IntTensor<Fusion<B>>,
    draw: u32,
    shape: Shape,
    distribution: Distribution,
    dtype: FloatDType,
) -> FloatTensor<Fusion<B>> {
    let client = state.client.clone();
    let out = output::<B>(state, shape, dtype.into());
    let streams = OperationStreams::with_inputs([state]);
    let desc = CustomOpIr::new("random", &[state.clone().into_ir()], &[out]);
    let op = RandomOp::<B> {
        desc: desc.clone(),
        draw,
        distribution,
        dtype,
        backend: PhantomData,
    };
    client
        .register(streams, OperationIr::Custom(desc), op)
        .output()
}

/// `RandomDraws::advance_random` on `Fusion<B>`.
pub(crate) fn advance<B: FusionBackend + RandomDraws>(
    state: IntTensor<Fusion<B>>,
    draws: u32,
) -> IntTensor<Fusion<B>> {
    let client = state.client.clone();
    let out = output::<B>(&state, state.shape.clone(), state.dtype);
    let streams = OperationStreams::with_inputs([&state]);
    let desc = CustomOpIr::new("random_advance", &[state.into_ir()], &[out]);
    let op = AdvanceOp::<B> {
        desc: desc.clone(),
        draws,
        backend: PhantomData,
    };
    client
        .register(streams, OperationIr::Custom(desc), op)
        .output()
}
