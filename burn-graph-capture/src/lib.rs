//! Run Burn training steps on NVIDIA GPUs as CUDA graphs.
//!
//! [`GraphTrainer`] runs one optimizer step per call: eager warmup, one capture per
//! input shape, then replays, with a typed [`FallbackReason`] for every step that runs
//! eagerly. It trains through [`TrainBackend`], `Autodiff` over the backend decorator
//! [`GraphCapture`], which forwards every op to the inner backend and records what a
//! step does while a [`CaptureSession`] is open. The `train` feature adds a burn-train
//! strategy (`train::GraphStrategy`); the `cuda` feature adds the CUDA runtime and the
//! `CudaFused` and `CudaCube` stacks. The guide (`book/`) explains the rest.
//!
#![doc = include_str!("../../book/src/quickstart.md")]
#![deny(missing_docs)]

// The derive names this crate by path, including in this crate's own tests.
extern crate self as burn_graph_capture;

pub mod backend;
mod cause;
#[cfg(feature = "cuda")]
pub(crate) mod custom_op;
pub mod nn;
pub mod optim;
pub mod parallel;
pub mod rng;
#[cfg(feature = "cuda")]
pub mod runtime;
pub mod step;
#[cfg(feature = "train")]
pub mod train;

pub use backend::{
    Allocated, AllocationId, AnyTensor, BreakerKind, BufferId, CaptureBreaker, CaptureSession,
    Captured, EmulatedGraphs, ExternalRead, GraphBackend, GraphCapture, GraphError, LaterStandIn,
    NoGraph, OpRecord, OpSignature, Recording, RoutedMatmul, RunsAgain, RuntimeFailure, StandIn,
    TensorSig, TrainBackend, Untraced,
};
#[cfg(feature = "cuda")]
pub use backend::{CudaCube, CudaFused};
pub use cause::Cause;
pub use parallel::{
    Collectives, DataParallel, DataParallelConfig, DistError, JobSecret, RankLink, RankMember,
};
pub use rng::RandomDraws;
pub use step::{
    FallbackReason, GraphTrainer, GraphTrainerConfig, InputKey, StepChange, StepError, StepInput,
    StepMode, StepOutcome, StepOutput, TrainerReport,
};

/// `#[derive(StepInput)]` for batch structs; see [`StepInput`](trait@StepInput).
pub use burn_graph_capture_derive::StepInput;

/// Paths the derive's generated code uses; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::step::hash_key_value;
    pub use burn::tensor::backend::AutodiffBackend;
}
