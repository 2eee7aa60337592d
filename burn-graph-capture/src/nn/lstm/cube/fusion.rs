//! The recurrence on `Fusion<B>`: each direction is one custom fusion op that runs `B`'s
//! kernels on the resolved tensors, so fusion neither splits nor re-fuses them.

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend};
use burn_ir::{CustomOpIr, OperationIr, OperationOutput};

use crate::backend::custom_op::{Handles, output};
use crate::nn::lstm::backend::{LstmKernels, LstmSaved};

/// The forward: inputs `[xp, wh, h0, c0]`, outputs `[states, gates]`.
#[derive(Debug)]
struct ForwardOp<B> {
    desc: CustomOpIr,
    backend: PhantomData<B>,
}

impl<B: FusionBackend + LstmKernels> Operation<B::FusionRuntime> for ForwardOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([xp, wh, h0, c0], [states, gates]) = self.desc.as_fixed();
        let (s, g) = B::lstm_forward(
            handles.get_float_tensor::<B>(xp),
            handles.get_float_tensor::<B>(wh),
            handles.get_float_tensor::<B>(h0),
            handles.get_float_tensor::<B>(c0),
        );
        handles.register_float_tensor::<B>(&states.id, s);
        handles.register_float_tensor::<B>(&gates.id, g);
    }
}

/// The backward: inputs `[d_states, states, gates, wh]`, outputs the gradients of
/// `[xp, wh, h0, c0]`.
#[derive(Debug)]
struct BackwardOp<B> {
    desc: CustomOpIr,
    backend: PhantomData<B>,
}

impl<B: FusionBackend + LstmKernels> Operation<B::FusionRuntime> for BackwardOp<B> {
    fn execute(&self, handles: &mut Handles<B>) {
        let ([d_states, states, gates, wh], outputs) = self.desc.as_fixed::<4, 4>();
        let saved = LstmSaved::<B> {
            states: handles.get_float_tensor::<B>(states),
            gates: handles.get_float_tensor::<B>(gates),
            wh: handles.get_float_tensor::<B>(wh),
        };
        let gradients = B::lstm_backward(handles.get_float_tensor::<B>(d_states), saved);
        for (out, gradient) in outputs.iter().zip(gradients) {
            handles.register_float_tensor::<B>(&out.id, gradient);
        }
    }
}

impl<B: FusionBackend + LstmKernels> LstmKernels for Fusion<B> {
    fn lstm_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [batch, time, four_h] = xp.shape.dims();
        let hidden = four_h / 4;
        let outputs = [
            output::<B>(&xp, [2, time + 1, batch, hidden], xp.dtype),
            output::<B>(&xp, [time, batch, four_h], xp.dtype),
        ];
        let client = xp.client.clone();
        let streams = OperationStreams::with_inputs([&xp, &wh, &h0, &c0]);
        let inputs = [xp.into_ir(), wh.into_ir(), h0.into_ir(), c0.into_ir()];
        let desc = CustomOpIr::new("lstm_forward", &inputs, &outputs);
        let op = ForwardOp::<B> {
            desc: desc.clone(),
            backend: PhantomData,
        };
        let [states, gates] = client
            .register(streams, OperationIr::Custom(desc), op)
            .outputs::<2>();
        (states, gates)
    }

    fn lstm_backward(
        d_states: FloatTensor<Self>,
        saved: LstmSaved<Self>,
    ) -> [FloatTensor<Self>; 4] {
        let [_, steps, batch, hidden] = saved.states.shape.dims();
        let four_h = 4 * hidden;
        let dtype = saved.states.dtype;
        let like = &saved.states;
        let outputs = [
            output::<B>(like, [batch, steps - 1, four_h], dtype),
            output::<B>(like, [hidden, four_h], dtype),
            output::<B>(like, [batch, hidden], dtype),
            output::<B>(like, [batch, hidden], dtype),
        ];
        let client = d_states.client.clone();
        let streams =
            OperationStreams::with_inputs([&d_states, &saved.states, &saved.gates, &saved.wh]);
        let inputs = [
            d_states.into_ir(),
            saved.states.into_ir(),
            saved.gates.into_ir(),
            saved.wh.into_ir(),
        ];
        let desc = CustomOpIr::new("lstm_backward", &inputs, &outputs);
        let op = BackwardOp::<B> {
            desc: desc.clone(),
            backend: PhantomData,
        };
        client
            .register(streams, OperationIr::Custom(desc), op)
            .outputs::<4>()
    }
}
