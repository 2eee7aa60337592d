//! Run Burn training steps on NVIDIA GPUs as CUDA graphs.

#[cfg(feature = "cuda")]
pub mod runtime;
