//! [`FusedLstm`]: an LSTM in the batched form of Appleyard et al. (2016), as cuDNN runs it.
//!
//! Burn's `nn::Lstm` runs eight small `Linear`s per time step, and autodiff's backward
//! mirrors them: hundreds of tiny kernels per step, and weight gradients as a sum of
//! per-step products. `FusedLstm` computes, per layer:
//! - one input GEMM for all time steps (`x @ W_x + b`), differentiated by autodiff;
//! - a recurrence op ([`LstmBackend::lstm_recurrence`]): per step, one recurrent GEMM
//!   with the four gates concatenated and the cell update;
//! - its own backward: per step, one GEMM for the hidden gradient and the gate
//!   gradients; the recurrent weight gradient once, over the whole sequence.
//!
//! On the CubeCL stacks (feature `cuda`) the recurrence runs either fused CubeCL kernels,
//! one per step each way beside the GEMMs, or, on this crate's runtime where the shape
//! allows, one persistent kernel per direction for the whole sequence
//! ([`Recurrence`](crate::nn::Recurrence));
//! on other backends it runs the same arithmetic in plain tensor ops, so the CPU tests
//! check the numerics.

mod backend;
mod convert;
#[cfg(feature = "cuda")]
mod cube;
mod decorated;
mod module;
mod recurrence;

pub use backend::{LstmBackend, LstmKernels, LstmSaved};
pub use convert::LstmConversionError;
pub use module::{FusedLstm, FusedLstmConfig, FusedLstmLayer};
