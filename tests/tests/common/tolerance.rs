//! How close a fused module's results must be to Burn's: shared by the parity modules
//! (`fused_lstm_parity.rs`, `fused_gru_parity.rs`), each of which includes it.

/// How close the fused module's results must be to Burn's module's.
#[derive(Clone, Copy, Debug)]
pub enum Tolerance {
    /// Each value within `relative` of its own magnitude (floor `relative / 10`).
    Each(f32),
    /// Each value within `relative` of the largest magnitude in its tensor: a gradient
    /// summed over many rows and steps can cancel to a small value whose rounding is
    /// relative to the terms, not to the sum.
    OfLargest(f32),
}

/// `a` against `b` under `tolerance`; a failure names `what` and the index.
pub fn assert_close_within(what: &str, a: &[f32], b: &[f32], tolerance: Tolerance) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let largest = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (index, (x, y)) in a.iter().zip(b).enumerate() {
        let allowed = match tolerance {
            Tolerance::Each(relative) => relative * x.abs().max(y.abs()) + relative / 10.0,
            Tolerance::OfLargest(relative) => relative * largest.max(0.1),
        };
        assert!(
            (x - y).abs() <= allowed,
            "{what}[{index}]: {x} vs {y} ({tolerance:?})"
        );
    }
}
