//! The LSTM used by the example, the tests and the benchmarks.
//!
//! It mirrors the PyTorch anchor (`shared/anchors/torch_anchor.py`): an `nn::Lstm` over
//! `[batch, time, 32]` inputs, a `Linear(hidden, 1)` head on every time step, MSE loss.

pub mod data;
pub mod model;
pub mod token;
pub mod train;

pub use data::{Batch, SineTask};
pub use model::{LstmRegressor, LstmRegressorConfig};
pub use token::{CharLm, CharLmConfig, TokenBatch, TokenTask};
