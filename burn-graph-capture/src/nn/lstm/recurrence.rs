//! The recurrence of one LSTM layer and its gradient, in plain tensor ops: what every
//! backend without fused kernels runs, and the reference the fused kernels follow.
//!
//! Gates are packed `[input, forget, cell, output]` along the last dimension (`4H`).
//! The forward returns the states `[2, time + 1, batch, H]`: hidden states at `[0]`,
//! cell states at `[1]`, the initial state at time index 0 and step `t`'s result at
//! `t + 1`. Time-major, so that each step's hidden state (the next step's GEMM input)
//! and the whole sequence of previous hidden states (the weight gradient's input) are
//! contiguous blocks.

use burn::tensor::activation::sigmoid;
use burn::tensor::{Tensor, backend::Backend};

use crate::nn::sequence::{at, part, step};

/// The hidden (`kind` 0) or cell (`kind` 1) states `[time + 1, batch, H]` of `states`.
pub(crate) fn states_of<B: Backend>(states: &Tensor<B, 4>, kind: usize) -> Tensor<B, 3> {
    let [_, steps, batch, hidden] = states.dims();
    states
        .clone()
        .slice([kind..kind + 1, 0..steps, 0..batch, 0..hidden])
        .reshape([steps, batch, hidden])
}

/// The layer's states `[2, time + 1, batch, H]` and its activated gates
/// `[time, batch, 4H]` (what the backward needs), from the input projection
/// `xp = x @ W_x + b` `[batch, time, 4H]`, the recurrent weight `wh` `[H, 4H]` and the
/// initial state.
pub(crate) fn forward<B: Backend>(
    xp: Tensor<B, 3>,
    wh: Tensor<B, 2>,
    h0: Tensor<B, 2>,
    c0: Tensor<B, 2>,
) -> (Tensor<B, 4>, Tensor<B, 3>) {
    let [_, time, four_h] = xp.dims();
    let hidden = four_h / 4;
    let (mut h, mut c) = (h0, c0);
    let (mut hs, mut cs) = (vec![h.clone()], vec![c.clone()]);
    let mut gates = Vec::with_capacity(time);
    for t in 0..time {
        let z = step(&xp, t) + h.matmul(wh.clone());
        let i = sigmoid(part(&z, 0, hidden));
        let f = sigmoid(part(&z, 1, hidden));
        let g = part(&z, 2, hidden).tanh();
        let o = sigmoid(part(&z, 3, hidden));
        c = f.clone() * c + i.clone() * g.clone();
        h = o.clone() * c.clone().tanh();
        gates.push(Tensor::cat(vec![i, f, g, o], 1));
        hs.push(h.clone());
        cs.push(c.clone());
    }
    let states = Tensor::stack::<4>(
        vec![Tensor::stack::<3>(hs, 0), Tensor::stack::<3>(cs, 0)],
        0,
    );
    (states, Tensor::stack(gates, 0))
}

/// Gradients of the recurrence's inputs `(xp, wh, h0, c0)` from the gradient of its
/// states `d_states` `[2, time + 1, batch, H]`, given what [`forward`] returned.
pub(crate) fn backward<B: Backend>(
    d_states: Tensor<B, 4>,
    states: Tensor<B, 4>,
    gates: Tensor<B, 3>,
    wh: Tensor<B, 2>,
) -> (Tensor<B, 3>, Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 2>) {
    let [_, steps, batch, hidden] = states.dims();
    let time = steps - 1;
    let (d_hs, d_cs) = (states_of(&d_states, 0), states_of(&d_states, 1));
    let (hs, cs) = (states_of(&states, 0), states_of(&states, 1));
    let wh_t = wh.transpose();
    let mut carried: Option<(Tensor<B, 2>, Tensor<B, 2>)> = None;
    let mut dz_steps = Vec::with_capacity(time);
    for t in (0..time).rev() {
        let gates_t = at(&gates, t);
        let (i, f) = (part(&gates_t, 0, hidden), part(&gates_t, 1, hidden));
        let (g, o) = (part(&gates_t, 2, hidden), part(&gates_t, 3, hidden));
        let tanh_c = at(&cs, t + 1).tanh();
        let (mut dh, mut dc) = (at(&d_hs, t + 1), at(&d_cs, t + 1));
        if let Some((dh_next, dc_next)) = carried {
            dh = dh + dh_next;
            dc = dc + dc_next;
        }
        let dc = dc + dh.clone() * o.clone() * (tanh_c.clone().powi_scalar(2).neg() + 1.0);
        let d_o = dh * tanh_c;
        let dz_i = dc.clone() * g.clone() * i.clone() * (i.clone().neg() + 1.0);
        let dz_f = dc.clone() * at(&cs, t) * f.clone() * (f.clone().neg() + 1.0);
        let dz_g = dc.clone() * i * (g.powi_scalar(2).neg() + 1.0);
        let dz_o = d_o * o.clone() * (o.neg() + 1.0);
        let dz = Tensor::cat(vec![dz_i, dz_f, dz_g, dz_o], 1);
        carried = Some((dz.clone().matmul(wh_t.clone()), dc * f));
        dz_steps.push(dz);
    }
    dz_steps.reverse();
    let (d_h0, d_c0) = match carried {
        Some((dh, dc)) => (dh + at(&d_hs, 0), dc + at(&d_cs, 0)),
        None => (at(&d_hs, 0), at(&d_cs, 0)),
    };
    if time == 0 {
        let four_h = 4 * hidden;
        let device = states.device();
        return (
            Tensor::zeros([batch, 0, four_h], &device),
            Tensor::zeros([hidden, four_h], &device),
            d_h0,
            d_c0,
        );
    }
    let dz = Tensor::stack::<3>(dz_steps, 0);
    // h_{t-1} for every step: the hidden states but the last, one block.
    let h_prev = hs.slice([0..time, 0..batch, 0..hidden]);
    let d_wh = h_prev
        .reshape([time * batch, hidden])
        .transpose()
        .matmul(dz.clone().reshape([time * batch, 4 * hidden]));
    (dz.swap_dims(0, 1), d_wh, d_h0, d_c0)
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use crate::backend::{CaptureSession, GraphCapture};
    use burn::tensor::Distribution;
    use burn_flex::Flex;

    type B = GraphCapture<Flex>;

    fn random<const D: usize>(shape: [usize; D]) -> Tensor<B, D> {
        Tensor::random(shape, Distribution::Default, &Default::default())
    }

    /// The batched form: per step one recurrent GEMM forward and one backward, and the
    /// recurrent weight gradient once per sequence.
    #[test]
    fn one_recurrent_gemm_per_step_each_way() {
        let (batch, time, hidden) = (3, 5, 4);
        let (wh, h0, c0) = (
            random([hidden, 4 * hidden]),
            random([batch, hidden]),
            random([batch, hidden]),
        );
        let matmuls = |recording: crate::backend::Recording| {
            let ops = recording.signature.ops();
            ops.iter().filter(|op| op.op == "float_matmul").count()
        };
        let ((states, gates), forward_ops) = CaptureSession::record(|| {
            forward(random([batch, time, 4 * hidden]), wh.clone(), h0, c0)
        });
        assert_eq!(states.dims(), [2, time + 1, batch, hidden]);
        assert_eq!(gates.dims(), [time, batch, 4 * hidden]);
        assert_eq!(matmuls(forward_ops), time);
        let d_states = random([2, time + 1, batch, hidden]);
        let ((d_xp, d_wh, d_h0, _), backward_ops) =
            CaptureSession::record(|| backward(d_states, states, gates, wh));
        assert_eq!(d_xp.dims(), [batch, time, 4 * hidden]);
        assert_eq!(d_wh.dims(), [hidden, 4 * hidden]);
        assert_eq!(d_h0.dims(), [batch, hidden]);
        assert_eq!(matmuls(backward_ops), time + 1);
    }
}
