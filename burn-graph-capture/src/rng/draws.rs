//! [`RandomDraws`]: how a backend draws from a trainer's generator on its device.
//!
//! A trainer's steps draw random values (dropout masks, say) from a generator state
//! that is a device tensor, so that a captured step draws fresh values on every replay.
//! Backends that cannot draw on the device keep the defaults: their draws are their
//! own, host-seeded ones, and a step that draws breaks its capture (`BreakerKind::Rng`).

use burn::tensor::Distribution;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_backend::{Backend, FloatDType, Shape};

/// Draws from a generator state held in a device tensor (`rng::state`'s four words).
pub trait RandomDraws: Backend {
    /// Whether [`random`](Self::random) serves a draw of `shape` and `dtype`.
    fn draws_random(_shape: &Shape, _dtype: FloatDType) -> bool {
        false
    }

    /// Values of the `draw`-th draw of a step from `state` (Philox4x32-10 at the
    /// state's key and offset plus `draw`): the same values on every backend that draws.
    fn random(
        state: &IntTensor<Self>,
        _draw: u32,
        shape: Shape,
        distribution: Distribution,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        Self::float_random(shape, distribution, &Self::int_device(state), dtype)
    }

    /// The state after a step that made `draws` draws.
    fn advance_random(state: IntTensor<Self>, _draws: u32) -> IntTensor<Self> {
        state
    }
}
