//! A trainer's graphs and the pinned buffers they read and write (backends with
//! hardware graphs).
//!
//! Capture, in order: pin parameters and optimizer state (once), pin a copy of the
//! batch as the graph's static input, open the window, run the step on the static input,
//! copy the new values into the pinned buffers (recorded too), close the window, check
//! that the recorded step did what warmup verified (breakers, signature, reads), then
//! launch the graph once: nothing recorded in a window runs until it is launched.
//! Replay: check that the model still sits on the pinned buffers, copy the batch into
//! the static input, launch. Every failure leaves the pre-step values in the pinned
//! buffers, so the step can run eagerly instead, with the reason.

use std::any::Any;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use burn_backend::StreamId;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;

use super::cache::{GraphCache, Observation, Plan, Recorded as HasObservation};
use super::config::GraphTrainerConfig;
use super::constant_pins::pins_for;
use super::error::StepError;
use super::guard::Accounted;
use super::input::{InputKey, StepInput};
use super::learner::{Learner, StepContext};
use super::mode::{FallbackReason, StepChange};
use super::output::{StepOutput, map_tensors, owned_copy};
use super::parallel::{CaptureOutcome, Rank};
use super::pinning::{Pinned, Pins, copy_float};
use crate::backend::Captured as Window;
use crate::backend::constant_pin::{ConstantPin, PinSlot, Swapping};
use crate::backend::session::Kept;
use crate::backend::trace::{Candidate, Untraced};
use crate::backend::{
    Allocated, AllocationId, AnyTensor, CaptureSession, ExternalRead, GraphBackend, GraphCapture,
    GraphError, Holder, TensorKind, TrainBackend,
};
use crate::cause::Cause;
use crate::optim::CapturableOptimizer;

/// A graph with the static buffers it reads and writes; `T` is the step's output item.
pub(crate) struct CapturedStep<G: GraphBackend, T> {
    graph: G::Graph,
    /// Pinned copies of the batch tensors, in `StepInput::collect_tensors` order.
    inputs: Vec<AnyTensor<G>>,
    /// The step's output item as the graph writes it; overwritten by every replay.
    outputs: T,
    /// What the recorded step did.
    observation: Observation,
    /// The constants it reads, each with a holder telling whether it is still held
    /// outside the graph (backends that can tell; `GraphBackend::holder`); a traced
    /// graph's pinned constants have none.
    constants: Vec<(ExternalRead, Holder)>,
    /// The pins it reads constants through: each with the tensor it holds where the
    /// graph is traced (traces fill them), else the pins alone, which keep the values of
    /// the constants the capture read.
    pins: ConstantPins,
}

/// The pins a graph reads its constants through.
enum ConstantPins {
    /// Filled by the traces of its replays.
    Traced(Vec<Arc<ConstantPin>>),
    /// Kept as the capture filled them: the graph's replays are not traced.
    Fixed(
        #[allow(dead_code, reason = "kept for the graph, which reads them")] Vec<Box<dyn PinSlot>>,
    ),
}

impl<G: GraphBackend, T> CapturedStep<G, T> {
    /// A constant the graph reads that nothing outside it holds any more: the step
    /// closure would read another tensor now.
    fn dropped_constant(&self) -> Option<&ExternalRead> {
        self.constants
            .iter()
            .find(|(_, holder)| !holder.held_elsewhere())
            .map(|(read, _)| read)
    }
}

/// Holders of the constants `reads` (the recording's unaccounted reads), each tensor
/// found by `tensor_of` (`None`: no holder).
fn holders<G: GraphBackend>(
    reads: &[ExternalRead],
    tensor_of: impl Fn(&ExternalRead) -> Option<AnyTensor<G>>,
) -> Vec<(ExternalRead, Holder)> {
    reads
        .iter()
        .filter_map(|read| Some((read.clone(), G::holder(&tensor_of(read)?)?)))
        .collect()
}

/// The tensor of `read` among those a keeping session kept.
fn kept_tensor<G: GraphBackend>(read: &ExternalRead, kept: &Kept) -> Option<AnyTensor<G>> {
    as_tensor(read, kept.get_any(read.allocation.as_ref()?)?)
}

/// A type-erased primitive, as the kind of tensor `read` says it is.
fn as_tensor<G: GraphBackend>(read: &ExternalRead, value: &dyn Any) -> Option<AnyTensor<G>> {
    AnyTensor::downcast(TensorKind::of_dtype(read.tensor.dtype), value)
}

impl<G: GraphBackend, T> HasObservation for CapturedStep<G, T> {
    fn observation(&self) -> &Observation {
        &self.observation
    }
}

/// A recording: a graph that did what warmup verified, or one that did not (`reason`),
/// which may run once as its own step but stands for no other.
pub(crate) enum Recorded<G: GraphBackend, T> {
    Graph(CapturedStep<G, T>),
    Differs(CapturedStep<G, T>, FallbackReason),
}

/// A capture's step: the new graph's first launch, or the one launch of a recording
/// unlike warmup (the step's mode is then eager, for `reason`).
pub(crate) enum Captured<T> {
    Graph(T),
    Once(T, FallbackReason),
}

/// Why a graph step did not happen: the step runs eagerly instead, and the scope says
/// what stays eager after it; or the step itself is refused.
pub(crate) enum Fallback {
    /// The step runs eagerly for `reason`, and so does what `scope` covers.
    Eager {
        scope: FallbackScope,
        reason: FallbackReason,
    },
    /// The step itself was refused (the trainer returns the error).
    Refused(StepError),
}

/// What a fallback leaves eager besides its own step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FallbackScope {
    /// Nothing: only this step runs eagerly (pinned buffers changed and the graphs were
    /// dropped, a batch tensor laid out unlike the graph's input).
    Step,
    /// This shape stays eager.
    Shape,
    /// Every shape stays eager.
    Trainer,
}

impl Fallback {
    /// Only this step runs eagerly.
    pub(crate) fn step(reason: FallbackReason) -> Self {
        Self::Eager {
            scope: FallbackScope::Step,
            reason,
        }
    }

    /// This shape stays eager.
    pub(crate) fn shape(reason: FallbackReason) -> Self {
        Self::Eager {
            scope: FallbackScope::Shape,
            reason,
        }
    }

    /// Every shape stays eager.
    pub(crate) fn trainer(reason: FallbackReason) -> Self {
        Self::Eager {
            scope: FallbackScope::Trainer,
            reason,
        }
    }
}

/// What graph work cost, for the report.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GraphStats {
    /// Wall time spent capturing, in milliseconds.
    pub(crate) capture_ms: f64,
    /// Times pinned buffers changed (identity or layout) and graphs were dropped.
    pub(crate) recaptures: usize,
    /// Bytes pinned in the arena.
    pub(crate) pinned_bytes: u64,
    /// Graphs dropped to make room for another shape's.
    pub(crate) evictions: usize,
    /// Times a shape made eager warmed up again.
    pub(crate) rewarms: usize,
}

/// The graphs of one trainer, per input key, and the pinned buffers they use; `T` is
/// the step's output item.
pub(crate) struct Graphs<G: GraphBackend, T> {
    cache: GraphCache<CapturedStep<G, T>>,
    /// The constants the rehearsal of each shape read (its last warmup step), in the
    /// order it first read them: what its capture's constant pins are made from.
    rehearsed: HashMap<InputKey, Vec<AnyTensor<G>>>,
    /// Parameters and optimizer state at fixed addresses, once a graph needs them.
    pins: Pins<G>,
    /// This step found the pins' layout stale: once the step is accounted for
    /// ([`step_done`](Self::step_done)), every shape goes back to its last warmup step.
    /// Apart from `pins`: it outlives the pins it was about, and survives into the next
    /// step when this one returns an error, which may pin before it is taken.
    rewarm: bool,
    max_recaptures: usize,
    stats: GraphStats,
}

impl<G: GraphBackend, T: StepInput<TrainBackend<G>>> Graphs<G, T> {
    pub(crate) fn new(config: &GraphTrainerConfig) -> Self {
        Self {
            cache: GraphCache::new(config.cache_limits()),
            rehearsed: HashMap::new(),
            pins: Pins::Unpinned,
            rewarm: false,
            max_recaptures: config.max_recaptures,
            stats: GraphStats::default(),
        }
    }

    /// How the step for `key` runs. A replay whose graph reads a constant that nothing
    /// outside holds any more does not run: the shape warms up again from this step.
    pub(crate) fn plan(&mut self, key: &InputKey, device: &G::Device) -> Plan {
        let plan = self.cache.plan(key, G::supports_hardware_graphs(device));
        let dropped = match plan {
            Plan::Replay => self
                .cache
                .graph(key)
                .and_then(CapturedStep::dropped_constant),
            _ => None,
        };
        let Some(read) = dropped else {
            return plan;
        };
        let change = StepChange::ConstantDropped {
            op: read.op.into(),
            shape: read.tensor.shape.as_slice().to_vec(),
            dtype: read.tensor.dtype,
        };
        tracing::info!(%change, "a graph's constant is gone; its shape warms up again");
        self.cache.stale(key);
        Plan::Rewarm(FallbackReason::GraphStale { change })
    }

    /// Whether steps write into pinned buffers (and lent tensors must be copies).
    pub(crate) fn pinned(&self) -> bool {
        self.pins.is_pinned()
    }

    /// Before the last warmup step of `key` on a device with graphs: pins the model and
    /// optimizer state and returns pinned copies of the inputs, so that this eager step
    /// runs on the buffers, layouts and strides the capture will see. Any kernel or
    /// autotuned choice the capture needs is then compiled and tuned by this step, never
    /// inside the window (where a first compile or an autotune benchmark would break the
    /// capture). `None` when this is not that step, or pinning failed (the capture then
    /// pins, and reports the failure).
    pub(crate) fn rehearsal_inputs<M, O>(
        &mut self,
        learner: &mut Learner<M, O>,
        key: &InputKey,
        inputs: &[AnyTensor<G>],
        device: &G::Device,
    ) -> Option<Vec<AnyTensor<G>>>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        if !G::supports_hardware_graphs(device) || !self.cache.last_warmup(key) {
            return None;
        }
        self.ensure_pinned(learner).ok()?;
        pin_inputs(inputs).ok()
    }

    /// Ends a step: a layout move it found sends every shape with a graph, or ready for
    /// one, back to its last warmup step, which pins again as the values lie and
    /// rehearses on them before a capture. (Done after the step's own warmup or verify
    /// accounting, which would otherwise count that step as the rehearsal.)
    pub(crate) fn step_done(&mut self) {
        if std::mem::take(&mut self.rewarm) {
            self.cache.rewarm();
        }
    }

    /// Keeps the constants that the rehearsal of `key` read (`reads`, found among
    /// `kept`), for its capture to pin.
    pub(crate) fn rehearsed(&mut self, key: &InputKey, reads: &[ExternalRead], kept: &Kept) {
        let constants = reads
            .iter()
            .filter_map(|read| kept_tensor::<G>(read, kept))
            .collect();
        self.rehearsed.insert(key.clone(), constants);
    }

    /// Records a warmup step of `key`; returns the reason if it disabled the shape.
    pub(crate) fn warmed(&mut self, key: &InputKey, step: Observation) -> Option<FallbackReason> {
        self.cache.warmed(key, step)
    }

    /// Records a warmup step of a path that `key`'s graphs' traces found none of.
    pub(crate) fn warmed_unmatched(
        &mut self,
        key: &InputKey,
        step: Observation,
    ) -> Option<FallbackReason> {
        self.cache.warmed_unmatched(key, step)
    }

    /// Records a step that verified the suspect graph of `key`.
    pub(crate) fn verified(&mut self, key: &InputKey, step: Observation) -> Option<FallbackReason> {
        self.cache.verified(key, step)
    }

    /// Makes `key` eager, until it warms up again (`rewarm_after`).
    pub(crate) fn disable(&mut self, key: &InputKey, reason: FallbackReason) {
        self.cache.disable(key, reason);
    }

    /// Drops the pins and makes every shape eager, until each warms up again.
    pub(crate) fn disable_all(&mut self, reason: FallbackReason) {
        self.unpin();
        self.cache.disable_all(reason);
    }

    /// Live graphs.
    pub(crate) fn graphs_alive(&self) -> usize {
        self.cache.graphs_alive()
    }

    pub(crate) fn stats(&self) -> GraphStats {
        GraphStats {
            evictions: self.cache.evictions(),
            rewarms: self.cache.rewarms(),
            ..self.stats
        }
    }

    /// Drops every graph (before the buffers they use) and the pins, so that no step
    /// writes into the pinned buffers any more; graphed shapes capture again later.
    pub(crate) fn unpin(&mut self) {
        if self.pins.unpin() {
            self.cache.drop_graphs();
            self.stats.pinned_bytes = 0;
        }
    }

    /// Starts over for a model of another structure: no pins, no graphs, and every
    /// shape warms up again (its recorded steps were another model's).
    pub(crate) fn restart(&mut self) {
        self.unpin();
        self.cache.clear();
    }

    /// What the trainer accounts for in a step besides the batch: the allocations of its
    /// parameters and optimizer state.
    pub(crate) fn owned<M, O>(&self, learner: &mut Learner<M, O>) -> Accounted
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        let (model, optimizer) = learner.parts_mut();
        Accounted::new(
            super::pinning::buffers::<G, M, O>(model, optimizer)
                .iter()
                .map(Allocated::allocation_id),
        )
    }

    /// Records the step for `key` into a graph and launches it once. A data-parallel
    /// rank launches only if every rank's capture succeeded (`parallel`); otherwise it
    /// keeps its graph for the next step, unlaunched, and runs this one eagerly.
    pub(crate) fn capture<M, O, I, F, R>(
        &mut self,
        mut cx: StepContext<'_, G, M, O, F>,
        key: &InputKey,
        batch: &I,
        inputs: &[AnyTensor<G>],
    ) -> Result<Captured<T>, Fallback>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
        I: StepInput<TrainBackend<G>>,
        F: FnMut(&M, &I) -> R,
        R: StepOutput<TrainBackend<G>, Item = T>,
    {
        let started = Instant::now();
        let rank = cx.rank;
        let recorded = self.record(&mut cx, key, batch, inputs);
        let recorded = match rank {
            Some(rank) => self.agree_launch(key, recorded, rank),
            None => recorded,
        };
        let recorded = recorded.inspect_err(|_| {
            // Nothing recorded ran: the pinned buffers hold the pre-step values.
            if let Some(pins) = self.pins.get() {
                pins.reseat_learner(cx.learner);
            }
        })?;
        let (Recorded::Graph(step) | Recorded::Differs(step, _)) = &recorded;
        if let Err(error) = G::replay(&step.graph) {
            let reason = FallbackReason::Graph(error);
            return Err(match rank {
                // The peers launched theirs: their collectives wait for this rank's.
                Some(rank) => Fallback::Refused(rank.fail(reason)),
                None => Fallback::trainer(reason),
            });
        }
        self.stats.capture_ms += started.elapsed().as_secs_f64() * 1e3;
        let owned = owned_copy(&step.outputs);
        Ok(match recorded {
            Recorded::Graph(step) => {
                self.rehearsed.remove(key);
                self.cache.captured(key, step);
                Captured::Graph(owned)
            }
            // The graph is exactly this call of the closure, so its one launch is this
            // step's eager result (the closure is not called again); it cannot stand for
            // later steps, so the shape warms up again from this one.
            Recorded::Differs(step, reason) => {
                self.cache
                    .capture_differed(key, step.observation, reason.clone());
                Captured::Once(owned, reason)
            }
        })
    }

    /// Pins (once), pins a copy of the batch, and records the step into a graph, which
    /// must do what warmup verified. Nothing recorded runs.
    fn record<M, O, I, F, R>(
        &mut self,
        cx: &mut StepContext<'_, G, M, O, F>,
        key: &InputKey,
        batch: &I,
        inputs: &[AnyTensor<G>],
    ) -> Result<Recorded<G, T>, Fallback>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
        I: StepInput<TrainBackend<G>>,
        F: FnMut(&M, &I) -> R,
        R: StepOutput<TrainBackend<G>, Item = T>,
    {
        self.check_pins(cx.learner)?;
        self.ensure_pinned(cx.learner)?;
        // Constants known by place are read through pins, made (outside the window) from
        // those the rehearsal read.
        let by_place = constants_by_place::<G>(cx.rank.is_some());
        // Kept until a capture of the shape succeeds: one that takes another path than
        // warmup made ready is tried again.
        let rehearsed = self.rehearsed.get(key).cloned().unwrap_or_default();
        let constant_pins = match by_place {
            true => pins_for::<G>(rehearsed),
            false => Vec::new(),
        };
        let shape_error = |error| Fallback::shape(FallbackReason::Graph(error));
        let static_inputs = pin_inputs(inputs).map_err(shape_error)?;
        let static_batch = on_inputs(batch, &static_inputs);
        let pins = self.pins.get().expect("pinned above");
        let accounted = Accounted::new(
            pins.allocations()
                .chain(static_inputs.iter().map(AnyTensor::allocation_id))
                .chain([cx.random.accounted()]),
        );

        // The model as it was, in case the recorded step panics inside `Learner::update`
        // (which takes the model): the pins still hold its values, since nothing ran.
        let before = cx.learner.model().clone();
        let session = CaptureSession::begin_keeping(accounted.ids().clone());
        let swapping = Swapping::begin(constant_pins);
        let caller = StreamId::current();
        let device = cx.device;
        let captured = std::panic::catch_unwind(AssertUnwindSafe(|| {
            G::capture(device, || record_step(cx, &static_batch, pins, caller))
        }));
        let swapped = swapping.finish();
        let recording = session.finish();
        let captured = match captured {
            Ok(captured) => captured,
            Err(panic) => {
                cx.learner.restore_if_lost(before);
                let error = GraphError::CapturePanicked(panic_message(panic.as_ref()));
                tracing::warn!(%error, "capture fell back");
                return Err(shape_error(error));
            }
        };
        let (recorded, graph) = match captured {
            Window::Refused(error) => return Err(shape_error(error)),
            Window::Recorded { output, graph } => (output, Ok(graph)),
            Window::Broken { output, error } => (output, Err(error)),
        };
        let kept = recording.kept().clone();
        let mut observation = Observation {
            signature: recording.signature,
            breakers: recording.breakers,
            unaccounted: accounted.unaccounted(recording.reads),
            by_place: false,
        };
        let (outputs, graph) = match (recorded, graph) {
            (Err(refusal), _) => return Err(refusal),
            (Ok(_), Err(error)) => return Err(shape_error(error)),
            (Ok(outputs), Ok(graph)) => (outputs, graph),
        };
        // The pins take the constants the capture read, before its first launch.
        for pin in &swapped {
            pin.fill_from_source().map_err(shape_error)?;
        }
        let traced = G::trace_recording(&graph).is_some();
        let (constants, pins) = constants_of::<G>(&mut observation, &kept, swapped, traced);
        observation.by_place = by_place && traced;
        let differs = self.cache.capture_verdict(key, &observation);
        let step = CapturedStep {
            graph,
            inputs: static_inputs,
            outputs,
            observation,
            constants,
            pins,
        };
        match differs {
            None => Ok(Recorded::Graph(step)),
            Some(reason) => Ok(Recorded::Differs(step, reason)),
        }
    }

    /// The launch agreement of a data-parallel capture: every rank says how its
    /// recording came out. Every rank with a recording launches it when all have one (a
    /// recording unlike warmup launches once, as this step's eager result: the closure
    /// is not called again). When a peer has none, this rank's graph is kept unlaunched
    /// (the next step replays it, if every rank can) and this step runs eagerly like the
    /// peer's.
    fn agree_launch(
        &mut self,
        key: &InputKey,
        recorded: Result<Recorded<G, T>, Fallback>,
        rank: &Rank<GraphCapture<G>>,
    ) -> Result<Recorded<G, T>, Fallback> {
        let own = match &recorded {
            Ok(_) => CaptureOutcome::Ready,
            Err(Fallback::Refused(error)) => CaptureOutcome::Failed(Cause::new(error.clone())),
            Err(Fallback::Eager { reason, .. }) => CaptureOutcome::Fallback(reason.clone()),
        };
        let verdict = rank.agree_launch(&own).map_err(Fallback::Refused)?;
        match (verdict, recorded) {
            (None, recorded) => recorded,
            (Some(reason), Ok(Recorded::Graph(step))) => {
                self.cache.captured(key, step);
                Err(Fallback::step(reason))
            }
            (Some(_), Ok(Recorded::Differs(step, own))) => {
                self.cache
                    .capture_differed(key, step.observation, own.clone());
                Err(Fallback::step(own))
            }
            (Some(_), Err(own)) => Err(own),
        }
    }

    /// Checks the pins and copies `inputs` into the static inputs of `key`'s graph: what
    /// a replay does before its launch.
    pub(crate) fn prepare_replay<M, O>(
        &mut self,
        learner: &mut Learner<M, O>,
        key: &InputKey,
        inputs: &[AnyTensor<G>],
    ) -> Result<(), Fallback>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        self.check_pins(learner)?;
        let Some(step) = self.cache.first(key) else {
            return Err(Fallback::step(FallbackReason::PinnedBuffersChanged));
        };
        let fatal = |error| Fallback::trainer(FallbackReason::Graph(error));
        for (input, tensor) in step.inputs.iter().zip(inputs) {
            // A batch laid out unlike the one captured runs eagerly, as eager code on it
            // would launch other kernels; the graph stays for batches laid out as recorded.
            G::copy_into(input, tensor).map_err(|error| once_if_layout(error, fatal))?;
        }
        Ok(())
    }

    /// Whether `key`'s graphs can be traced: its first graph has a trace recording (the
    /// candidates [`traces_of`](Self::traces_of) gives start with it).
    pub(crate) fn traceable(&self, key: &InputKey) -> bool {
        self.cache
            .first(key)
            .is_some_and(|step| G::trace_recording(&step.graph).is_some())
    }

    /// The graphs a trace of `key`'s step chooses among, the one its replay is
    /// prepared for first, and the batch inputs the trace runs the closure on (that
    /// graph's, as its capture did). Each graph comes with the pins it reads constants
    /// through and, beside its recording, its own batch inputs for the ones the step
    /// reads. Empty where the graph has no recording to trace.
    pub(crate) fn traces_of(&self, key: &InputKey) -> (Vec<Candidate>, Vec<AnyTensor<G>>) {
        let graphs = self.cache.graphs(key);
        let Some(first) = graphs.first() else {
            return (Vec::new(), Vec::new());
        };
        // Names read only where another graph needs them (each costs an id read).
        let read = match graphs.len() {
            1 => Vec::new(),
            _ => first.inputs.iter().map(AnyTensor::trace_key).collect(),
        };
        let candidates = graphs
            .iter()
            .enumerate()
            .map_while(|(index, step)| {
                let pins = match &step.pins {
                    ConstantPins::Traced(pins) => pins.clone(),
                    ConstantPins::Fixed(_) => Vec::new(),
                };
                let aliases = match index {
                    0 => Vec::new(),
                    _ => read
                        .iter()
                        .zip(step.inputs.iter().map(AnyTensor::trace_key))
                        .filter_map(|(read, own)| Some((read.clone()?, own?)))
                        .collect(),
                };
                Some(Candidate {
                    recording: G::trace_recording(&step.graph)?,
                    pins,
                    aliases,
                })
            })
            .collect();
        (candidates, first.inputs.clone())
    }

    /// A trace of `key` matched its graph `index` (in [`traces_of`](Self::traces_of)'s
    /// order): that graph replays, with the batch copied into its inputs.
    pub(crate) fn matched<M, O>(
        &mut self,
        learner: &mut Learner<M, O>,
        key: &InputKey,
        index: usize,
        inputs: &[AnyTensor<G>],
    ) -> Result<(), Fallback>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        if index == 0 {
            return Ok(());
        }
        self.cache.matched(key, index);
        self.prepare_replay(learner, key, inputs)
    }

    /// A step of `key` differed from every graph of the shape and ran eagerly: the
    /// graphs stay for the paths they recorded, and the shape warms up the new one.
    pub(crate) fn branch(&mut self, key: &InputKey) {
        self.cache.branch(key);
    }

    /// Puts the learner back on the pins without copying: after a trace that matched (it
    /// left the learner on stand-ins), or one that failed (nothing it ran is kept).
    pub(crate) fn reseat<M, O>(&self, learner: &mut Learner<M, O>)
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        if let Some(pins) = self.pins.get() {
            pins.reseat_learner(learner);
        }
    }

    /// `key`'s graph no longer stands for its steps: the shape warms up again.
    pub(crate) fn stale(&mut self, key: &InputKey) {
        self.cache.stale(key);
    }

    /// Launches the graph of `key`, prepared by [`prepare_replay`](Self::prepare_replay).
    pub(crate) fn launch_replay(&mut self, key: &InputKey) -> Result<T, Fallback> {
        let Some(step) = self.cache.first(key) else {
            return Err(Fallback::step(FallbackReason::PinnedBuffersChanged));
        };
        G::replay(&step.graph).map_err(|e| Fallback::trainer(FallbackReason::Graph(e)))?;
        Ok(owned_copy(&step.outputs))
    }

    /// Drops the graph of `key`, if any: its next step captures again.
    pub(crate) fn drop_graph(&mut self, key: &InputKey) {
        self.cache.drop_graph(key);
    }

    /// Writes an eager step's results into the pinned buffers, if there are any. On
    /// failure the pins are dropped (graphs first) and training goes on unpinned.
    pub(crate) fn write_back_eager<M, O>(&mut self, learner: &mut Learner<M, O>)
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        // A failure was logged and handled; the step's own mode stands.
        let _ = self.seat_model(learner);
    }

    /// Seats the learner's model on the pins (its values copied into them), if there
    /// are pins. On failure the learner keeps its model unpinned and graphs and pins are
    /// dropped; the reason says why. A model that lies otherwise than its pins (other
    /// strides, as uploads after a reload lie) is pinned again at its shapes' next
    /// warmup step, as it lies then: steps on pins must run the kernels eager steps on
    /// that model would.
    fn seat_model<M, O>(&mut self, learner: &mut Learner<M, O>) -> Result<(), FallbackReason>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        let Err(error) = self.pins.seat(learner) else {
            return Ok(());
        };
        let reason = FallbackReason::from_graph_error(error);
        tracing::info!(%reason, "write-back into the pins failed; dropping graphs and pins");
        self.unpin();
        if matches!(reason, FallbackReason::LayoutChanged { .. }) {
            self.rewarm = true;
            self.stats.recaptures += 1;
            if self.stats.recaptures > self.max_recaptures {
                self.cache.disable_all(FallbackReason::RecaptureLimit);
                return Err(FallbackReason::RecaptureLimit);
            }
        }
        Err(reason)
    }

    /// Takes `model`, put back by the user, as it is: its next step runs eagerly on its
    /// own tensors, as plain code on that model would (a model loaded from a record lies
    /// as uploads do, which may not be how the pins lie: `backend::layout`), and that
    /// step's results are written into the pins. Every graph must then match an eager
    /// step before it replays. A model that does not fit the pins is unpinned then.
    pub(crate) fn put_back<M, O>(&mut self, learner: &mut Learner<M, O>, model: M)
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        learner.update(|_, _| model);
        if self.pins.put_back() {
            self.cache.suspect_graphs();
        }
    }

    /// Sets the learning rate in the pinned buffer; false when nothing is pinned or
    /// the write failed.
    pub(crate) fn write_lr(&mut self, lr: f64, device: &G::Device) -> bool {
        let Some(target) = self.pins.get().and_then(Pinned::lr) else {
            return false;
        };
        let value = Tensor::<GraphCapture<G>, 1>::from_floats([lr as f32], device);
        copy_float::<G>(target, &value.into_primitive().tensor()).is_ok()
    }

    /// The buffers may have changed (a new learning-rate tensor): check them again
    /// before the next graph step.
    pub(crate) fn recheck(&mut self) {
        self.pins.recheck();
    }

    /// Pins the model and optimizer state unless they already are.
    fn ensure_pinned<M, O>(&mut self, learner: &mut Learner<M, O>) -> Result<(), Fallback>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        if self.pins.is_pinned() {
            return Ok(());
        }
        self.stats.pinned_bytes = self
            .pins
            .pin(learner)
            .map_err(|error| Fallback::trainer(FallbackReason::Graph(error)))?;
        Ok(())
    }

    /// Checks that the model and optimizer still sit on the pinned buffers; if not,
    /// drops every graph (before the buffers they use) and the pins.
    fn check_pins<M, O>(&mut self, learner: &mut Learner<M, O>) -> Result<(), Fallback>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
    {
        if self.pins.is_unseated() {
            // A model put back that no eager step has run on yet: seat it now.
            self.seat_model(learner).map_err(Fallback::step)?;
            self.pins.mark_checked();
            return Ok(());
        }
        if self.pins.still_seated(learner) {
            return Ok(());
        }
        self.unpin();
        self.stats.recaptures += 1;
        if self.stats.recaptures > self.max_recaptures {
            return Err(Fallback::trainer(FallbackReason::RecaptureLimit));
        }
        Err(Fallback::step(FallbackReason::PinnedBuffersChanged))
    }
}

/// The body of a captured step: the shared training step (its random ops drawn from
/// `random`, whose state then advances), then the write-back of the new values into the
/// pins. Returns the step's item, detached and handed over to the `caller`'s stream
/// (`GraphBackend::hand_over`).
fn record_step<G, M, O, I, F, R>(
    cx: &mut StepContext<'_, G, M, O, F>,
    batch: &I,
    pins: &Pinned<G>,
    caller: StreamId,
) -> Result<R::Item, Fallback>
where
    G: GraphBackend,
    M: AutodiffModule<TrainBackend<G>>,
    O: CapturableOptimizer<M, TrainBackend<G>>,
    F: FnMut(&M, &I) -> R,
    R: StepOutput<TrainBackend<G>>,
{
    let item = cx.train(batch).map_err(Fallback::Refused)?;
    cx.random
        .advance()
        .map_err(|error| Fallback::shape(FallbackReason::Graph(error)))?;
    // Values the step left laid out unlike the pins drop this capture; the eager step
    // instead pins them again as they lie (`Graphs::seat_model`).
    pins.seat(cx.learner).map_err(|error| {
        once_if_layout(error, |other| Fallback::shape(FallbackReason::Graph(other)))
    })?;
    Ok(map_tensors(&item, |tensor| {
        AnyTensor::from_inner(G::hand_over(tensor.into_inner(), caller))
    }))
}

/// Whether a trainer's steps know constants by place, its graphs reading them through
/// pins that traces fill (`GraphBackend::pins_constants`): not where replays are
/// untraced (`Untraced`), nor on data-parallel ranks, whose peers may have to replay
/// untraced (a constant replaced there makes the step differ, and every rank runs it
/// eagerly).
pub(crate) fn constants_by_place<G: GraphBackend>(data_parallel: bool) -> bool {
    G::pins_constants() && !data_parallel && !Untraced::active()
}

/// The holders of a capture's constants and the pins it read them through. A pinned
/// read is named by the constant it stood for. A traced graph's pins are filled by its
/// traces, and its pinned constants need no holders; an untraced graph's keep what the
/// capture read, and its constants are held as unpinned ones are.
fn constants_of<G: GraphBackend>(
    observation: &mut Observation,
    kept: &Kept,
    swapped: Vec<ConstantPin>,
    traced: bool,
) -> (Vec<(ExternalRead, Holder)>, ConstantPins) {
    let by_pin: HashMap<AllocationId, &ConstantPin> = swapped
        .iter()
        .map(|pin| (pin.key().0.clone(), pin))
        .collect();
    let mut stood_for = HashMap::new();
    for read in &mut observation.unaccounted {
        if let Some(pin) = read.allocation.as_ref().and_then(|id| by_pin.get(id)) {
            let source = pin.source_allocation();
            stood_for.insert(source.clone(), *pin);
            read.allocation = Some(source);
        }
    }
    let constants = holders::<G>(&observation.unaccounted, |read| {
        let id = read.allocation.as_ref()?;
        match stood_for.get(id) {
            Some(_) if traced => None,
            Some(pin) => as_tensor(read, &*pin.source()),
            None => kept_tensor(read, kept),
        }
    });
    drop((by_pin, stood_for));
    let pins = match traced {
        true => ConstantPins::Traced(swapped.into_iter().map(Arc::new).collect()),
        false => ConstantPins::Fixed(swapped.into_iter().map(ConstantPin::into_slot).collect()),
    };
    (constants, pins)
}

/// A layout difference runs this step eagerly with `LayoutChanged`; any other error
/// falls back as `otherwise` says.
fn once_if_layout(error: GraphError, otherwise: impl FnOnce(GraphError) -> Fallback) -> Fallback {
    match error {
        GraphError::LayoutDiffers { .. } => Fallback::step(FallbackReason::from_graph_error(error)),
        other => otherwise(other),
    }
}

/// Pinned copies of the batch's tensors: the static inputs a capture records (and the
/// last warmup step runs on).
fn pin_inputs<G: GraphBackend>(inputs: &[AnyTensor<G>]) -> Result<Vec<AnyTensor<G>>, GraphError> {
    inputs.iter().cloned().map(G::pin_input).collect()
}

/// `batch` with its tensors replaced by `inputs` (the same kinds and shapes, in order).
pub(crate) fn on_inputs<G, I>(batch: &I, inputs: &[AnyTensor<G>]) -> I
where
    G: GraphBackend,
    I: StepInput<TrainBackend<G>>,
{
    let mut tensors = inputs
        .iter()
        .cloned()
        .map(AnyTensor::<GraphCapture<G>>::from_inner)
        .collect::<Vec<_>>()
        .into_iter();
    batch.with_tensors(&mut tensors)
}

/// The text a panic carried, if it carried one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::panic_message;

    #[test]
    fn a_panic_reads_as_its_message() {
        let owned = std::panic::catch_unwind(|| panic!("tuned {}", 3)).unwrap_err();
        assert_eq!(panic_message(owned.as_ref()), "tuned 3");
        let literal = std::panic::catch_unwind(|| std::panic::panic_any("plain")).unwrap_err();
        assert_eq!(panic_message(literal.as_ref()), "plain");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7_u8)).unwrap_err();
        assert_eq!(panic_message(other.as_ref()), "a panic without a message");
    }
}
