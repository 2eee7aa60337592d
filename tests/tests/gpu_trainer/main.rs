//! `GraphTrainer` on the GPU: the acceptance tests of issue 5.
//!
//! - `correctness`: 200 replayed steps equal 200 eager steps of the same seed (losses and
//!   final parameters) for Adam, AdamW and SGD with momentum, with a learning rate that
//!   changes every step;
//! - `guards`: shared parameters, eager work between replays, a trainer dropped with
//!   replays in flight, a smaller last batch (small sizes: these also run under
//!   compute-sanitizer);
//! - `memory`: device memory in use is flat over 1,000 replays, and over trainers that
//!   capture and are dropped;
//! - `soak`: issue 14's soak, 10,000 replays of the reference step: memory and RSS flat,
//!   every 100th replay equal to an eager step from the same state;
//! - `inputs`: issue 11's acceptance: token inputs, unlisted inputs, constants,
//!   snapshots, BatchNorm and tied weights;
//! - `layouts`: a model reloaded, put back or laid out otherwise trains as plain code on
//!   it does, and the trainer pins again where its layout moved;
//! - `faults` (feature `fault-injection`): issue 14's injected failures, one per stage of
//!   a graph's life;
//! - `fused_lstm`: issue 12's `FusedLstm` against `nn::Lstm`, and its replays against
//!   eager training;
//! - `fused_gru`: issue 28's `FusedGru` against `nn::Gru`, and its replays against eager
//!   training;
//! - `matmul`: issue 12's cuBLAS matmuls give the fp32 product in every layout;
//! - `data_parallel`: issue 16 on one GPU: NCCL collectives (one rank) eager, recorded
//!   and through Burn's path, a one-rank trainer graphed against capture off and a plain
//!   trainer, aborts and leaks, two ranks on one GPU refused;
//! - `two_gpus`: issue 16's acceptance on two GPUs (two ranks against one GPU on the
//!   combined batch, a killed rank process); these fail at once on fewer GPUs;
//! - `stale`: issue 27: a target network, a constant and a host weight that change
//!   after the capture, and structure changes through `put_model` (unfreezing, a head
//!   re-initialised, an embedding grown);
//! - `traced`: every replay on `CudaCube` traced: a host weight, a host coin and a
//!   branch between constants of one shape, each equal to plain code bit for bit, and
//!   diverging untraced;
//! - `dropout`: issue 15's device generator: its draws against the host's, an LSTM with
//!   dropout graphed (fresh masks every replay, equal to eager training).
//!
//! Every test is generic over the inner backend stack and instantiated per stack, as
//! `<module>::<stack>::<test>` (e.g. `guards::cube::shared_parameters_part_after_the_first_update`).
//!
//! Every test is `#[ignore]`d: it needs an NVIDIA GPU and fails without one. Run on the
//! GPU machine through `xtask gpu run`, one test at a time (`--test-threads=1`):
//! tests share the device, and some count its live graphs.
#![cfg(feature = "cuda")]

/// Instantiates generic tests once per backend stack: `stack_tests!(a, b)` makes
/// `fused::a` and `fused::b` running `a::<CudaFused>()` and `b::<CudaFused>()` (the issue's
/// stack, Fusion over CubeCL on this runtime), and `cube::a`, `cube::b` on `CudaCube`.
macro_rules! stack_tests {
    ($($test:ident),+ $(,)?) => {
        stack_tests!(@stack fused: burn_graph_capture::CudaFused; $($test),+);
        stack_tests!(@stack cube: burn_graph_capture::CudaCube; $($test),+);
    };
    (@stack $stack:ident: $G:ty; $($test:ident),+) => {
        mod $stack {
            $(
                #[test]
                #[ignore = "needs an NVIDIA GPU"]
                fn $test() {
                    crate::common::trace_from_env();
                    super::$test::<$G>();
                }
            )+
        }
    };
}

mod common;
mod correctness;
mod data_parallel;
mod dropout;
#[cfg(feature = "fault-injection")]
mod faults;
mod fused_gru;
mod fused_lstm;
#[path = "../common/fused_gru_parity.rs"]
mod gru_parity;
mod guards;
mod inputs;
mod layouts;
mod matmul;
mod memory;
#[path = "../common/models.rs"]
mod models;
#[path = "../common/fused_lstm_parity.rs"]
mod parity;
mod soak;
mod stale;
#[path = "../common/tolerance.rs"]
mod tolerance;
mod traced;
mod two_gpus;
