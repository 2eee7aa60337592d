//! The persistent LSTM recurrence (`nn::cube::persistent` launches it): `persistent/forward.cu`
//! and `persistent/backward.cu`, one cooperative launch each way. What the forward writes
//! is what the stepwise forward writes (states and activated gates, the same layouts), so
//! either backward reads either forward's output.

use burn_backend::TensorMetadata;

use crate::nn::cube::empty;
use crate::nn::cube::persistent::{Prelude, Tensor, launch};
use crate::nn::strategy::PersistentGrid;

const FORWARD: &str = include_str!("persistent/forward.cu");
const BACKWARD: &str = include_str!("persistent/backward.cu");

/// The forward: states `[2, T + 1, B, H]` and activated gates `[T, B, 4H]` from the input
/// projection `xp` `[B, T, 4H]`, `wh` `[H, 4H]` and the initial state (all fp32).
pub(super) fn forward(
    xp: &Tensor,
    wh: &Tensor,
    h0: &Tensor,
    c0: &Tensor,
    grid: PersistentGrid,
) -> (Tensor, Tensor) {
    let [batch, time, four_h] = xp.shape().dims();
    let hidden = four_h / 4;
    let states = empty(xp, [2, time + 1, batch, hidden]);
    let gates = empty(xp, [time, batch, four_h]);
    let prelude = Prelude::default()
        .grid(batch, time, hidden, grid)
        .strides("XP", xp)
        .strides("WH", wh)
        .strides("H0", h0)
        .strides("C0", c0)
        .strides("ST", &states)
        .strides("GA", &gates);
    launch(
        "cooperative::lstm_persistent_forward",
        "lstm_persistent_forward",
        FORWARD,
        prelude,
        grid,
        &[xp, wh, h0, c0, &states, &gates],
    );
    (states, gates)
}

/// The backward's recurrent part: the pre-activation gate gradients `dz` `[T, B, 4H]` and
/// the initial state's gradients `[B, H]` (hidden, cell), from the states' gradient and
/// what the forward saved.
pub(super) fn backward(
    d_states: &Tensor,
    states: &Tensor,
    gates: &Tensor,
    wh: &Tensor,
    grid: PersistentGrid,
) -> (Tensor, Tensor, Tensor) {
    let [_, steps, batch, hidden] = states.shape().dims();
    let time = steps - 1;
    let dz = empty(states, [time, batch, 4 * hidden]);
    let d_h0 = empty(states, [batch, hidden]);
    let d_c0 = empty(states, [batch, hidden]);
    let prelude = Prelude::default()
        .grid(batch, time, hidden, grid)
        .strides("DS", d_states)
        .strides("ST", states)
        .strides("GA", gates)
        .strides("WH", wh)
        .strides("DZ", &dz)
        .strides("DH", &d_h0)
        .strides("DC", &d_c0);
    launch(
        "cooperative::lstm_persistent_backward",
        "lstm_persistent_backward",
        BACKWARD,
        prelude,
        grid,
        &[d_states, states, gates, wh, &dz, &d_h0, &d_c0],
    );
    (dz, d_h0, d_c0)
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
            ("H0", 2),
            ("C0", 2),
            ("ST", 4),
            ("GA", 3),
        ];
        let backward = [
            ("DS", 4),
            ("ST", 4),
            ("GA", 3),
            ("WH", 2),
            ("DZ", 3),
            ("DH", 2),
            ("DC", 2),
        ];
        assert_reads_only_given_strides(FORWARD, &forward);
        assert_reads_only_given_strides(BACKWARD, &backward);
    }
}
