//! What an inner backend can do for graph capture.
//!
//! The step API talks to hardware graphs only through this trait, so the same trainer
//! code runs on CUDA (real graphs) and on CPU backends (honest "no graphs": every step
//! eager, every guard still exercised).

use burn_backend::{Backend, StreamId};
use serde::{Deserialize, Serialize};

use super::error::GraphError;
use super::holder::Holder;
use super::identity::Allocated;
use super::primitive::AnyTensor;
use super::routed_matmul::RoutedMatmul;
use super::stand_in::StandIn;
use super::trace::TraceRecording;
use crate::rng::RandomDraws;

/// Identity of a tensor's storage, stable while that storage lives.
///
/// Views of one buffer share an identity. Once a buffer is freed its identity may be
/// reused, so the step API keeps pinned buffers alive while it compares identities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferId(pub u64);

/// Capture, replay, pins and copies, as an inner backend provides them.
///
/// Every tensor primitive names its allocation ([`Allocated`]), so that a capture
/// session can tell which buffers a step reads without producing them. The decorator
/// runs every op of the inner backend, and two of them another way: matmuls as the
/// backend routes them ([`RoutedMatmul`]) and random draws inside a trainer's step from
/// its device generator ([`RandomDraws`]); both layer under this trait. Collectives
/// (`parallel::Collectives`) and the recurrences' kernels (`nn::LstmKernels`,
/// `nn::GruKernels`) are bound only where they are used.
pub trait GraphBackend:
    Backend<
        FloatTensorPrimitive: Allocated + StandIn,
        IntTensorPrimitive: Allocated + StandIn,
        BoolTensorPrimitive: Allocated + StandIn,
        QuantizedTensorPrimitive: Allocated + StandIn,
    > + RoutedMatmul
    + RandomDraws
{
    /// An instantiated, replayable graph. Dropping it releases the graph and everything
    /// retained for it, once the device has finished with it.
    type Graph: Send + 'static;

    /// Whether this device can capture and replay hardware graphs.
    fn supports_hardware_graphs(device: &Self::Device) -> bool;

    /// Records `step` into a graph: opens a window on `device`, runs `step`, closes the
    /// window (on every path, a panic in `step` included). Nothing a window records runs
    /// until its graph is launched.
    fn capture<R>(device: &Self::Device, step: impl FnOnce() -> R) -> Captured<R, Self::Graph>;

    /// Runs an eager step the way [`capture`](Self::capture) will run the step it
    /// records, minus the window, so that the last warmup step compiles and tunes
    /// exactly what the capture will launch (a backend that records under a stream of
    /// its own rehearses under a stream of its own too).
    fn rehearse<R>(_device: &Self::Device, step: impl FnOnce() -> R) -> R {
        step()
    }

    /// Runs an eager step with its kernels apart from the work queued before and after
    /// it, as [`capture`](Self::capture) and [`rehearse`](Self::rehearse) run theirs.
    /// A backend that fuses across op boundaries (`Fusion`) would otherwise fuse the
    /// step with whatever the caller queued around it (burn-train's metrics, the next
    /// batch), and a fused multiply-add rounds unlike a multiply and an add apart: eager
    /// steps would then round unlike the graphed steps they stand for.
    fn isolate<R>(_device: &Self::Device, step: impl FnOnce() -> R) -> R {
        step()
    }

    /// Launches the graph once.
    fn replay(graph: &Self::Graph) -> Result<(), GraphError>;

    /// Keeps `device`'s queue ready to take a launch at once while the host works
    /// without queueing anything (a trace, which launches nothing for a whole step): a
    /// backend whose queue goes to sleep when idle would make the launch after the
    /// trace wait for it to wake. The default does nothing.
    fn keep_ready(_device: &Self::Device) {}

    /// What a trace of a later step matches op by op before the graph replays
    /// (`backend::trace`); `None` where the graph's outputs have no stand-ins, whose
    /// replays then run untraced (the default).
    fn trace_recording(_graph: &Self::Graph) -> Option<TraceRecording> {
        None
    }

    /// Whether a trace that stops matching runs the step again eagerly from its start
    /// (with a clone of the step closure taken before the trace) instead of computing
    /// the ops it matched and going on: where computing them apart from the ops around
    /// them would change what the step computes (fusion groups ops into kernels by
    /// what it is queued, so the refilled prefix would round otherwise than the eager
    /// step does).
    fn traces_run_again() -> bool {
        false
    }

    /// `tensor`, made inside a [`capture`](Self::capture)'s step, as a tensor of the
    /// caller's stream `caller` (the same buffer): what a captured step hands back.
    /// Fusion tracks the stream each tensor was made on, and a capture stream runs
    /// nothing after its window, so a tensor of it that the caller's stream used would
    /// stay tracked as shared, its buffer (and the graph's pool) never freed. The
    /// default, for backends without streams of their own, returns `tensor`.
    fn hand_over(tensor: AnyTensor<Self>, _caller: StreamId) -> AnyTensor<Self> {
        tensor
    }

    /// Moves a tensor's values into the arena, where its address stays fixed.
    fn pin(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError>;

    /// [`pin`](Self::pin) for a batch tensor, the static input of a graph: a backend
    /// whose kernels follow strides keeps the layout of views that `pin` would pack (a
    /// column of a wider upload, an expanded mask), so that the graph reads its input as
    /// eager kernels read the batch. The default pins.
    fn pin_input(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        Self::pin(tensor)
    }

    /// Copies `src`'s values into the storage of `dst`, which must be pinned and of the
    /// same kind, shape, dtype and layout ([`GraphError::LayoutDiffers`] otherwise).
    /// Inside a capture this is recorded as a device copy.
    fn copy_into(dst: &AnyTensor<Self>, src: &AnyTensor<Self>) -> Result<(), GraphError>;

    /// The tensor's values in a buffer of their own, laid out as they lie: what the
    /// trainer lends out, so that code on the copy launches the kernels code on the
    /// original would. The default copies through an identity op, whose output layout
    /// the backend picks (backends whose kernels do not follow strides).
    fn duplicate(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
        Ok(tensor.fresh_copy())
    }

    /// Whether the captures of this backend read the step's constants through pins
    /// (`backend::constant_pin`) and its replays are traced, so that a constant is known
    /// by its place in the step rather than by its allocation: a step that reads another
    /// tensor there (a target network after a soft update) copies it into the pin. The
    /// default reads every constant as it is, and a replaced one is a difference.
    fn pins_constants() -> bool {
        false
    }

    /// Whether `tensor` lies as `pin` does (kind, shape, dtype, strides), so that kernels
    /// read either alike: a constant the capture reads through a pin, and a tensor a trace
    /// copies into it, must. The default: never.
    fn lies_alike(_pin: &AnyTensor<Self>, _tensor: &AnyTensor<Self>) -> bool {
        false
    }

    /// The address of a tensor's storage, where the backend exposes one.
    fn buffer_id(tensor: &AnyTensor<Self>) -> Option<BufferId>;

    /// A handle on `tensor`'s allocation that tells whether anything else still holds
    /// it ([`Holder`]): what a replay checks of each constant its graph reads. `None`
    /// where the backend cannot tell (its graphs are then checked only every
    /// `verify_every` trainer steps); the default.
    fn holder(_tensor: &AnyTensor<Self>) -> Option<Holder> {
        None
    }
}

/// What [`GraphBackend::capture`] came to.
#[derive(Debug)]
pub enum Captured<R, G> {
    /// No window could be opened: the step did not run.
    Refused(GraphError),
    /// The step ran and was recorded: its output and the graph.
    Recorded {
        /// What the step returned.
        output: R,
        /// The graph, not yet launched.
        graph: G,
    },
    /// The step ran but its window failed: its output (nothing recorded ran, so the
    /// step's effects never happened) and why.
    Broken {
        /// What the step returned.
        output: R,
        /// Why the window failed.
        error: GraphError,
    },
}

impl<R, G> Captured<R, G> {
    /// The output and the graph, or why there is no graph (a broken window's output is
    /// dropped: nothing it recorded ran).
    pub fn recorded(self) -> Result<(R, G), GraphError> {
        match self {
            Captured::Recorded { output, graph } => Ok((output, graph)),
            Captured::Refused(error) | Captured::Broken { error, .. } => Err(error),
        }
    }

    /// The same outcome with the graph turned into another type.
    pub fn map_graph<H>(self, f: impl FnOnce(G) -> H) -> Captured<R, H> {
        match self {
            Captured::Refused(error) => Captured::Refused(error),
            Captured::Recorded { output, graph } => Captured::Recorded {
                output,
                graph: f(graph),
            },
            Captured::Broken { output, error } => Captured::Broken { output, error },
        }
    }
}

/// A graph that cannot exist: the type of graphs on backends without them.
#[derive(Debug)]
pub enum NoGraph {}
