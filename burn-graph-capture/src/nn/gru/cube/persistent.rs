//! The persistent GRU recurrence (`nn::cube::persistent` launches it): `persistent/forward.cu`
//! and `persistent/backward.cu`, one cooperative launch each way. They write what the plain
//! recurrence writes (`gru/recurrence.rs`, the same layouts), so either backward reads
//! either forward's output.

use burn_backend::TensorMetadata;

use crate::nn::cube::empty;
use crate::nn::cube::persistent::{Prelude, Tensor, launch};
use crate::nn::strategy::PersistentGrid;

const FORWARD: &str = include_str!("persistent/forward.cu");
const BACKWARD: &str = include_str!("persistent/backward.cu");

/// The forward: hidden states `[T + 1, B, H]` and saved gates `[T, B, 4H]` from the input
/// projection `xp` `[B, T, 3H]`, `wh` `[H, 3H]`, `bh` `[3H]` and `h0` `[B, H]` (all fp32).
pub(super) fn forward(
    xp: &Tensor,
    wh: &Tensor,
    bh: &Tensor,
    h0: &Tensor,
    grid: PersistentGrid,
) -> (Tensor, Tensor) {
    let [batch, time, three_h] = xp.shape().dims();
    let hidden = three_h / 3;
    let states = empty(xp, [time + 1, batch, hidden]);
    let gates = empty(xp, [time, batch, 4 * hidden]);
    let prelude = Prelude::default()
        .grid(batch, time, hidden, grid)
        .strides("XP", xp)
        .strides("WH", wh)
        .strides("BH", bh)
        .strides("H0", h0)
        .strides("ST", &states)
        .strides("GA", &gates);
    launch(
        "cooperative::gru_persistent_forward",
        "gru_persistent_forward",
        FORWARD,
        prelude,
        grid,
        &[xp, wh, bh, h0, &states, &gates],
    );
    (states, gates)
}

/// The backward's recurrent part: the input projection's gradient `[T, B, 3H]`, the
/// hidden projection's `[T, B, 3H]` and the initial state's `[B, H]`, from the states'
/// gradient and what the forward saved.
pub(super) fn backward(
    d_states: &Tensor,
    states: &Tensor,
    gates: &Tensor,
    wh: &Tensor,
    grid: PersistentGrid,
) -> (Tensor, Tensor, Tensor) {
    let [steps, batch, hidden] = states.shape().dims();
    let time = steps - 1;
    let dxp = empty(states, [time, batch, 3 * hidden]);
    let dhp = empty(states, [time, batch, 3 * hidden]);
    let d_h0 = empty(states, [batch, hidden]);
    let prelude = Prelude::default()
        .grid(batch, time, hidden, grid)
        .strides("DS", d_states)
        .strides("ST", states)
        .strides("GA", gates)
        .strides("WH", wh)
        .strides("DX", &dxp)
        .strides("DP", &dhp)
        .strides("DH", &d_h0);
    launch(
        "cooperative::gru_persistent_backward",
        "gru_persistent_backward",
        BACKWARD,
        prelude,
        grid,
        &[d_states, states, gates, wh, &dxp, &dhp, &d_h0],
    );
    (dxp, dhp, d_h0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::cube::persistent::assert_reads_only_given_strides;

    #[test]
    fn the_kernels_read_only_strides_they_are_given() {
        let forward = [
            ("XP", 3),
            ("WH", 2),
            ("BH", 1),
            ("H0", 2),
            ("ST", 3),
            ("GA", 3),
        ];
        let backward = [
            ("DS", 3),
            ("ST", 3),
            ("GA", 3),
            ("WH", 2),
            ("DX", 3),
            ("DP", 3),
            ("DH", 2),
        ];
        assert_reads_only_given_strides(FORWARD, &forward);
        assert_reads_only_given_strides(BACKWARD, &backward);
    }
}
