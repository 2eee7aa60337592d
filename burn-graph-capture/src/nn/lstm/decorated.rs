//! The recurrence on `GraphCapture<B>`: `B`'s kernels (fused on the CubeCL stacks),
//! recorded as one op each, so that a capture session sees what they read and produce
//! as it sees any other op's.

use burn::tensor::ops::FloatTensor;

use super::backend::{LstmKernels, LstmSaved};
use crate::backend::session::{OpRecorder, is_recording};
use crate::backend::{GraphBackend, GraphCapture};

impl<B: GraphBackend> LstmKernels for GraphCapture<B> {
    fn lstm_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let recorder = is_recording().then(|| {
            let mut rec = OpRecorder::default();
            [&xp, &wh, &h0, &c0].into_iter().for_each(|t| rec.tensor(t));
            rec
        });
        let (states, gates) = B::lstm_forward(xp, wh, h0, c0);
        if let Some(mut rec) = recorder {
            rec.output(&states);
            rec.output(&gates);
            rec.commit("lstm_forward", None);
        }
        (states, gates)
    }

    fn lstm_backward(
        d_states: FloatTensor<Self>,
        saved: LstmSaved<Self>,
    ) -> [FloatTensor<Self>; 4] {
        let recorder = is_recording().then(|| {
            let mut rec = OpRecorder::default();
            [&d_states, &saved.states, &saved.gates, &saved.wh]
                .into_iter()
                .for_each(|t| rec.tensor(t));
            rec
        });
        let saved = LstmSaved::<B> {
            states: saved.states,
            gates: saved.gates,
            wh: saved.wh,
        };
        let gradients = B::lstm_backward(d_states, saved);
        if let Some(mut rec) = recorder {
            gradients.iter().for_each(|t| rec.output(t));
            rec.commit("lstm_backward", None);
        }
        gradients
    }
}
