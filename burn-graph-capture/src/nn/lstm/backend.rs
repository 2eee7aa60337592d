//! [`LstmBackend`]: the recurrence as a backend op, so that autodiff runs its own
//! backward (batched) instead of differentiating every step's small ops.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::recurrence;
use crate::backend::{GraphBackend, GraphCapture};

fn tensor<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

fn primitive<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> FloatTensor<B> {
    tensor.into_primitive().tensor()
}

/// A backend on which [`FusedLstm`](super::FusedLstm) runs: an LSTM layer's recurrence
/// as one op.
///
/// Shapes: `xp` `[batch, time, 4H]` (the input projection, gates packed
/// `[input, forget, cell, output]`), `wh` `[H, 4H]`, `h0` and `c0` `[batch, H]`; the
/// output is `[batch, time, 2H]`, each step's hidden state then its cell state. On
/// `Autodiff` it is one node with its own backward ([`LstmKernels`] of the inner backend).
pub trait LstmBackend: Backend {
    /// The recurrence's output.
    fn lstm_recurrence(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// How a backend without autodiff computes the recurrence and its gradient. Plain
/// tensor ops by default; a backend with fused kernels overrides the methods.
pub trait LstmKernels: Backend {
    /// The output and the activated gates `[batch, time, 4H]` that the backward reads.
    fn lstm_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (out, gates) =
            recurrence::forward::<Self>(tensor(xp), tensor(wh), tensor(h0), tensor(c0));
        (primitive(out), primitive(gates))
    }

    /// Gradients of `(xp, wh, h0, c0)` from the output's gradient `d_out`.
    fn lstm_backward(d_out: FloatTensor<Self>, saved: LstmSaved<Self>) -> [FloatTensor<Self>; 4] {
        let (d_xp, d_wh, d_h0, d_c0) = recurrence::backward::<Self>(
            tensor(d_out),
            tensor(saved.out),
            tensor(saved.gates),
            tensor(saved.wh),
            tensor(saved.h0),
            tensor(saved.c0),
        );
        [
            primitive(d_xp),
            primitive(d_wh),
            primitive(d_h0),
            primitive(d_c0),
        ]
    }
}

/// What the recurrence's backward reads from its forward.
#[derive(Debug)]
pub struct LstmSaved<B: Backend> {
    /// The forward's output, `[batch, time, 2H]`.
    pub out: FloatTensor<B>,
    /// The activated gates, `[batch, time, 4H]`.
    pub gates: FloatTensor<B>,
    /// The recurrent weight, `[H, 4H]`.
    pub wh: FloatTensor<B>,
    /// The initial hidden state, `[batch, H]`.
    pub h0: FloatTensor<B>,
    /// The initial cell state, `[batch, H]`.
    pub c0: FloatTensor<B>,
}

impl<B: Backend> Clone for LstmSaved<B> {
    fn clone(&self) -> Self {
        Self {
            out: self.out.clone(),
            gates: self.gates.clone(),
            wh: self.wh.clone(),
            h0: self.h0.clone(),
            c0: self.c0.clone(),
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

/// The decorator records the recurrence's ops like any others.
impl<B: GraphBackend> LstmKernels for GraphCapture<B> {}

/// Stock burn-cuda (and any CubeCL stack, with or without fusion) runs the module too.
#[cfg(feature = "cuda")]
mod cubecl_stacks {
    use super::LstmKernels;
    use burn_backend::DeviceOps;
    use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
    use burn_fusion::{Fusion, FusionBackend};
    use cubecl_runtime::server::ComputeServer;

    impl<B: FusionBackend> LstmKernels for Fusion<B> {}

    impl<R, F, I, BT> LstmKernels for CubeBackend<R, F, I, BT>
    where
        R: CubeRuntime,
        R::Server: ComputeServer,
        R::Device: DeviceOps,
        F: FloatElement,
        I: IntElement,
        BT: BoolElement,
    {
    }
}

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
                let (wh, h0, c0) = (wh.primitive, h0.primitive, c0.primitive);
                let (out, gates) =
                    B::lstm_forward(xp.primitive, wh.clone(), h0.clone(), c0.clone());
                let saved = LstmSaved {
                    out: out.clone(),
                    gates,
                    wh,
                    h0,
                    c0,
                };
                prep.finish(saved, out)
            }
            OpsKind::UnTracked(prep) => {
                let (out, _gates) =
                    B::lstm_forward(xp.primitive, wh.primitive, h0.primitive, c0.primitive);
                prep.finish(out)
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
        let d_out = grads.consume::<B>(&ops.node);
        let gradients = B::lstm_backward(d_out, ops.state);
        for (parent, gradient) in ops.parents.into_iter().zip(gradients) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, gradient);
            }
        }
    }
}
