//! The fused cell kernels: one launch per time step forward, one backward, one thread
//! per `(batch, hidden unit)`. Every tensor is indexed through its strides, so views
//! (a step of the input projection, a pitched allocation) need no copy.
//!
//! The arithmetic is the plain recurrence's (`recurrence.rs`), step for step.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

#[cube]
fn sigmoid<F: Float>(x: F) -> F {
    F::new(1.0) / (F::new(1.0) + F::exp(F::new(0.0) - x))
}

/// Offset of `[kind, step, b, j]` in the states `[2, time + 1, batch, H]`.
#[cube]
fn state_at<F: Float>(states: &Tensor<F>, kind: usize, step: usize, b: usize, j: usize) -> usize {
    kind * states.stride(0) + step * states.stride(1) + b * states.stride(2) + j * states.stride(3)
}

/// Step `t` of the forward: with `z = h_{t-1} @ W_h` `[batch, 4H]`, the gates from
/// `z + xp[:, t]`, then `c_t` and `h_t` into `states[.., t + 1]` and the activated gates
/// into `gates[t]`. The first step reads the initial state from `h0`/`c0` and also
/// writes it into `states[.., 0]`.
#[cube(launch)]
pub(super) fn cell_forward<F: Float>(
    z: &Tensor<F>,
    xp: &Tensor<F>,
    h0: &Tensor<F>,
    c0: &Tensor<F>,
    states: &mut Tensor<F>,
    gates: &mut Tensor<F>,
    t: u32,
    #[comptime] first: bool,
    #[define(F)] _dtype: StorageType,
) {
    let batch = z.shape(0);
    let hidden = states.shape(3);
    if ABSOLUTE_POS >= batch * hidden {
        terminate!();
    }
    let b = ABSOLUTE_POS / hidden;
    let j = ABSOLUTE_POS % hidden;
    let t = t as usize;
    let z_row = b * z.stride(0);
    let x_row = b * xp.stride(0) + t * xp.stride(1);
    let zs = z.stride(1);
    let xs = xp.stride(2);
    let i = sigmoid::<F>(xp[x_row + j * xs] + z[z_row + j * zs]);
    let f = sigmoid::<F>(xp[x_row + (hidden + j) * xs] + z[z_row + (hidden + j) * zs]);
    let g = F::tanh(xp[x_row + (2 * hidden + j) * xs] + z[z_row + (2 * hidden + j) * zs]);
    let o = sigmoid::<F>(xp[x_row + (3 * hidden + j) * xs] + z[z_row + (3 * hidden + j) * zs]);
    let c_prev = if first {
        let c_init = c0[b * c0.stride(0) + j * c0.stride(1)];
        states[state_at::<F>(states, 0, 0, b, j)] = h0[b * h0.stride(0) + j * h0.stride(1)];
        states[state_at::<F>(states, 1, 0, b, j)] = c_init;
        c_init
    } else {
        states[state_at::<F>(states, 1, t, b, j)]
    };
    let c = f * c_prev + i * g;
    let h = o * F::tanh(c);
    states[state_at::<F>(states, 0, t + 1, b, j)] = h;
    states[state_at::<F>(states, 1, t + 1, b, j)] = c;
    let g_row = t * gates.stride(0) + b * gates.stride(1);
    let gs = gates.stride(2);
    gates[g_row + j * gs] = i;
    gates[g_row + (hidden + j) * gs] = f;
    gates[g_row + (2 * hidden + j) * gs] = g;
    gates[g_row + (3 * hidden + j) * gs] = o;
}

/// Step `t` of the backward: the pre-activation gate gradients `dz[t]` `[batch, 4H]`
/// from the states' gradient at `t + 1`, the hidden gradient that step `t + 1` sends
/// back (`dh_rec = dz[t + 1] @ W_h^T`) and the carried cell gradient `dc`, which is
/// overwritten with the one step `t - 1` receives. The last step (`last`) has neither
/// `dh_rec` nor `dc` to read.
#[cube(launch)]
pub(super) fn cell_backward<F: Float>(
    d_states: &Tensor<F>,
    states: &Tensor<F>,
    gates: &Tensor<F>,
    dh_rec: &Tensor<F>,
    dc: &mut Tensor<F>,
    dz: &mut Tensor<F>,
    t: u32,
    #[comptime] last: bool,
    #[define(F)] _dtype: StorageType,
) {
    let batch = dc.shape(0);
    let hidden = dc.shape(1);
    if ABSOLUTE_POS >= batch * hidden {
        terminate!();
    }
    let b = ABSOLUTE_POS / hidden;
    let j = ABSOLUTE_POS % hidden;
    let t = t as usize;
    let one = F::new(1.0);
    let g_row = t * gates.stride(0) + b * gates.stride(1);
    let gs = gates.stride(2);
    let i = gates[g_row + j * gs];
    let f = gates[g_row + (hidden + j) * gs];
    let g = gates[g_row + (2 * hidden + j) * gs];
    let o = gates[g_row + (3 * hidden + j) * gs];
    let dc_at = b * dc.stride(0) + j * dc.stride(1);
    let mut dh = d_states[state_at::<F>(d_states, 0, t + 1, b, j)];
    let mut dc_in = d_states[state_at::<F>(d_states, 1, t + 1, b, j)];
    if last {
    } else {
        dh += dh_rec[b * dh_rec.stride(0) + j * dh_rec.stride(1)];
        dc_in += dc[dc_at];
    }
    let tanh_c = F::tanh(states[state_at::<F>(states, 1, t + 1, b, j)]);
    let c_prev = states[state_at::<F>(states, 1, t, b, j)];
    let d_c = dc_in + dh * o * (one - tanh_c * tanh_c);
    let z_row = t * dz.stride(0) + b * dz.stride(1);
    let zs = dz.stride(2);
    dz[z_row + j * zs] = d_c * g * i * (one - i);
    dz[z_row + (hidden + j) * zs] = d_c * c_prev * f * (one - f);
    dz[z_row + (2 * hidden + j) * zs] = d_c * i * (one - g * g);
    dz[z_row + (3 * hidden + j) * zs] = dh * tanh_c * o * (one - o);
    dc[dc_at] = d_c * f;
}
