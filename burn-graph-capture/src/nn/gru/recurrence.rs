//! The recurrence of one GRU layer and its gradient, in plain tensor ops.
//!
//! Gates are packed `[update z, reset r, new n]` along the last dimension (`3H`). The
//! forward returns the hidden states `[time + 1, batch, H]` (the initial state at index 0,
//! step `t`'s at `t + 1`; time-major, so that the weight gradient's input is one block)
//! and what the backward reads, `[time, batch, 4H]`: the activated gates `z`, `r`, `n`
//! and the new gate's hidden projection `h W_hn + b_hn` (the reset gate's other factor).

use burn::tensor::activation::sigmoid;
use burn::tensor::{Tensor, backend::Backend};

use crate::nn::sequence::{at, part, step};

/// How the recurrence multiplies: `Tensor::matmul`, or a backend's faster or more exact
/// GEMM (cuBLAS on this crate's runtime, where CubeCL's matmul may run at TF32).
pub(crate) type Matmul<B> = fn(Tensor<B, 2>, Tensor<B, 2>) -> Tensor<B, 2>;

/// The layer's hidden states `[time + 1, batch, H]` and saved gates `[time, batch, 4H]`,
/// from the input projection `xp = x @ W_x + b_x` `[batch, time, 3H]`, the recurrent
/// weight `wh` `[H, 3H]` and bias `bh` `[3H]`, and the initial state `h0` `[batch, H]`.
pub(crate) fn forward<B: Backend>(
    xp: Tensor<B, 3>,
    wh: Tensor<B, 2>,
    bh: Tensor<B, 1>,
    h0: Tensor<B, 2>,
    matmul: Matmul<B>,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let [_, time, three_h] = xp.dims();
    let hidden = three_h / 3;
    let bh = bh.reshape([1, three_h]);
    let mut h = h0;
    let mut hs = vec![h.clone()];
    let mut saved = Vec::with_capacity(time);
    for t in 0..time {
        let x = step(&xp, t);
        let hp = matmul(h.clone(), wh.clone()) + bh.clone();
        let z = sigmoid(part(&x, 0, hidden) + part(&hp, 0, hidden));
        let r = sigmoid(part(&x, 1, hidden) + part(&hp, 1, hidden));
        let hn = part(&hp, 2, hidden);
        let n = (part(&x, 2, hidden) + r.clone() * hn.clone()).tanh();
        h = n.clone() * (z.clone().neg() + 1.0) + z.clone() * h;
        saved.push(Tensor::cat(vec![z, r, n, hn], 1));
        hs.push(h.clone());
    }
    (Tensor::stack(hs, 0), Tensor::stack(saved, 0))
}

/// Gradients of `(xp, wh, bh, h0)` from the gradient of the hidden states `d_states`
/// `[time + 1, batch, H]`, given what [`forward`] returned.
pub(crate) fn backward<B: Backend>(
    d_states: Tensor<B, 3>,
    states: Tensor<B, 3>,
    saved: Tensor<B, 3>,
    wh: Tensor<B, 2>,
    matmul: Matmul<B>,
) -> (Tensor<B, 3>, Tensor<B, 2>, Tensor<B, 1>, Tensor<B, 2>) {
    let [steps, batch, hidden] = states.dims();
    let time = steps - 1;
    let three_h = 3 * hidden;
    let device = states.device();
    if time == 0 {
        return (
            Tensor::zeros([batch, 0, three_h], &device),
            Tensor::zeros([hidden, three_h], &device),
            Tensor::zeros([three_h], &device),
            at(&d_states, 0),
        );
    }
    let wh_t = wh.transpose();
    let mut carried: Option<Tensor<B, 2>> = None;
    let (mut dxp, mut dhp) = (Vec::with_capacity(time), Vec::with_capacity(time));
    for t in (0..time).rev() {
        let gates = at(&saved, t);
        let (z, r) = (part(&gates, 0, hidden), part(&gates, 1, hidden));
        let (n, hn) = (part(&gates, 2, hidden), part(&gates, 3, hidden));
        let h_prev = at(&states, t);
        let mut dh = at(&d_states, t + 1);
        if let Some(next) = carried {
            dh = dh + next;
        }
        let da_n = dh.clone() * (z.clone().neg() + 1.0) * (n.clone().powi_scalar(2).neg() + 1.0);
        let da_z = dh.clone() * (h_prev - n) * z.clone() * (z.clone().neg() + 1.0);
        let da_r = da_n.clone() * hn * r.clone() * (r.clone().neg() + 1.0);
        let d_hp = Tensor::cat(vec![da_z.clone(), da_r.clone(), da_n.clone() * r], 1);
        carried = Some(dh * z + matmul(d_hp.clone(), wh_t.clone()));
        dxp.push(Tensor::cat(vec![da_z, da_r, da_n], 1));
        dhp.push(d_hp);
    }
    dxp.reverse();
    dhp.reverse();
    let d_h0 = carried.expect("time > 0") + at(&d_states, 0);
    let dhp = Tensor::stack::<3>(dhp, 0).reshape([time * batch, three_h]);
    let h_prev = states
        .slice([0..time, 0..batch, 0..hidden])
        .reshape([time * batch, hidden]);
    let d_wh = matmul(h_prev.transpose(), dhp.clone());
    let d_bh = dhp.sum_dim(0).reshape([three_h]);
    (Tensor::stack::<3>(dxp, 0).swap_dims(0, 1), d_wh, d_bh, d_h0)
}
