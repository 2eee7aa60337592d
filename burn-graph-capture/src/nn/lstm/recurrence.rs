//! The recurrence of one LSTM layer and its gradient, in plain tensor ops.
//!
//! Gates are packed `[input, forget, cell, output]` along the last dimension (`4H`).
//! The forward output packs each step's hidden and cell state, `[batch, time, 2H]`
//! (`h_t` then `c_t`), so one op carries the sequence and the final state.

use burn::tensor::activation::sigmoid;
use burn::tensor::{Tensor, backend::Backend};

/// Step `t` of a `[batch, time, width]` tensor, as `[batch, width]`.
fn step<B: Backend>(tensor: &Tensor<B, 3>, t: usize) -> Tensor<B, 2> {
    let [batch, _, width] = tensor.dims();
    tensor
        .clone()
        .slice([0..batch, t..t + 1, 0..width])
        .reshape([batch, width])
}

/// Columns `[k * width, (k + 1) * width)` of a `[batch, n * width]` tensor.
fn part<B: Backend>(tensor: &Tensor<B, 2>, k: usize, width: usize) -> Tensor<B, 2> {
    let [batch, _] = tensor.dims();
    tensor.clone().slice([0..batch, k * width..(k + 1) * width])
}

/// The layer's outputs `[batch, time, 2H]` and its activated gates `[batch, time, 4H]`
/// (what the backward needs), from the input projection `xp = x @ W_x + b`
/// `[batch, time, 4H]`, the recurrent weight `wh` `[H, 4H]` and the initial state.
pub(crate) fn forward<B: Backend>(
    xp: Tensor<B, 3>,
    wh: Tensor<B, 2>,
    h0: Tensor<B, 2>,
    c0: Tensor<B, 2>,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let [_, time, four_h] = xp.dims();
    let hidden = four_h / 4;
    let (mut h, mut c) = (h0, c0);
    let mut outputs = Vec::with_capacity(time);
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
        outputs.push(Tensor::cat(vec![h.clone(), c.clone()], 1));
    }
    (Tensor::stack(outputs, 1), Tensor::stack(gates, 1))
}

/// Gradients of the recurrence's inputs `(xp, wh, h0, c0)` from the gradient of its
/// output `d_out` `[batch, time, 2H]`, given what [`forward`] returned.
pub(crate) fn backward<B: Backend>(
    d_out: Tensor<B, 3>,
    out: Tensor<B, 3>,
    gates: Tensor<B, 3>,
    wh: Tensor<B, 2>,
    h0: Tensor<B, 2>,
    c0: Tensor<B, 2>,
) -> (Tensor<B, 3>, Tensor<B, 2>, Tensor<B, 2>, Tensor<B, 2>) {
    let [batch, time, two_h] = out.dims();
    let hidden = two_h / 2;
    let wh_t = wh.transpose();
    let mut dh_next = h0.zeros_like();
    let mut dc_next = c0.zeros_like();
    let mut dz_steps = Vec::with_capacity(time);
    for t in (0..time).rev() {
        let d_out_t = step(&d_out, t);
        let out_t = step(&out, t);
        let gates_t = step(&gates, t);
        let (i, f) = (part(&gates_t, 0, hidden), part(&gates_t, 1, hidden));
        let (g, o) = (part(&gates_t, 2, hidden), part(&gates_t, 3, hidden));
        let c_prev = if t == 0 {
            c0.clone()
        } else {
            part(&step(&out, t - 1), 1, hidden)
        };
        let tanh_c = part(&out_t, 1, hidden).tanh();
        let dh = part(&d_out_t, 0, hidden) + dh_next;
        let dc = dc_next
            + part(&d_out_t, 1, hidden)
            + dh.clone() * o.clone() * (tanh_c.clone().powi_scalar(2).neg() + 1.0);
        let d_o = dh * tanh_c;
        let dz_i = dc.clone() * g.clone() * i.clone() * (i.clone().neg() + 1.0);
        let dz_f = dc.clone() * c_prev * f.clone() * (f.clone().neg() + 1.0);
        let dz_g = dc.clone() * i * (g.powi_scalar(2).neg() + 1.0);
        let dz_o = d_o * o.clone() * (o.neg() + 1.0);
        dc_next = dc * f;
        let dz = Tensor::cat(vec![dz_i, dz_f, dz_g, dz_o], 1);
        dh_next = dz.clone().matmul(wh_t.clone());
        dz_steps.push(dz);
    }
    dz_steps.reverse();
    let dz = Tensor::stack::<3>(dz_steps, 1);
    // h_{t-1} for every step: h0, then the outputs' hidden states but the last.
    let h0 = h0.unsqueeze_dim::<3>(1);
    let h_prev = match time {
        1 => h0,
        _ => Tensor::cat(vec![h0, out.slice([0..batch, 0..time - 1, 0..hidden])], 1),
    };
    let d_wh = h_prev
        .reshape([batch * time, hidden])
        .transpose()
        .matmul(dz.clone().reshape([batch * time, 4 * hidden]));
    (dz, d_wh, dh_next, dc_next)
}
