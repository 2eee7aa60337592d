//! The LSTM recurrence on `Fusion<B>`: each direction one custom fusion op
//! (`nn::cube::fusion`) running `B`'s kernels.

use burn::tensor::ops::FloatTensor;
use burn_fusion::{Fusion, FusionBackend};

use crate::custom_op::output;
use crate::nn::cube::fusion::register;
use crate::nn::lstm::backend::{LstmKernels, LstmSaved};

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
        let [states, gates] = register::<B, 4, 2>(
            "lstm_forward",
            [xp, wh, h0, c0],
            outputs,
            |[xp, wh, h0, c0]| {
                let (states, gates) = B::lstm_forward(xp, wh, h0, c0);
                [states, gates]
            },
        );
        (states, gates)
    }

    fn lstm_backward(
        d_states: FloatTensor<Self>,
        saved: LstmSaved<Self>,
    ) -> [FloatTensor<Self>; 4] {
        let [_, steps, batch, hidden] = saved.states.shape.dims();
        let four_h = 4 * hidden;
        let (like, dtype) = (&saved.states, saved.states.dtype);
        let outputs = [
            output::<B>(like, [batch, steps - 1, four_h], dtype),
            output::<B>(like, [hidden, four_h], dtype),
            output::<B>(like, [batch, hidden], dtype),
            output::<B>(like, [batch, hidden], dtype),
        ];
        let LstmSaved { states, gates, wh } = saved;
        register::<B, 4, 4>(
            "lstm_backward",
            [d_states, states, gates, wh],
            outputs,
            |[d_states, states, gates, wh]| {
                B::lstm_backward(d_states, LstmSaved { states, gates, wh })
            },
        )
    }
}
