//! The GRU recurrence on `Fusion<B>`: each direction one custom fusion op
//! (`nn::cube::fusion`) running `B`'s kernels.

use burn::tensor::ops::FloatTensor;
use burn_fusion::{Fusion, FusionBackend};

use crate::custom_op::output;
use crate::nn::cube::fusion::register;
use crate::nn::gru::{GruKernels, GruSaved};

impl<B: FusionBackend + GruKernels> GruKernels for Fusion<B> {
    fn gru_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        bh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [batch, time, three_h] = xp.shape.dims();
        let hidden = three_h / 3;
        let outputs = [
            output::<B>(&xp, [time + 1, batch, hidden], xp.dtype),
            output::<B>(&xp, [time, batch, 4 * hidden], xp.dtype),
        ];
        let [states, gates] = register::<B, 4, 2>(
            "gru_forward",
            [xp, wh, bh, h0],
            outputs,
            |[xp, wh, bh, h0]| {
                let (states, gates) = B::gru_forward(xp, wh, bh, h0);
                [states, gates]
            },
        );
        (states, gates)
    }

    fn gru_backward(d_states: FloatTensor<Self>, saved: GruSaved<Self>) -> [FloatTensor<Self>; 4] {
        let [steps, batch, hidden] = saved.states.shape.dims();
        let three_h = 3 * hidden;
        let (like, dtype) = (&saved.states, saved.states.dtype);
        let outputs = [
            output::<B>(like, [batch, steps - 1, three_h], dtype),
            output::<B>(like, [hidden, three_h], dtype),
            output::<B>(like, [three_h], dtype),
            output::<B>(like, [batch, hidden], dtype),
        ];
        let GruSaved { states, gates, wh } = saved;
        register::<B, 4, 4>(
            "gru_backward",
            [d_states, states, gates, wh],
            outputs,
            |[d_states, states, gates, wh]| {
                B::gru_backward(d_states, GruSaved { states, gates, wh })
            },
        )
    }
}
