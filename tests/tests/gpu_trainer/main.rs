//! `GraphTrainer` on the GPU: the acceptance tests of issue 5.
//!
//! - `correctness`: 200 replayed steps equal 200 eager steps of the same seed (losses and
//!   final parameters) for Adam, AdamW and SGD with momentum, with a learning rate that
//!   changes every step;
//! - `guards`: shared parameters, eager work between replays, a trainer dropped with
//!   replays in flight, a smaller last batch (small sizes: these also run under
//!   compute-sanitizer);
//! - `memory`: device memory in use is flat over 1,000 replays.
//!
//! Every test is generic over the inner backend stack and instantiated per stack, as
//! `<module>::<stack>::<test>` (e.g. `guards::cube::shared_parameter_runs_eagerly`).
//!
//! Every test is `#[ignore]`d: it needs an NVIDIA GPU and fails without one. Run on the
//! GPU machine through `scripts/gpu-check.sh`, one test at a time (`--test-threads=1`):
//! tests share the device, and some count its live graphs.
#![cfg(feature = "cuda")]

/// Instantiates generic tests for one backend stack: `stack_tests!(cube: CudaCube; a, b)`
/// makes the tests `cube::a` and `cube::b`, running `a::<CudaCube>()` and `b::<CudaCube>()`.
macro_rules! stack_tests {
    ($stack:ident: $G:ty; $($test:ident),+ $(,)?) => {
        mod $stack {
            $(
                #[test]
                #[ignore = "needs an NVIDIA GPU"]
                fn $test() {
                    super::$test::<$G>();
                }
            )+
        }
    };
}

mod common;
mod correctness;
mod guards;
mod memory;
