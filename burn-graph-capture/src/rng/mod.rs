//! Random numbers drawn on the device, so that random ops (dropout) stay inside graphs.
//!
//! A counter-based generator (Philox4x32-10) makes each value a pure function of a key,
//! an offset and the element's index. A trainer keeps its generator's key and offset in
//! a small device tensor (`state`), pinned next to its parameters; each draw of a step
//! reads it on the device, and the step advances its offset on the device too. A
//! replayed graph therefore draws fresh numbers every time, and an eager step draws
//! exactly what the same step graphed would.

#[cfg(feature = "cuda")]
pub(crate) mod cube;
pub mod draw;
mod draws;
#[cfg(feature = "cuda")]
pub(crate) mod fusion;
pub mod philox;
pub(crate) mod scope;
pub mod seed;
pub mod state;

pub use draws::RandomDraws;
