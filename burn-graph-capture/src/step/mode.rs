//! The mode a step ran in, and the typed reasons for running eagerly.

use std::borrow::Cow;
use std::fmt;

use burn::tensor::DType;
use serde::{Deserialize, Serialize};

use super::registry::TrainerId;
use crate::backend::trace::Difference;
use crate::backend::{CaptureBreaker, GraphError};

/// How one step ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepMode {
    /// The step was recorded into a new graph (and ran while recording).
    Captured,
    /// The step ran as a replay of a graph.
    Replayed,
    /// The step ran eagerly, for this reason.
    Eager(FallbackReason),
}

impl StepMode {
    /// The mode without its reason's details, for counting and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            StepMode::Captured => "Captured",
            StepMode::Replayed => "Replayed",
            StepMode::Eager(_) => "Eager",
        }
    }
}

/// Why a step ran eagerly. Every fallback has one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FallbackReason {
    /// One of the eager steps that precede a capture for this input shape.
    Warmup,
    /// The backend cannot record hardware graphs (CPU backends); every guard still ran.
    NoHardwareGraphs,
    /// The trainer's configuration turned capture off (`capture = false`).
    CaptureDisabled,
    /// burn-train's gradient accumulation (an update every n steps) runs its own eager
    /// loop (`train::GraphStrategy`).
    GradientAccumulation,
    /// Two warmup steps ran different ops (or the same ops with other shapes or host
    /// values); `first_difference` is the index of the first op that differed.
    NonStaticControlFlow {
        /// Index of the first differing op in the step's signature.
        first_difference: usize,
    },
    /// The step contains an op that cannot be replayed.
    CaptureBreaker(CaptureBreaker),
    /// The step read a tensor that is neither the trainer's (parameters, optimizer
    /// state), nor listed by the batch, nor the same constant in every warmup step:
    /// a replay would read it as the captured step saw it. List it in the batch.
    UnlistedInput {
        /// The backend method that read it, e.g. `float_embedding`.
        op: Cow<'static, str>,
        /// Its shape.
        shape: Vec<usize>,
        /// Its element type.
        dtype: DType,
    },
    /// The model was put back (`put_model`): this eager step checks that the shape's
    /// graph still records what the model now does, before replays resume.
    ModelReplaced,
    /// An eager step that checks the shape's graph against what the step closure does
    /// now (a graph not checked for `verify_every` trainer steps): a replay does not
    /// call the closure, so a value it reads that changed since the capture would
    /// otherwise go unnoticed. The graph replays again if the step did what it
    /// recorded.
    ReplayCheck,
    /// The shape's graph no longer records what the step does (found by a
    /// [`ReplayCheck`](Self::ReplayCheck) or after `put_model`): it was dropped, this
    /// step ran eagerly, and the shape warms up again.
    GraphStale {
        /// What the step did differently from the graph.
        change: StepChange,
    },
    /// A trainable parameter or optimizer-state buffer (the learning rate aside) is
    /// shared with another trainer.
    SharedWithTrainer(TrainerId),
    /// This input shape would need a graph beyond `max_graphs`.
    GraphCacheFull,
    /// The model or optimizer no longer sits on the pinned buffers (a model put back, a
    /// state loaded): graphs were dropped, and the next step captures again.
    PinnedBuffersChanged,
    /// A tensor the graph reads lies in its buffer with other strides than the graph
    /// recorded: a batch tensor laid out otherwise, or parameters that an eager step
    /// (the first after `put_model`, say) left laid out otherwise. Kernels, and their
    /// rounding, follow strides, so this step runs eagerly; pinned state is pinned
    /// again as it now lies, and its shapes warm up once more.
    LayoutChanged {
        /// The tensor's shape.
        shape: Vec<usize>,
        /// The strides the graph (or the pin) has.
        pinned: Vec<usize>,
        /// The strides the tensor has now.
        given: Vec<usize>,
    },
    /// Pinned buffers changed identity (or layout) more often than `max_recaptures`
    /// allows.
    RecaptureLimit,
    /// The backend refused to pin, capture or replay.
    Graph(GraphError),
    /// Data-parallel training: another rank runs this step eagerly, for `reason`, so
    /// every rank does (the ranks' collectives must all come from graphs, or all not).
    RankFellBack {
        /// The lowest rank that fell back.
        rank: usize,
        /// Its reason.
        reason: Box<FallbackReason>,
    },
    /// Data-parallel training: `rank` captures this shape while others would replay
    /// their graphs of it; every rank runs this step eagerly, the replaying ranks drop
    /// their graphs, and the next step captures on every rank.
    RankRecaptures {
        /// A rank on the other side (capturing, or replaying).
        rank: usize,
    },
}

/// What a step did differently from the graph it was checked against
/// ([`FallbackReason::GraphStale`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepChange {
    /// The step hit a capture breaker the graph did not.
    Breaker(CaptureBreaker),
    /// Op `index` is another op: `graph` recorded, `step` ran (a branch on host state).
    OtherOp {
        /// Index of the op in the step's signature.
        index: usize,
        /// The op the graph recorded there.
        graph: Cow<'static, str>,
        /// The op the step ran there.
        step: Cow<'static, str>,
    },
    /// Op `index` read tensors of other shapes or element types.
    InputShapes {
        /// Index of the op in the step's signature.
        index: usize,
        /// The op.
        op: Cow<'static, str>,
    },
    /// Op `index` read another value at argument `argument` than the graph's op did:
    /// another parameter, batch input or constant, or another op's output (a branch
    /// among tensors of one shape).
    OtherInput {
        /// Index of the op in the step's signature.
        index: usize,
        /// The op.
        op: Cow<'static, str>,
        /// Which of its tensor arguments.
        argument: usize,
    },
    /// Op `index` ran with other host values: a scalar, dims or options. A host value
    /// that changes between steps (a loss weight, an annealing factor, a flag) belongs
    /// in the batch: as a tensor (a 0-d or 1-element `Tensor`), or as a
    /// `#[step_input(key)]` field when it takes few values.
    HostValues {
        /// Index of the op in the step's signature.
        index: usize,
        /// The op.
        op: Cow<'static, str>,
    },
    /// The step ran another number of ops than the graph recorded.
    OpCount {
        /// Ops the graph recorded.
        graph: usize,
        /// Ops the step ran.
        step: usize,
    },
    /// Data-parallel training: the step of rank `rank` differed from its graph, so every
    /// rank ran the step eagerly (the ranks run the step's collectives alike).
    PeerDiffered {
        /// The first rank whose step differed.
        rank: usize,
    },
    /// A tensor the graph reads as a constant is no longer held outside the graph (it
    /// was replaced or dropped), so the step closure reads another one now: `op` read
    /// it. Found before a replay, which then does not run.
    ConstantDropped {
        /// The backend method that read it.
        op: Cow<'static, str>,
        /// Its shape.
        shape: Vec<usize>,
        /// Its element type.
        dtype: DType,
    },
    /// The step read a tensor from outside that the graph did not (a constant replaced
    /// since the capture, say), or no longer read one the graph did: `op` read it.
    Read {
        /// The backend method that read it.
        op: Cow<'static, str>,
        /// Its shape.
        shape: Vec<usize>,
        /// Its element type.
        dtype: DType,
    },
}

impl fmt::Display for StepChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepChange::Breaker(breaker) => write!(f, "capture breaker {breaker}"),
            StepChange::OtherOp { index, graph, step } => {
                write!(f, "op {index} is `{step}`, the graph recorded `{graph}`")
            }
            StepChange::InputShapes { index, op } => {
                write!(
                    f,
                    "op {index} (`{op}`) read tensors of other shapes or types"
                )
            }
            StepChange::OtherInput {
                index,
                op,
                argument,
            } => write!(
                f,
                "op {index} (`{op}`) read another tensor at argument {argument} than the graph's"
            ),
            StepChange::HostValues { index, op } => write!(
                f,
                "op {index} (`{op}`) ran with other host values; pass a host value that \
                 changes between steps in the batch, as a tensor or a `#[step_input(key)]` \
                 field (the guide's \"Fallback reasons\")"
            ),
            StepChange::OpCount { graph, step } => {
                write!(f, "the step ran {step} ops, the graph recorded {graph}")
            }
            StepChange::PeerDiffered { rank } => write!(
                f,
                "the step of rank {rank} differed from its graph: every rank ran it eagerly"
            ),
            StepChange::ConstantDropped { op, shape, dtype } => write!(
                f,
                "the {dtype:?} tensor of shape {shape:?} that `{op}` read as a constant is \
                 no longer held outside the graph (replaced or dropped)"
            ),
            StepChange::Read { op, shape, dtype } => write!(
                f,
                "`{op}` read a {dtype:?} tensor of shape {shape:?} other than the graph's \
                 (a tensor replaced since the capture)"
            ),
        }
    }
}

/// Where a trace stopped matching its graph, as a step change.
impl From<Difference> for StepChange {
    fn from(difference: Difference) -> Self {
        match difference {
            Difference::Breaker(breaker) => StepChange::Breaker(breaker),
            Difference::OtherOp { index, graph, step } => StepChange::OtherOp {
                index,
                graph: graph.into(),
                step: step.into(),
            },
            Difference::InputShapes { index, op } => StepChange::InputShapes {
                index,
                op: op.into(),
            },
            Difference::HostValues { index, op } => StepChange::HostValues {
                index,
                op: op.into(),
            },
            Difference::OtherInput {
                index,
                op,
                argument,
            } => StepChange::OtherInput {
                index,
                op: op.into(),
                argument,
            },
            Difference::OpCount { graph, step } => StepChange::OpCount { graph, step },
            Difference::Peer { rank } => StepChange::PeerDiffered { rank },
        }
    }
}

impl FallbackReason {
    /// The reason for a graph error: a layout difference is
    /// [`LayoutChanged`](Self::LayoutChanged), anything else [`Graph`](Self::Graph).
    pub(crate) fn from_graph_error(error: GraphError) -> Self {
        match error {
            GraphError::LayoutDiffers {
                shape,
                pinned,
                given,
            } => FallbackReason::LayoutChanged {
                shape,
                pinned,
                given,
            },
            other => FallbackReason::Graph(other),
        }
    }

    /// The reason without its details, for counting.
    pub fn kind(&self) -> &'static str {
        match self {
            FallbackReason::Warmup => "Warmup",
            FallbackReason::NoHardwareGraphs => "NoHardwareGraphs",
            FallbackReason::CaptureDisabled => "CaptureDisabled",
            FallbackReason::GradientAccumulation => "GradientAccumulation",
            FallbackReason::NonStaticControlFlow { .. } => "NonStaticControlFlow",
            FallbackReason::CaptureBreaker(_) => "CaptureBreaker",
            FallbackReason::UnlistedInput { .. } => "UnlistedInput",
            FallbackReason::ModelReplaced => "ModelReplaced",
            FallbackReason::ReplayCheck => "ReplayCheck",
            FallbackReason::GraphStale { .. } => "GraphStale",
            FallbackReason::SharedWithTrainer(_) => "SharedWithTrainer",
            FallbackReason::GraphCacheFull => "GraphCacheFull",
            FallbackReason::PinnedBuffersChanged => "PinnedBuffersChanged",
            FallbackReason::LayoutChanged { .. } => "LayoutChanged",
            FallbackReason::RecaptureLimit => "RecaptureLimit",
            FallbackReason::Graph(_) => "Graph",
            FallbackReason::RankFellBack { .. } => "RankFellBack",
            FallbackReason::RankRecaptures { .. } => "RankRecaptures",
        }
    }
}

/// A reason is an error where a data-parallel rank fails its group with it. Its words
/// already say the graph error's own, so its source is what lies under that.
impl std::error::Error for FallbackReason {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FallbackReason::Graph(error) => std::error::Error::source(error),
            _ => None,
        }
    }
}

impl fmt::Display for FallbackReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FallbackReason::NonStaticControlFlow { first_difference } => write!(
                f,
                "non-static control flow (first difference at op {first_difference})"
            ),
            FallbackReason::CaptureBreaker(breaker) => write!(f, "capture breaker: {breaker}"),
            FallbackReason::UnlistedInput { op, shape, dtype } => write!(
                f,
                "unlisted input: `{op}` read a {dtype:?} tensor of shape {shape:?} that the \
                 batch does not list and that is not the same tensor every step"
            ),
            FallbackReason::GraphStale { change } => {
                write!(f, "the graph no longer records the step: {change}")
            }
            FallbackReason::SharedWithTrainer(id) => write!(f, "shared with trainer {}", id.0),
            FallbackReason::LayoutChanged {
                shape,
                pinned,
                given,
            } => write!(
                f,
                "layout changed: a tensor of shape {shape:?} lies with strides {given:?}, \
                 the graph's with {pinned:?}"
            ),
            FallbackReason::Graph(error) => write!(f, "graph error: {error}"),
            FallbackReason::RankFellBack { rank, reason } => {
                write!(f, "rank {rank} runs this step eagerly ({reason})")
            }
            FallbackReason::RankRecaptures { rank } => write!(
                f,
                "ranks disagree on this shape's graph (rank {rank}): all capture it again"
            ),
            other => f.write_str(other.kind()),
        }
    }
}
