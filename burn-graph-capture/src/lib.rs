//! Run Burn training steps on NVIDIA GPUs as CUDA graphs.
//!
//! The entry point is the backend decorator [`GraphCapture`]: it forwards every op to
//! the inner backend and, while a [`CaptureSession`] is open, records the step's op
//! signature and the ops that would break a CUDA graph.

// The derive names this crate by path, including in this crate's own tests.
extern crate self as burn_graph_capture;

pub mod backend;
pub mod optim;
#[cfg(feature = "cuda")]
pub mod runtime;
pub mod step;
#[cfg(feature = "train")]
pub mod train;

pub use backend::{
    Allocated, AllocationId, AnyTensor, BreakerKind, BufferId, CaptureBreaker, CaptureSession,
    ExternalRead, GraphBackend, GraphCapture, GraphError, NoGraph, OpRecord, OpSignature,
    Recording, RuntimeFailure, TensorSig, TrainBackend,
};
#[cfg(feature = "cuda")]
pub use backend::{CudaCube, CudaFused};
pub use step::{
    FallbackReason, GraphTrainer, GraphTrainerConfig, InputKey, StepError, StepInput, StepMode,
    StepOutcome, StepOutput, TrainerReport,
};

/// `#[derive(StepInput)]` for batch structs; see [`StepInput`](trait@StepInput).
pub use burn_graph_capture_derive::StepInput;

/// Paths the derive's generated code uses; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::step::hash_key_value;
    pub use burn::tensor::backend::AutodiffBackend;
}
