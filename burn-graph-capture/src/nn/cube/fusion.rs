//! A recurrence direction on `Fusion<B>`: one custom fusion op that runs `B`'s kernels on
//! the resolved tensors, so fusion neither splits nor re-fuses them.

use burn::tensor::ops::FloatTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend};
use burn_ir::{CustomOpIr, OperationIr, OperationOutput, TensorIr};

use crate::custom_op::Handles;

/// What one op runs on the inner backend: its inputs' tensors to its outputs'.
pub(crate) type Kernel<B, const I: usize, const O: usize> =
    fn([FloatTensor<B>; I]) -> [FloatTensor<B>; O];

#[derive(Debug)]
struct KernelOp<B: FusionBackend, const I: usize, const O: usize> {
    desc: CustomOpIr,
    kernel: Kernel<B, I, O>,
}

impl<B: FusionBackend, const I: usize, const O: usize> Operation<B::FusionRuntime>
    for KernelOp<B, I, O>
{
    fn execute(&self, handles: &mut Handles<B>) {
        let (inputs, outputs) = self.desc.as_fixed::<I, O>();
        let tensors = inputs
            .each_ref()
            .map(|input| handles.get_float_tensor::<B>(input));
        for (output, tensor) in outputs.iter().zip((self.kernel)(tensors)) {
            handles.register_float_tensor::<B>(&output.id, tensor);
        }
    }
}

/// Registers `kernel` as the custom op `name` reading `inputs` and making `outputs`
/// (declared with `custom_op::output`), and returns the outputs' tensors.
pub(crate) fn register<B: FusionBackend, const I: usize, const O: usize>(
    name: &'static str,
    inputs: [FloatTensor<Fusion<B>>; I],
    outputs: [TensorIr; O],
    kernel: Kernel<B, I, O>,
) -> [FloatTensor<Fusion<B>>; O] {
    let client = inputs[0].client.clone();
    let streams = OperationStreams::with_inputs(&inputs);
    let inputs = inputs.map(|tensor| tensor.into_ir());
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    let op = KernelOp::<B, I, O> {
        desc: desc.clone(),
        kernel,
    };
    client
        .register(streams, OperationIr::Custom(desc), op)
        .outputs::<O>()
}
