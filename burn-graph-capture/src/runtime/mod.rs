//! `CudaGraphRuntime`: this crate's CubeCL runtime for NVIDIA GPUs.
//!
//! cubecl-cuda 0.10 keeps its stream and memory pools private, so nothing outside it can
//! capture its launches; this runtime owns them instead (see DESIGN.md, layer 1).
