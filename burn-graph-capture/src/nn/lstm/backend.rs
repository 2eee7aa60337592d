//! [`LstmBackend`]: the recurrence as a backend op, so that autodiff runs its own
//! backward (batched) instead of differentiating every step's small ops.

use super::recurrence;
pub(crate) use crate::nn::sequence::{primitive, tensor};
use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// A backend on which [`FusedLstm`](super::FusedLstm) runs: an LSTM layer's recurrence
/// as one op.
///
/// Shapes: `xp` `[batch, time, 4H]` (the input projection, gates packed
/// `[input, forget, cell, output]`; any strides), `wh` `[H, 4H]`, `h0` and `c0`
/// `[batch, H]`; the output is the states `[2, time + 1, batch, H]`: hidden states at
/// `[0]`, cell states at `[1]`, the initial state at time index 0 and step `t`'s at
/// `t + 1`. On `Autodiff` it is one node with its own backward ([`LstmKernels`] of the
/// inner backend).
pub trait LstmBackend: Backend {
    /// The recurrence's states.
    fn lstm_recurrence(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// How a backend without autodiff computes the recurrence and its gradient. Plain
/// tensor ops by default (`recurrence`); the CubeCL stacks override both with fused
/// kernels.
pub trait LstmKernels: Backend {
    /// The states and the activated gates `[time, batch, 4H]` that the backward reads.
    fn lstm_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        plain_forward::<Self>(xp, wh, h0, c0)
    }

    /// Gradients of `(xp, wh, h0, c0)` from the states' gradient `d_states`.
    fn lstm_backward(
        d_states: FloatTensor<Self>,
        saved: LstmSaved<Self>,
    ) -> [FloatTensor<Self>; 4] {
        plain_backward::<Self>(d_states, saved)
    }
}

/// [`LstmKernels::lstm_forward`] in plain tensor ops (`recurrence::forward`).
pub(crate) fn plain_forward<B: Backend>(
    xp: FloatTensor<B>,
    wh: FloatTensor<B>,
    h0: FloatTensor<B>,
    c0: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (states, gates) = recurrence::forward::<B>(tensor(xp), tensor(wh), tensor(h0), tensor(c0));
    (primitive(states), primitive(gates))
}

/// [`LstmKernels::lstm_backward`] in plain tensor ops (`recurrence::backward`).
pub(crate) fn plain_backward<B: Backend>(
    d_states: FloatTensor<B>,
    saved: LstmSaved<B>,
) -> [FloatTensor<B>; 4] {
    let (d_xp, d_wh, d_h0, d_c0) = recurrence::backward::<B>(
        tensor(d_states),
        tensor(saved.states),
        tensor(saved.gates),
        tensor(saved.wh),
    );
    [
        primitive(d_xp),
        primitive(d_wh),
        primitive(d_h0),
        primitive(d_c0),
    ]
}

/// What the recurrence's backward reads from its forward.
#[derive(Debug)]
pub struct LstmSaved<B: Backend> {
    /// The forward's states, `[2, time + 1, batch, H]`.
    pub states: FloatTensor<B>,
    /// The activated gates, `[time, batch, 4H]`.
    pub gates: FloatTensor<B>,
    /// The recurrent weight, `[H, 4H]`.
    pub wh: FloatTensor<B>,
}

impl<B: Backend> Clone for LstmSaved<B> {
    fn clone(&self) -> Self {
        Self {
            states: self.states.clone(),
            gates: self.gates.clone(),
            wh: self.wh.clone(),
        }
    }
}

/// A backend without autodiff runs the recurrence as its kernels' forward.
impl<B: LstmKernels> LstmBackend for B {
    fn lstm_recurrence(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::lstm_forward(xp, wh, h0, c0).0
    }
}

#[cfg(feature = "flex")]
impl LstmKernels for burn_flex::Flex {}

/// The recurrence as one autodiff node with its own backward.
impl<B: LstmKernels, C: CheckpointStrategy> LstmBackend for Autodiff<B, C> {
    fn lstm_recurrence(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let parents = [
            xp.node.clone(),
            wh.node.clone(),
            h0.node.clone(),
            c0.node.clone(),
        ];
        match RecurrenceBackward
            .prepare::<C>(parents)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let wh = wh.primitive;
                let (states, gates) =
                    B::lstm_forward(xp.primitive, wh.clone(), h0.primitive, c0.primitive);
                let saved = LstmSaved {
                    states: states.clone(),
                    gates,
                    wh,
                };
                prep.finish(saved, states)
            }
            OpsKind::UnTracked(prep) => {
                let (states, _gates) =
                    B::lstm_forward(xp.primitive, wh.primitive, h0.primitive, c0.primitive);
                prep.finish(states)
            }
        }
    }
}

/// The backward of [`LstmBackend::lstm_recurrence`] on autodiff.
#[derive(Debug)]
struct RecurrenceBackward;

impl<B: LstmKernels> Backward<B, 4> for RecurrenceBackward {
    type State = LstmSaved<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_states = grads.consume::<B>(&ops.node);
        let gradients = B::lstm_backward(d_states, ops.state);
        for (parent, gradient) in ops.parents.into_iter().zip(gradients) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, gradient);
            }
        }
    }
}
