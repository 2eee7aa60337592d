//! The `GraphCapture<B>` backend decorator.
//!
//! It forwards every op to `B` unchanged (same primitives, same kernels) and, while a
//! [`CaptureSession`] is open on the calling thread, records the
//! op signature and the capture breakers of the step that runs.

mod base;
#[cfg(feature = "cuda")]
mod collective;
pub(crate) mod constant_pin;
mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cublas;
#[cfg(feature = "cuda")]
mod cuda;
mod decorated;
pub mod emulated;
mod error;
mod forward;
#[cfg(feature = "cuda")]
mod fused_matmul;
#[cfg(feature = "cuda")]
mod fused_stand_in;
#[cfg(feature = "cuda")]
mod fusion;
#[cfg(feature = "cuda")]
mod gemm_route;
mod graph_backend;
mod holder;
mod identity;
#[cfg(feature = "cuda")]
mod layout;
mod linear;
mod ops;
mod primitive;
mod random;
mod relabel;
mod routed_matmul;
pub mod session;
mod stand_in;
mod tensor_kind;
pub(crate) mod trace;

pub use base::{GraphCapture, TrainBackend};
#[cfg(feature = "cuda")]
pub use cuda::CudaCube;
pub use emulated::EmulatedGraphs;
pub use error::{CopyMismatch, GraphError, RuntimeFailure};
#[cfg(feature = "cuda")]
pub use fusion::{CudaFused, FusedGraph};
pub use graph_backend::{BufferId, Captured, GraphBackend, NoGraph};
pub use holder::Holder;
pub use identity::{Allocated, AllocationId};
pub use primitive::AnyTensor;
pub use routed_matmul::RoutedMatmul;
pub use session::{
    BreakerKind, CaptureBreaker, CaptureSession, ExternalRead, OpRecord, OpSignature, Recording,
    TensorSig,
};
pub use stand_in::{LaterStandIn, StandIn};
pub use tensor_kind::TensorKind;
pub use trace::{RunsAgain, Untraced};
