//! [`FusedGru`]: a GRU in the batched form `FusedLstm` uses, with Burn's formulation.
//!
//! Burn's `nn::Gru` (with `reset_after`, its default) computes per step
//! `z = σ(x W_xz + b_xz + h W_hz + b_hz)`, `r = σ(x W_xr + b_xr + h W_hr + b_hr)`,
//! `n = tanh(x W_xn + b_xn + r ⊙ (h W_hn + b_hn))` and `h' = (1 - z) ⊙ n + z ⊙ h`: the
//! reset gate multiplies the hidden projection *with* its bias. `FusedGru` computes the
//! same, per layer:
//! - one input GEMM for all time steps (`x @ W_x + b_x`, gates packed `[z, r, n]`),
//!   differentiated by autodiff;
//! - a recurrence op ([`GruBackend::gru_recurrence`]): per step one recurrent GEMM with
//!   the three gates concatenated (`h @ W_h + b_h`, the bias inside, for the reset gate's
//!   sake) and the cell update;
//! - its own backward: per step one GEMM for the hidden gradient; the recurrent weight
//!   and bias gradients once, over the whole sequence.
//!
//! On this crate's CUDA runtime (feature `cuda`), where the shape allows, the recurrence
//! runs one persistent kernel per direction for the whole sequence (as `FusedLstm`'s does,
//! chosen by [`Recurrence`](crate::nn::Recurrence)); elsewhere the same arithmetic runs in
//! plain tensor ops, so the CPU tests check the numerics. `nn::Gru`'s
//! `reset_after = false`, `clip` and other activations are refused at conversion
//! ([`GruConversionError`]).

mod backend;
mod convert;
#[cfg(feature = "cuda")]
mod cube;
mod decorated;
mod module;
mod recurrence;

pub use backend::{GruBackend, GruKernels, GruSaved};
pub use convert::GruConversionError;
pub use module::{FusedGru, FusedGruConfig, FusedGruLayer};
