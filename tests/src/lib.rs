//! The guide's code samples (`book/src`), compiled and run as this crate's doctests:
//! `cargo test -p integration-tests --doc`. A chapter without Rust samples is not listed.
//! mdBook renders the same files; lines starting with `# ` are hidden there too.

#[doc = include_str!("../../book/src/quickstart.md")]
pub mod quickstart {}

#[doc = include_str!("../../book/src/trainer.md")]
pub mod trainer {}

#[doc = include_str!("../../book/src/learner.md")]
pub mod learner {}

#[doc = include_str!("../../book/src/optimizers.md")]
pub mod optimizers {}

#[doc = include_str!("../../book/src/fused-lstm.md")]
pub mod fused_lstm {}
#[doc = include_str!("../../book/src/fused-gru.md")]
pub mod fused_gru {}

#[doc = include_str!("../../book/src/dropout.md")]
pub mod dropout {}

#[doc = include_str!("../../book/src/multi-gpu.md")]
pub mod multi_gpu {}

#[doc = include_str!("../../book/src/fallbacks.md")]
pub mod fallbacks {}

#[doc = include_str!("../../book/src/report.md")]
pub mod report {}

#[doc = include_str!("../../book/src/sharing.md")]
pub mod sharing {}

#[doc = include_str!("../../book/src/decorator.md")]
pub mod decorator {}

#[doc = include_str!("../../book/src/testing.md")]
pub mod testing {}
