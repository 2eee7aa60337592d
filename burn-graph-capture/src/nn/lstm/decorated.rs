//! The LSTM recurrence on `GraphCapture<B>`: `B`'s kernels, one recorded op each way
//! (`nn::decorated`).

use burn::tensor::ops::FloatTensor;

use super::backend::{LstmKernels, LstmSaved};
use crate::backend::{GraphBackend, GraphCapture};
use crate::nn::decorated::recorded;

impl<B: GraphBackend + LstmKernels> LstmKernels for GraphCapture<B> {
    fn lstm_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [states, gates] = recorded::<B, 4, 2>("lstm_forward", [xp, wh, h0, c0], |inputs| {
            let [xp, wh, h0, c0] = inputs;
            let (states, gates) = B::lstm_forward(xp, wh, h0, c0);
            [states, gates]
        });
        (states, gates)
    }

    fn lstm_backward(
        d_states: FloatTensor<Self>,
        saved: LstmSaved<Self>,
    ) -> [FloatTensor<Self>; 4] {
        let LstmSaved { states, gates, wh } = saved;
        recorded::<B, 4, 4>(
            "lstm_backward",
            [d_states, states, gates, wh],
            |[d_states, states, gates, wh]| {
                B::lstm_backward(d_states, LstmSaved { states, gates, wh })
            },
        )
    }
}
