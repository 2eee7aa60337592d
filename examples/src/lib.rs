//! The examples' models and data, shared with the tests and the benchmarks.
//!
//! - [`LstmRegressor`] mirrors the PyTorch anchor (`bench/anchors/torch_anchor.py`): an
//!   `nn::Lstm`, a `Linear(hidden, 1)` head on every time step, MSE loss. The `lstm`
//!   binary trains it on monthly sunspot numbers ([`sunspots`], [`forecast`]); the tests
//!   and benchmarks train it on synthetic sines ([`SineTask`]).
//! - [`CharLm`] is a character-level language model with int token inputs; the `charlm`
//!   binary trains it on Shakespeare's Sonnets ([`text`]).
//! - [`learner`] trains the sunspot model through burn-train's `Learner` with
//!   `GraphStrategy` (the `lstm-learner` binary).

pub mod data;
pub mod forecast;
pub mod learner;
pub mod model;
pub mod plot;
pub mod stacks;
pub mod sunspots;
pub mod text;
pub mod token;
pub mod train;

pub use data::{Batch, SineTask};
pub use model::{LstmRegressor, LstmRegressorConfig};
pub use token::{CharLm, CharLmConfig, TokenBatch, TokenTask};
