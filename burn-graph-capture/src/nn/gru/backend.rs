//! [`GruBackend`]: the GRU recurrence as a backend op, so that autodiff runs its own
//! backward (batched) instead of differentiating every step's small ops.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::recurrence::{self, Matmul};
use crate::nn::sequence::{primitive, tensor};

/// A backend on which [`FusedGru`](super::FusedGru) runs: a GRU layer's recurrence as one
/// op.
///
/// Shapes: `xp` `[batch, time, 3H]` (the input projection with its bias, gates packed
/// `[update, reset, new]`; any strides), `wh` `[H, 3H]`, `bh` `[3H]` (the hidden bias,
/// zeros for a layer without biases), `h0` `[batch, H]`; the output is the hidden
/// states `[time + 1, batch, H]`, the initial state at index 0 and step `t`'s at `t + 1`.
/// On `Autodiff` it is one node with its own backward ([`GruKernels`] of the inner
/// backend).
pub trait GruBackend: Backend {
    /// The recurrence's hidden states.
    fn gru_recurrence(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        bh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// How a backend without autodiff computes the recurrence and its gradient. Plain tensor
/// ops by default (`recurrence`); on this crate's CUDA runtime, where the shape allows,
/// one persistent kernel per direction.
pub trait GruKernels: Backend {
    /// The hidden states and what the backward reads, `[time, batch, 4H]`.
    fn gru_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        bh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        plain_forward::<Self>(xp, wh, bh, h0, Tensor::matmul)
    }

    /// Gradients of `(xp, wh, bh, h0)` from the hidden states' gradient `d_states`.
    fn gru_backward(d_states: FloatTensor<Self>, saved: GruSaved<Self>) -> [FloatTensor<Self>; 4] {
        plain_backward::<Self>(d_states, saved, Tensor::matmul)
    }
}

/// [`GruKernels::gru_forward`] in plain tensor ops (`recurrence::forward`), multiplying
/// with `matmul`.
pub(crate) fn plain_forward<B: Backend>(
    xp: FloatTensor<B>,
    wh: FloatTensor<B>,
    bh: FloatTensor<B>,
    h0: FloatTensor<B>,
    matmul: Matmul<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (states, saved) =
        recurrence::forward::<B>(tensor(xp), tensor(wh), tensor(bh), tensor(h0), matmul);
    (primitive(states), primitive(saved))
}

/// [`GruKernels::gru_backward`] in plain tensor ops (`recurrence::backward`), multiplying
/// with `matmul`.
pub(crate) fn plain_backward<B: Backend>(
    d_states: FloatTensor<B>,
    saved: GruSaved<B>,
    matmul: Matmul<B>,
) -> [FloatTensor<B>; 4] {
    let (d_xp, d_wh, d_bh, d_h0) = recurrence::backward::<B>(
        tensor(d_states),
        tensor(saved.states),
        tensor(saved.gates),
        tensor(saved.wh),
        matmul,
    );
    [
        primitive(d_xp),
        primitive(d_wh),
        primitive(d_bh),
        primitive(d_h0),
    ]
}

/// What the recurrence's backward reads from its forward.
#[derive(Debug)]
pub struct GruSaved<B: Backend> {
    /// The forward's hidden states, `[time + 1, batch, H]`.
    pub states: FloatTensor<B>,
    /// The activated gates and the new gate's hidden projection, `[time, batch, 4H]`.
    pub gates: FloatTensor<B>,
    /// The recurrent weight, `[H, 3H]`.
    pub wh: FloatTensor<B>,
}

impl<B: Backend> Clone for GruSaved<B> {
    fn clone(&self) -> Self {
        Self {
            states: self.states.clone(),
            gates: self.gates.clone(),
            wh: self.wh.clone(),
        }
    }
}

/// A backend without autodiff runs the recurrence as its kernels' forward.
impl<B: GruKernels> GruBackend for B {
    fn gru_recurrence(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        bh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::gru_forward(xp, wh, bh, h0).0
    }
}

#[cfg(feature = "flex")]
impl GruKernels for burn_flex::Flex {}

/// The recurrence as one autodiff node with its own backward.
impl<B: GruKernels, C: CheckpointStrategy> GruBackend for Autodiff<B, C> {
    fn gru_recurrence(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        bh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let parents = [
            xp.node.clone(),
            wh.node.clone(),
            bh.node.clone(),
            h0.node.clone(),
        ];
        match RecurrenceBackward
            .prepare::<C>(parents)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let wh = wh.primitive;
                let (states, gates) =
                    B::gru_forward(xp.primitive, wh.clone(), bh.primitive, h0.primitive);
                let saved = GruSaved {
                    states: states.clone(),
                    gates,
                    wh,
                };
                prep.finish(saved, states)
            }
            OpsKind::UnTracked(prep) => {
                let (states, _) =
                    B::gru_forward(xp.primitive, wh.primitive, bh.primitive, h0.primitive);
                prep.finish(states)
            }
        }
    }
}

/// The backward of [`GruBackend::gru_recurrence`] on autodiff.
#[derive(Debug)]
struct RecurrenceBackward;

impl<B: GruKernels> Backward<B, 4> for RecurrenceBackward {
    type State = GruSaved<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_states = grads.consume::<B>(&ops.node);
        let gradients = B::gru_backward(d_states, ops.state);
        for (parent, gradient) in ops.parents.into_iter().zip(gradients) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, gradient);
            }
        }
    }
}
