//! The decorator's `float_random`: inside a trainer's step (`rng::scope`) it
//! draws from the trainer's generator on the device, where the inner backend can
//! ([`RandomDraws::draws_random`]); anywhere else it is the inner backend's own, whose
//! host-seeded draws break a capture (`BreakerKind::Rng`).

use burn::tensor::Distribution;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_backend::{FloatDType, Shape};

use super::GraphBackend;
use super::emulated::program::{self, StandInValue};
use super::session::{self, BreakerKind};
use super::trace;
use crate::rng::scope;

/// The open scope's generator state, if it serves a draw of `shape` and `dtype` on
/// `device` (else the draw is a capture breaker).
fn serving_state<B: GraphBackend>(
    shape: &Shape,
    device: &B::Device,
    dtype: FloatDType,
) -> Option<IntTensor<B>> {
    if !B::draws_random(shape, dtype) {
        return None;
    }
    scope::state::<IntTensor<B>>().filter(|state| B::int_device(state) == *device)
}

/// The capture breaker of a draw: none when the generator serves it.
pub(crate) fn breaker<B: GraphBackend>(
    shape: &Shape,
    device: &B::Device,
    dtype: FloatDType,
) -> Option<BreakerKind> {
    serving_state::<B>(shape, device, dtype)
        .is_none()
        .then_some(BreakerKind::Rng)
}

/// `float_random` of the decorator over `B`.
pub(crate) fn float_random<B: GraphBackend>(
    shape: Shape,
    distribution: Distribution,
    device: &B::Device,
    dtype: FloatDType,
) -> FloatTensor<B> {
    let Some(state) = serving_state::<B>(&shape, device, dtype) else {
        return B::float_random(shape, distribution, device, dtype);
    };
    if let Some(draw) = scope::next_draw(|| format!("float_random {distribution:?} {shape:?}")) {
        if session::is_recording() {
            // The draw reads the generator's state (the guard accounts for it) at a
            // step-constant index (the signature holds it fixed).
            session::record_op("random_state", None, |rec| {
                rec.tensor(&state);
                rec.attr(&draw);
            });
        }
        // What a trace matches: the state read, the draw's index and what it draws.
        let recorder = || {
            let mut rec = trace::recorder();
            rec.tensor(&state);
            rec.attr(&(draw, &shape, distribution, dtype));
            rec
        };
        if trace::active()
            && let Some(drawn) = trace::matched(
                "float_random",
                &recorder(),
                None,
                &[trace::input(&state)],
                |stand_ins| trace::hand_out(stand_ins, 0),
            )
        {
            return drawn;
        }
        let drawn = B::random(&state, draw, shape.clone(), distribution, dtype);
        if program::recording() {
            // An emulated graph draws again at replay, from the state as it is then.
            let read = program::input("float_random", &state);
            let slot = program::output("float_random", &drawn);
            let stand_in = StandInValue::of(&drawn).map(|s| vec![s]);
            let record = recorder().op_record("float_random");
            program::push_traced(
                "float_random",
                Box::new(move |env| {
                    let state: IntTensor<B> = env.take(&read)?;
                    env.bind(
                        &slot,
                        B::random(&state, draw, shape.clone(), distribution, dtype),
                    );
                    Ok(())
                }),
                record,
                true,
                stand_in,
            );
        }
        return drawn;
    }
    // Announced as served (no breaker) but out of draw indices (2^32 in one step): the
    // host-seeded draw must still break the capture.
    if session::is_recording() {
        session::record_op("float_random", Some(BreakerKind::Rng), |_| {});
    }
    B::float_random(shape, distribution, device, dtype)
}
