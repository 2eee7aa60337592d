//! The GRU recurrence on `GraphCapture<B>`: `B`'s kernels, one recorded op each way
//! (`nn::decorated`).

use burn::tensor::ops::FloatTensor;

use super::backend::{GruKernels, GruSaved};
use crate::backend::{GraphBackend, GraphCapture};
use crate::nn::decorated::recorded;

impl<B: GraphBackend + GruKernels> GruKernels for GraphCapture<B> {
    fn gru_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        bh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [states, gates] = recorded::<B, 4, 2>("gru_forward", [xp, wh, bh, h0], |inputs| {
            let [xp, wh, bh, h0] = inputs;
            let (states, gates) = B::gru_forward(xp, wh, bh, h0);
            [states, gates]
        });
        (states, gates)
    }

    fn gru_backward(d_states: FloatTensor<Self>, saved: GruSaved<Self>) -> [FloatTensor<Self>; 4] {
        let GruSaved { states, gates, wh } = saved;
        recorded::<B, 4, 4>(
            "gru_backward",
            [d_states, states, gates, wh],
            |[d_states, states, gates, wh]| {
                B::gru_backward(d_states, GruSaved { states, gates, wh })
            },
        )
    }
}
