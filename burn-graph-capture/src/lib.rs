//! Run Burn training steps on NVIDIA GPUs as CUDA graphs.
//!
//! The entry point is the backend decorator [`GraphCapture`]: it forwards every op to
//! the inner backend and, while a [`CaptureSession`] is open, records the step's op
//! signature and the ops that would break a CUDA graph.

pub mod backend;
pub mod optim;
#[cfg(feature = "cuda")]
pub mod runtime;
pub mod step;

pub use backend::{
    BreakerKind, BufferId, CaptureBreaker, CaptureSession, GraphBackend, GraphCapture, GraphError,
    NoGraph, OpRecord, OpSignature, Recording, RuntimeFailure, TensorSig,
};
#[cfg(feature = "cuda")]
pub use backend::{CudaCube, CudaFused};
pub use step::{
    FallbackReason, GraphTrainer, GraphTrainerConfig, StepError, StepInput, StepMode, StepOutcome,
    TrainBackend, TrainerReport,
};
