//! The backends the binaries train on: the CPU by default, an NVIDIA GPU with
//! `--features cuda`.

/// The inner backend of `TrainBackend`: Flex, or `CudaFused` (Burn's fusion over this
/// crate's CUDA runtime) with `--features cuda`.
#[cfg(not(feature = "cuda"))]
pub type Inner = burn::backend::Flex;
/// The inner backend of `TrainBackend`: Flex, or `CudaFused` (Burn's fusion over this
/// crate's CUDA runtime) with `--features cuda`.
#[cfg(feature = "cuda")]
pub type Inner = burn_graph_capture::CudaFused;

/// Stock Burn for `--stock`: burn-cuda on the GPU, Flex on the CPU, with autodiff.
#[cfg(not(feature = "cuda"))]
pub type Stock = burn::backend::Autodiff<burn::backend::Flex>;
/// Stock Burn for `--stock`: burn-cuda on the GPU, Flex on the CPU, with autodiff.
#[cfg(feature = "cuda")]
pub type Stock = burn::backend::Autodiff<burn::backend::Cuda>;
