//! Why a graph operation failed: typed, serializable for reports, with sources.

use burn_backend::DType;
use serde::{Deserialize, Serialize};

use super::tensor_kind::TensorKind;
use crate::cause::Cause;

/// A graph operation that could not be done. The step then runs eagerly.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum GraphError {
    /// The backend cannot record or replay hardware graphs.
    #[error("this backend has no hardware graphs")]
    NoHardwareGraphs,
    /// The backend has no arena to pin tensors into.
    #[error("this backend has no arena for pinned tensors")]
    NoArena,
    /// Source and destination of a pinned copy are not the same kind of tensor.
    #[error("pinned copy mismatch: {0}")]
    CopyMismatch(#[from] CopyMismatch),
    /// A copy into a pinned buffer whose values would lie otherwise there than in the
    /// source (other strides). Kernels, and their rounding, follow strides
    /// (`backend::layout`), so a pin must lie as what is written into it: the trainer
    /// pins again as the values now lie, or runs the step eagerly.
    #[error("layout differs: shape {shape:?} lies with strides {given:?}, its pin with {pinned:?}")]
    LayoutDiffers {
        /// The tensor's shape.
        shape: Vec<usize>,
        /// The pinned buffer's strides, in elements.
        pinned: Vec<usize>,
        /// The source's strides, in elements.
        given: Vec<usize>,
    },
    /// The step panicked while it was recorded (CubeCL's autotuner does when a kernel
    /// meets its first tuning inside a window, where profiling is refused). The window
    /// was closed and nothing recorded ran; the step runs eagerly instead.
    #[error("the step panicked while it was recorded: {0}")]
    CapturePanicked(String),
    /// An emulated capture (`EmulatedGraphs`) ran an op it cannot replay: a Burn struct
    /// over the backend as argument or result, or a tensor without an allocation id.
    #[error("an emulated graph cannot replay `{op}`")]
    NotEmulated {
        /// The op.
        op: String,
    },
    /// A tensor meant for a constant's pin (`backend::constant_pin`) is of another kind
    /// of tensor than the pin.
    #[error("a constant's pin met a tensor of another kind")]
    PinKind,
    /// An emulated replay found a value its recording did not keep.
    #[error("emulated replay failed: {0}")]
    EmulatedReplay(String),
    /// The driver or runtime refused a capture, instantiate or replay call. Its cause is
    /// the runtime's own error (the CUDA runtime's `CaptureError`, reached with
    /// [`Cause::downcast_ref`]).
    #[error("graph runtime error ({kind:?}): {cause}")]
    Runtime {
        /// What failed, for code that reacts to it.
        kind: RuntimeFailure,
        /// The runtime's own error.
        #[source]
        cause: Cause,
    },
}

/// The kind of a runtime failure behind [`GraphError::Runtime`]: the runtime's typed
/// error, reduced to what a report can serialize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RuntimeFailure {
    /// A host synchronisation (read, sync, profiling) inside a window.
    HostSync,
    /// A window needed memory its pools could not serve without allocating.
    NeedsAllocation,
    /// A window ran out of pinned staging.
    StagingExhausted,
    /// A kernel was compiled for the first time inside a window.
    FirstCompile,
    /// An operation that cannot be recorded.
    Unsupported,
    /// A window was opened while one was open, or closed while none was.
    WindowState,
    /// Earlier asynchronous work had failed.
    StreamUnhealthy,
    /// A runtime server call failed.
    Server,
    /// A CUDA driver call failed.
    Driver,
    /// A cuBLAS call failed, or cuBLAS could not be loaded.
    Blas,
    /// An NCCL call failed, or NCCL could not be loaded.
    Collective,
    /// The graph is no longer known to the runtime.
    UnknownGraph,
    /// The device worker could not be reached.
    Unreachable,
}

/// How the two sides of a pinned copy differ.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum CopyMismatch {
    /// One side is a float tensor and the other an int tensor, say.
    #[error("a {dst} tensor and a {src} tensor")]
    Kind {
        /// The destination's kind.
        dst: TensorKind,
        /// The source's kind.
        src: TensorKind,
    },
    /// Shapes or dtypes differ.
    #[error("destination {dst_shape:?} {dst_dtype:?}, source {src_shape:?} {src_dtype:?}")]
    Shape {
        /// The destination's shape.
        dst_shape: Vec<usize>,
        /// The destination's dtype.
        dst_dtype: DType,
        /// The source's shape.
        src_shape: Vec<usize>,
        /// The source's dtype.
        src_dtype: DType,
    },
    /// A parameter of the model has no pin (the model gained one since pinning).
    #[error("parameter {0} was not pinned")]
    NotPinned(String),
    /// The optimizer holds more state tensors than were pinned.
    #[error("the optimizer state grew")]
    StateGrew,
    /// Pinning returned a tensor of another kind than it was given.
    #[error("pinning a {0} tensor returned another kind")]
    PinChangedKind(TensorKind),
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::cause::tests::{Inner, Outer};

    #[test]
    fn a_runtime_cause_keeps_the_error_and_its_chain() {
        let err = GraphError::Runtime {
            kind: RuntimeFailure::Driver,
            cause: Cause::new(Outer(Inner)),
        };
        assert_eq!(
            err.to_string(),
            "graph runtime error (Driver): outer failure"
        );
        let cause = err.source().expect("a source");
        assert_eq!(cause.to_string(), "outer failure");
        assert_eq!(
            cause.source().map(|s| s.to_string()).as_deref(),
            Some("inner failure")
        );
        let GraphError::Runtime { cause, .. } = &err else {
            unreachable!()
        };
        assert!(cause.downcast_ref::<Outer>().is_some());
    }

    #[test]
    fn a_reported_cause_keeps_its_text() {
        let err = GraphError::Runtime {
            kind: RuntimeFailure::HostSync,
            cause: Cause::new(Inner),
        };
        let json = serde_json::to_string(&err).unwrap();
        let back: GraphError = serde_json::from_str(&json).unwrap();
        assert_eq!(back, err);
        let GraphError::Runtime { cause, .. } = &back else {
            unreachable!()
        };
        assert!(
            cause.downcast_ref::<Inner>().is_none(),
            "only the text travels"
        );
        assert_eq!(cause.to_string(), "inner failure");
    }

    #[test]
    fn a_copy_mismatch_is_the_source_of_its_graph_error() {
        let err = GraphError::from(CopyMismatch::StateGrew);
        assert_eq!(
            err.to_string(),
            "pinned copy mismatch: the optimizer state grew"
        );
        assert_eq!(
            err.source().unwrap().to_string(),
            "the optimizer state grew"
        );
    }
}
