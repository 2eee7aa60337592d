//! The trace of a replayed step: the step closure runs, and each op is matched against
//! the graph's recording instead of running.
//!
//! A replay does not call the closure on its own, so whatever the closure reads from
//! the host (a loss weight, a coin, its own counter) would replay as it was at capture.
//! With a trace, the closure, autodiff's backward pass and the optimizer run as usual,
//! but each op the decorator forwards is compared with the recorded op at its place:
//! its name, input shapes and dtypes, host attributes, and which value each input is
//! (the output of which recorded op, or which tensor from outside: a pinned parameter,
//! a batch input, a constant). A matched op launches nothing and hands back stand-ins
//! for its outputs, tensors the recording made for them. When the whole step matched,
//! the graph replays. At the first op that differs, the recorded ops before it run on
//! the values as they are now, their stand-ins are filled with what they compute, and
//! the step goes on eagerly from that op, so that it equals plain code and the closure
//! is called once. Where stand-ins cannot be filled without changing the step (fusion
//! would group the refilled ops otherwise than the eager step's: `GraphBackend::
//! traces_run_again`), the trace instead unwinds out of the closure at the first
//! difference, and the step runs again eagerly from its start, with clones of the
//! closure and the optimizer taken before the trace ([`Stop::RunAgain`]).

use std::cell::RefCell;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::constant_pin::ConstantPin;
use super::emulated::program::{AsValue, Inner, Key, Slot, StandInValue, Value};
use super::session::{BreakerKind, CaptureBreaker, OpRecord, OpRecorder};

/// Where a trace stopped matching its graph; `index` counts the ops matched before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Difference {
    /// A capture breaker (a host read) where the graph has none.
    Breaker(CaptureBreaker),
    /// Another op than the graph's.
    OtherOp {
        index: usize,
        graph: &'static str,
        step: &'static str,
    },
    /// Inputs of other shapes or dtypes.
    InputShapes { index: usize, op: &'static str },
    /// Other host values.
    HostValues { index: usize, op: &'static str },
    /// Input `argument` is another value than the graph's (another parameter, batch
    /// input or constant, or another op's output).
    OtherInput {
        index: usize,
        op: &'static str,
        argument: usize,
    },
    /// Another number of ops.
    OpCount { graph: usize, step: usize },
    /// Data-parallel training: the step of peer `rank` differed from its graph, so that
    /// every rank runs this step eagerly (`Peers`).
    Peer { rank: usize },
}

/// A data-parallel rank's peers, as its trace agrees with them: every rank's step runs
/// the step's collectives the same way, all inside their graphs' launches or all
/// eagerly. The ranks agree once before the step's collective (the gradient average:
/// [`before_collective`]), and once more after it, when a trace stops matching or
/// reaches the step's end, so that a rank whose trace stops matching after the
/// collective computes it again with its peers, never alone.
pub(crate) trait Peers {
    /// Tells the peers whether this rank's trace still matches, and learns the first
    /// rank whose trace does not (this one included), if any; `Err` when the group
    /// failed.
    fn agree(&mut self, matching: bool) -> Result<Option<usize>, GroupFailed>;
}

/// The group of a traced rank failed while the ranks agreed on the trace.
#[derive(Debug, thiserror::Error)]
#[error("the data-parallel group failed while its ranks agreed on a trace")]
pub(crate) struct GroupFailed;

/// Where a rank's trace stands with its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerPhase {
    /// Before the step's collective: a trace that stops matching tells the peers there.
    BeforeCollective,
    /// Every rank matched up to the collective, which was matched too: the ranks agree
    /// once more, where a trace stops matching or at the step's end.
    AfterCollective,
    /// Nothing more to agree on in this step.
    Agreed,
}

thread_local! {
    static TRACER: RefCell<Option<Tracer>> = const { RefCell::new(None) };
    /// Open [`Untraced`] guards on this thread.
    static UNTRACED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Replays without traces on this thread while the guard lives, as graphs without
/// stand-ins replay: what the step closure reads from the host replays as it was at
/// capture. For tests that show what a trace catches.
#[must_use = "replays are untraced only while the guard lives"]
pub struct Untraced {
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl Untraced {
    /// Whether replays are untraced on this thread.
    pub fn active() -> bool {
        UNTRACED.with(std::cell::Cell::get) != 0
    }

    /// Replays untraced on this thread until the guard is dropped.
    pub fn on() -> Self {
        UNTRACED.with(|untraced| untraced.set(untraced.get() + 1));
        Self {
            _thread_bound: std::marker::PhantomData,
        }
    }
}

impl Drop for Untraced {
    fn drop(&mut self) {
        UNTRACED.with(|untraced| untraced.set(untraced.get() - 1));
    }
}

thread_local! {
    /// Open [`RunsAgain`] guards on this thread.
    static RUNS_AGAIN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Traces on this thread stop at the first difference and run the step again from its
/// start, on any stack, while the guard lives, as the fusion stack's traces always do
/// (`GraphBackend::traces_run_again`). For tests of that way on the CPU.
#[must_use = "traces run a differing step again only while the guard lives"]
pub struct RunsAgain {
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl RunsAgain {
    /// Whether traces on this thread run a differing step again.
    pub fn active() -> bool {
        RUNS_AGAIN.with(std::cell::Cell::get) != 0
    }

    /// Traces on this thread run a differing step again until the guard is dropped.
    pub fn on() -> Self {
        RUNS_AGAIN.with(|on| on.set(on.get() + 1));
        Self {
            _thread_bound: std::marker::PhantomData,
        }
    }
}

impl Drop for RunsAgain {
    fn drop(&mut self) {
        RUNS_AGAIN.with(|on| on.set(on.get() - 1));
    }
}

/// Most graphs a trace matches a step against at once (`Trace::begin` takes the
/// first ones).
pub(crate) const MAX_CANDIDATES: usize = 8;

/// A trace in progress on this thread: the step matched against each graph of its
/// shape at once, the stand-ins of one of them (the leader) handed out.
struct Tracer {
    matchers: Vec<Matcher>,
    /// The matcher whose stand-ins are handed out: the first one still matching.
    leader: usize,
    /// Earlier leaders, each with the step it had reached when it stopped matching:
    /// what they handed out is computed if no graph matches the whole step.
    former: Vec<(usize, usize)>,
    /// Traced ops matched so far.
    matched: usize,
    /// Where the trace stopped matching every graph, once it did.
    diverged: Option<Difference>,
    /// Whether matched ops are recorded too, named, as an eager step's are: the step,
    /// if it matches no graph, is then observed whole.
    observing: bool,
    /// A data-parallel rank's peers, and where the trace stands with them.
    peers: Option<(Box<dyn Peers>, PeerPhase)>,
    /// Whether a difference stops the step (it runs again from its start) instead of
    /// filling the stand-ins handed out so far.
    runs_again: bool,
    /// Keeps the device's queue ready for the launch after the trace
    /// (`GraphBackend::keep_ready`), called every [`KEEP_READY_EVERY`] matched ops;
    /// `None` where [`KEEP_READY_SWITCH`] is `off`.
    keep_ready: Option<Box<dyn Fn()>>,
}

/// `off` stops traces from calling `GraphBackend::keep_ready`, to measure what it saves.
const KEEP_READY_SWITCH: &str = "BURN_GRAPH_CAPTURE_KEEP_READY";

/// Whether traces keep the device's queues ready (`KEEP_READY_SWITCH`).
fn keeps_ready() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(KEEP_READY_SWITCH).map_or(true, |value| value != "off"))
}

/// Matched ops between two calls of a trace's `keep_ready`: a few tens of
/// microseconds of host work, well inside the half millisecond after which an idle
/// CubeCL server starts to sleep.
const KEEP_READY_EVERY: usize = 32;

/// The step matched against one graph's recording.
struct Matcher {
    recording: Arc<Inner>,
    /// The step after the last one matched.
    next: usize,
    /// The recorded key each tensor handed to the step stands for: the stand-ins handed
    /// out, and the batch inputs of the graph the trace runs on.
    stand_ins: FxHashMap<Key, Key>,
    /// The generation each recorded key is at after the ops matched so far: a read of a
    /// key is a read of its latest value, as the recording took it.
    latest: FxHashMap<Key, u32>,
    /// The tensors from outside the step that matched ops read, by slot: what the
    /// recorded ops compute from when the trace stops matching (a device graph's
    /// recording names them without holding them).
    supplied: FxHashMap<Slot, Value>,
    /// The graph's constant pins, by the key the recording names each by.
    pins: FxHashMap<Key, Arc<ConstantPin>>,
    /// Where it stopped matching, once it did.
    stopped: Option<Difference>,
}

/// One graph a trace matches the step against.
pub(crate) struct Candidate {
    /// Its recording.
    pub(crate) recording: TraceRecording,
    /// The pins it reads constants through.
    pub(crate) pins: Vec<Arc<ConstantPin>>,
    /// Tensors the step reads in place of those the recording names: the batch inputs
    /// of the graph the trace runs on, each with this graph's own.
    pub(crate) aliases: Vec<(Key, Key)>,
}

/// A graph's recording as traces match it (`GraphBackend::trace_recording`).
pub struct TraceRecording(pub(crate) Arc<Inner>);

impl std::fmt::Debug for TraceRecording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TraceRecording({} ops)", self.0.traced_count())
    }
}

/// How a trace came out.
#[derive(Debug)]
pub(crate) enum Traced {
    /// Every op matched the recording of candidate `.0` (in the order the trace was
    /// given them): that graph may replay.
    Matched(usize),
    /// The step differed; it went on eagerly from the first difference.
    Diverged(Difference),
    /// The step differed, and stopped there: it runs again eagerly from its start.
    RunAgain(Difference),
    /// Filling the stand-ins failed (a recording the emulation got wrong): the step's
    /// values cannot be trusted.
    Failed(String),
}

/// How a trace that stops matching goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnDifference {
    /// The recorded ops before the difference compute, their stand-ins take what they
    /// computed, and the step goes on eagerly: the closure is called once.
    GoOn,
    /// The step stops (the closure unwinds with [`Stop::RunAgain`]) and runs again
    /// eagerly from its start.
    RunAgain,
}

/// A trace on this thread until it is ended or dropped.
pub(crate) struct Trace {
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl Trace {
    /// Starts tracing against `candidates`, the graphs of the step's shape (the first
    /// is the one the step runs on, and leads); `None` if a trace is already running
    /// here or there is no candidate. An `observing` trace also records the ops it
    /// matches into the open capture sessions, as the eager step would record them.
    /// `keep_ready` is called every few matched ops (`GraphBackend::keep_ready`).
    pub(crate) fn begin(
        candidates: &[Candidate],
        observing: bool,
        on_difference: OnDifference,
        keep_ready: Box<dyn Fn()>,
    ) -> Option<Self> {
        Self::begin_with(candidates, observing, on_difference, None, keep_ready)
    }

    /// [`begin`](Self::begin) for a data-parallel rank: the trace agrees with `peers`
    /// on whether every rank's step matched (see [`Peers`]).
    pub(crate) fn begin_ranked(
        candidates: &[Candidate],
        observing: bool,
        on_difference: OnDifference,
        peers: Box<dyn Peers>,
        keep_ready: Box<dyn Fn()>,
    ) -> Option<Self> {
        Self::begin_with(
            candidates,
            observing,
            on_difference,
            Some(peers),
            keep_ready,
        )
    }

    fn begin_with(
        candidates: &[Candidate],
        observing: bool,
        on_difference: OnDifference,
        peers: Option<Box<dyn Peers>>,
        keep_ready: Box<dyn Fn()>,
    ) -> Option<Self> {
        if Untraced::active() || candidates.is_empty() {
            return None;
        }
        TRACER.with(|tracer| {
            let mut tracer = tracer.borrow_mut();
            if tracer.is_some() {
                return None;
            }
            *tracer = Some(Tracer {
                matchers: candidates
                    .iter()
                    .take(MAX_CANDIDATES)
                    .map(Matcher::new)
                    .collect(),
                leader: 0,
                former: Vec::new(),
                matched: 0,
                diverged: None,
                observing,
                peers: peers.map(|peers| (peers, PeerPhase::BeforeCollective)),
                runs_again: on_difference == OnDifference::RunAgain,
                keep_ready: keeps_ready().then_some(keep_ready),
            });
            Some(Self {
                _thread_bound: std::marker::PhantomData,
            })
        })
    }

    /// Ends the trace after the step's work: matched if every recorded op of one
    /// candidate was (the leader where it was).
    pub(crate) fn end(self) -> Traced {
        let outcome = TRACER.with(|tracer| {
            let mut tracer = tracer.borrow_mut();
            let tracer = tracer.as_mut().expect("a trace owns its tracer");
            if tracer.diverged.is_none() {
                let whole = |index: &usize| {
                    let matcher: &Matcher = &tracer.matchers[*index];
                    matcher.stopped.is_none() && matcher.recording.traced_count() == tracer.matched
                };
                let all = 0..tracer.matchers.len();
                let matched = Some(tracer.leader)
                    .filter(whole)
                    .or(all.into_iter().find(whole));
                if let Some(index) = matched {
                    match tracer.agree_after_collective(true) {
                        Err(failed) => return Traced::Failed(failed.to_string()),
                        Ok(None) => return Traced::Matched(index),
                        Ok(Some(rank)) => {
                            let change = Difference::Peer { rank };
                            return match tracer.diverge(change.clone()) {
                                Ok(()) => Traced::Diverged(change),
                                Err(stop) => stop.into_traced(),
                            };
                        }
                    }
                }
                // The step ran fewer ops than the graphs: what it ran matched, and was
                // never computed.
                let change = Difference::OpCount {
                    graph: tracer.matchers[tracer.leader].recording.traced_count(),
                    step: tracer.matched,
                };
                if let Err(stop) = tracer.diverge(change) {
                    return stop.into_traced();
                }
            }
            match tracer.diverged.clone() {
                None => unreachable!("a trace that matched no graph diverged above"),
                Some(change) => Traced::Diverged(change),
            }
        });
        drop(self);
        outcome
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        TRACER.with(|tracer| tracer.borrow_mut().take());
    }
}

/// Whether ops are being matched on this thread (a trace runs and still matches).
pub(crate) fn active() -> bool {
    TRACER.with(|tracer| {
        tracer
            .borrow()
            .as_ref()
            .is_some_and(|tracer| tracer.diverged.is_none())
    })
}

/// Whether ops are being matched by an observing trace: each matched op is committed
/// to the open sessions as well, with its stand-ins as its outputs.
pub(crate) fn observing() -> bool {
    TRACER.with(|tracer| {
        tracer
            .borrow()
            .as_ref()
            .is_some_and(|tracer| tracer.diverged.is_none() && tracer.observing)
    })
}

/// Data-parallel training, before the step's collective (the gradient average): the
/// ranks agree whether every rank's trace still matches. If one does not, every rank
/// goes on eagerly from here (the collective then runs on every rank); if all do, the
/// collective is matched as any op. Nothing happens on a thread without a rank's trace.
pub(crate) fn before_collective() -> Result<(), GroupFailed> {
    TRACER.with(|tracer| {
        let mut tracer = tracer.borrow_mut();
        let Some(tracer) = tracer.as_mut() else {
            return Ok(());
        };
        if !matches!(tracer.peers, Some((_, PeerPhase::BeforeCollective))) {
            return Ok(());
        }
        let matching = tracer.diverged.is_none();
        let (peers, phase) = tracer.peers.as_mut().expect("a rank's trace (above)");
        let differed = peers.agree(matching)?;
        *phase = if differed.is_none() {
            PeerPhase::AfterCollective
        } else {
            PeerPhase::Agreed
        };
        if let (Some(rank), true) = (differed, matching)
            && let Err(stop) = tracer.diverge(Difference::Peer { rank })
        {
            stop.unwind();
        }
        Ok(())
    })
}

/// Why a trace that stopped matching cannot go on in the closure: the payload the step
/// unwinds out of the closure with (`resume_unwind`: no panic hook, no message; the
/// trainer catches it at once). Nothing the trace ran is kept.
#[derive(Debug)]
pub(crate) enum Stop {
    /// It could not compute the values its stand-ins stand for (a recorded output it
    /// cannot fill): the step runs again eagerly.
    Unfilled(String),
    /// The step differed where differences stop the step ([`OnDifference::RunAgain`]):
    /// it runs again eagerly from its start.
    RunAgain(Difference),
}

impl Stop {
    /// Leaves the step closure.
    fn unwind(self) -> ! {
        std::panic::resume_unwind(Box::new(self))
    }

    /// How the trace came out.
    pub(crate) fn into_traced(self) -> Traced {
        match self {
            Stop::Unfilled(why) => Traced::Failed(why),
            Stop::RunAgain(change) => Traced::RunAgain(change),
        }
    }
}

/// One tensor an op reads: its key, and the tensor (kept if it is from outside).
pub(crate) type Input<'a> = (Option<Key>, &'a dyn AsValue);

/// An op's inputs in a trace, on the stack (ops have few).
pub(crate) type Inputs<'a> = smallvec::SmallVec<[Input<'a>; 4]>;

/// The recorder of an op: while a trace matches without observing, one that reads no
/// allocation ids (the trace names the inputs itself, and on the CUDA stacks an id costs
/// the server's memory lock and a `Debug` format).
pub(crate) fn recorder() -> OpRecorder {
    let unnamed = TRACER.with(|tracer| {
        tracer
            .borrow()
            .as_ref()
            .is_some_and(|tracer| tracer.diverged.is_none() && !tracer.observing)
    });
    if unnamed {
        OpRecorder::unnamed()
    } else {
        OpRecorder::default()
    }
}

/// `tensor` as an op's input in a trace.
pub(crate) fn input<T>(tensor: &T) -> Input<'_>
where
    T: burn_backend::TensorMetadata + super::identity::Allocated + Clone + Send + Sync + 'static,
{
    (super::emulated::program::key_of(tensor), tensor)
}

/// Matches one op that makes tensors: what `take` makes of its stand-ins if it is the
/// recorded op at its place with the same inputs, else `None` (the trace then stopped
/// matching, the recorded ops before it computed, and the op runs). `take` borrows the
/// recording's stand-ins: a handed-out stand-in is a clone of the recorded tensor, and
/// the recording's shared handles on them are not touched.
pub(crate) fn matched<R>(
    op: &'static str,
    record: &OpRecorder,
    breaker: Option<BreakerKind>,
    inputs: &[Input<'_>],
    take: impl FnOnce(&[StandInValue]) -> R,
) -> Option<R> {
    TRACER.with(|tracer| {
        let mut tracer = tracer.borrow_mut();
        let tracer = tracer.as_mut()?;
        if tracer.diverged.is_some() {
            return None;
        }
        match tracer.compare(op, record, breaker, inputs) {
            Ok(step) => {
                let traced = tracer.matchers[tracer.leader]
                    .recording
                    .traced(step)
                    .flatten()
                    .expect("the matched step is a traced one");
                Some(take(&traced.stand_ins))
            }
            Err(change) => {
                if let Err(stop) = tracer.diverge(change) {
                    stop.unwind();
                }
                None
            }
        }
    })
}

/// Output `index` of a matched op's stand-ins, as the op's output type.
pub(crate) fn hand_out<T: Clone + 'static>(stand_ins: &[StandInValue], index: usize) -> T {
    stand_ins[index]
        .value()
        .downcast_ref::<T>()
        .cloned()
        .expect("a matched op's stand-ins are of its output types")
}

/// An op that makes no tensor but must not be matched (a host read): the trace stops
/// matching before it.
pub(crate) fn unmatched(record: &OpRecord, breaker: Option<BreakerKind>) {
    TRACER.with(|tracer| {
        let mut tracer = tracer.borrow_mut();
        let Some(tracer) = tracer.as_mut() else {
            return;
        };
        if tracer.diverged.is_some() {
            return;
        }
        let change = match breaker {
            Some(kind) => Difference::Breaker(CaptureBreaker::new(kind, record.op)),
            None => Difference::OtherOp {
                index: tracer.matched,
                graph: "an op making tensors",
                step: record.op,
            },
        };
        if let Err(stop) = tracer.diverge(change) {
            stop.unwind();
        }
    });
}

impl Tracer {
    /// The leader's step for `op`, if `op`, `record` and `inputs` are the next recorded
    /// op of any graph still matching: graphs that differ here stop matching, and the
    /// first graph still matching leads. Every graph still matching learns which of its
    /// keys the leader's stand-ins stand for.
    fn compare(
        &mut self,
        op: &'static str,
        record: &OpRecorder,
        breaker: Option<BreakerKind>,
        inputs: &[Input<'_>],
    ) -> Result<usize, Difference> {
        if let Some(kind) = breaker {
            return Err(Difference::Breaker(CaptureBreaker::new(kind, op)));
        }
        let index = self.matched;
        let mut steps = self.matchers.iter_mut().map(|matcher| {
            if matcher.stopped.is_some() {
                return None;
            }
            matcher
                .compare(op, record, inputs, index)
                .map_err(|difference| matcher.stopped = Some(difference))
                .ok()
        });
        // Matchers are few (a shape's graphs): the steps are kept on the stack.
        let mut at = [None; MAX_CANDIDATES];
        for (slot, step) in at.iter_mut().zip(&mut steps) {
            *slot = step;
        }
        drop(steps);
        let Some(leader) = at.iter().position(Option::is_some) else {
            let leader = &self.matchers[self.leader];
            return Err(leader.stopped.clone().expect("the leader stopped matching"));
        };
        if leader != self.leader {
            self.former
                .push((self.leader, self.matchers[self.leader].next));
            self.leader = leader;
        }
        let step = at[leader].expect("the leader matched");
        let (before, rest) = self.matchers.split_at_mut(leader);
        let (lead, after) = rest.split_first_mut().expect("the leader is a matcher");
        // One count on the leader's recording per op, so that it lends its stand-ins
        // while the matchers change.
        let recording = Arc::clone(&lead.recording);
        let handed = &recording
            .traced(step)
            .flatten()
            .expect("a matched step is a traced one")
            .stand_ins;
        let others = before.iter_mut().chain(after.iter_mut());
        let others_at = at[..leader].iter().chain(&at[leader + 1..]);
        for (matcher, step) in others.zip(others_at) {
            if let Some(step) = *step {
                matcher.matched(step, handed);
            }
        }
        lead.next = step + 1;
        lead.matched_own(&recording, step, handed.iter().map(StandInValue::key));
        self.matched += 1;
        if let Some(keep_ready) = &self.keep_ready
            && self.matched.is_multiple_of(KEEP_READY_EVERY)
        {
            keep_ready();
        }
        Ok(step)
    }

    /// Stops matching at the current op: the recorded ops that each leader matched
    /// compute, and the stand-ins it handed out take what they computed; or, where
    /// differences stop the step, nothing computes and the step stops.
    fn diverge(&mut self, change: Difference) -> Result<(), Stop> {
        tracing::debug!(?change, "a trace stopped matching its graphs");
        // Past the collective, the peers learn it before the recorded ops compute it
        // again (with them).
        if !matches!(change, Difference::Peer { .. }) {
            self.agree_after_collective(false)
                .map_err(|failed| Stop::Unfilled(failed.to_string()))?;
        }
        self.diverged = Some(change.clone());
        if self.runs_again {
            // Before the collective, the peers learn it now: this rank's closure stops
            // here and never reaches the meeting point.
            if let Some((peers, phase @ PeerPhase::BeforeCollective)) = self.peers.as_mut() {
                *phase = PeerPhase::Agreed;
                peers
                    .agree(false)
                    .map_err(|failed| Stop::Unfilled(failed.to_string()))?;
            }
            return Err(Stop::RunAgain(change));
        }
        let leader = (self.leader, self.matchers[self.leader].next);
        for (index, until) in std::mem::take(&mut self.former).into_iter().chain([leader]) {
            let matcher = &mut self.matchers[index];
            let supplied = std::mem::take(&mut matcher.supplied);
            matcher
                .recording
                .fill_until(until, supplied.into_iter().collect())
                .map_err(|missing| Stop::Unfilled(missing.to_string()))?;
        }
        Ok(())
    }

    /// A rank past a matched collective tells its peers whether its trace matched to
    /// the end (`matching`) or stopped: the first rank that did not, if any. Once per
    /// step; nothing to agree on elsewhere.
    fn agree_after_collective(&mut self, matching: bool) -> Result<Option<usize>, GroupFailed> {
        match self.peers.as_mut() {
            Some((peers, phase)) if *phase == PeerPhase::AfterCollective => {
                *phase = PeerPhase::Agreed;
                peers.agree(matching)
            }
            _ => Ok(None),
        }
    }
}

impl Matcher {
    fn new(candidate: &Candidate) -> Self {
        // Sized for the recording at once: a step inserts about one key per op.
        let recording = Arc::clone(&candidate.recording.0);
        let ops = recording.traced_count();
        let mut stand_ins = FxHashMap::with_capacity_and_hasher(ops, Default::default());
        stand_ins.extend(candidate.aliases.iter().cloned());
        Self {
            recording,
            next: 0,
            stand_ins,
            latest: FxHashMap::with_capacity_and_hasher(ops, Default::default()),
            supplied: FxHashMap::default(),
            pins: candidate
                .pins
                .iter()
                .map(|pin| (pin.key().clone(), Arc::clone(pin)))
                .collect(),
            stopped: None,
        }
    }

    /// The next recorded op's step, if `op`, `record` and `inputs` are its; `index`
    /// counts the ops matched before.
    fn compare(
        &mut self,
        op: &'static str,
        record: &OpRecorder,
        inputs: &[Input<'_>],
        index: usize,
    ) -> Result<usize, Difference> {
        let mut step = self.next;
        let traced = loop {
            match self.recording.traced(step) {
                Some(Some(traced)) => break traced,
                Some(None) => step += 1,
                None => {
                    return Err(Difference::OpCount {
                        graph: self.recording.traced_count(),
                        step: index + 1,
                    });
                }
            }
        };
        let recorded = &traced.record;
        if recorded.op != op {
            return Err(Difference::OtherOp {
                index,
                graph: recorded.op,
                step: op,
            });
        }
        if recorded.inputs != record.inputs() {
            return Err(Difference::InputShapes { index, op });
        }
        if recorded.attrs != record.attrs() {
            return Err(Difference::HostValues { index, op });
        }
        if let Some(argument) = self.other_input(&traced.inputs, inputs) {
            return Err(Difference::OtherInput {
                index,
                op,
                argument,
            });
        }
        for (slot, (_, tensor)) in traced.inputs.iter().zip(inputs) {
            if let Some(slot) = slot.as_ref().filter(|slot| slot.generation() == 0) {
                self.supplied
                    .entry(slot.clone())
                    .or_insert_with(|| tensor.as_value());
            }
        }
        Ok(step)
    }

    /// Step `step` matched, and the step closure was handed `handed` (the leader's
    /// stand-ins) for its outputs.
    fn matched(&mut self, step: usize, handed: &[StandInValue]) {
        let recording = Arc::clone(&self.recording);
        self.matched_own(&recording, step, handed.iter().map(StandInValue::key));
        self.next = step + 1;
    }

    /// Notes the keys the step closure was handed for the outputs of `step` of
    /// `recording` (this matcher's): each stands for the output's slot, at its
    /// generation.
    fn matched_own<'k>(
        &mut self,
        recording: &Inner,
        step: usize,
        handed: impl Iterator<Item = Option<&'k Key>>,
    ) {
        let traced = recording
            .traced(step)
            .flatten()
            .expect("a matched step is a traced one");
        for (key, slot) in handed.zip(&traced.outputs) {
            if let (Some(key), Some(slot)) = (key, slot) {
                self.latest.insert(slot.key(), slot.generation());
                self.stand_ins.insert(key.clone(), slot.key());
            }
        }
    }

    /// The first argument that reads another value than the recorded op's `recorded`
    /// inputs: the same recorded key (a stand-in names the key it stands for) at the same
    /// generation, where generation 0 is a read from outside the step.
    fn other_input(&self, recorded: &[Option<Slot>], inputs: &[Input<'_>]) -> Option<usize> {
        let mismatch = |argument: usize| -> bool {
            // The key the input stands for now, and its generation, without building a
            // slot.
            let read = inputs
                .get(argument)
                .and_then(|(key, _)| key.as_ref())
                .map(|key| {
                    let key = self.stand_ins.get(key).unwrap_or(key);
                    (key, self.latest.get(key).copied().unwrap_or(0))
                });
            match (recorded.get(argument).and_then(Option::as_ref), read) {
                (Some(slot), Some((key, generation))) => {
                    !slot.is(key, generation) && !self.takes_pin(slot, &inputs[argument])
                }
                // The recording named no value here (an input without an id, or a
                // served draw's generator state): neither may the step read a value the
                // recording made or read from outside.
                (None, Some((key, generation))) => {
                    generation > 0 || self.recording.reads_outside(&Slot::new(key.clone(), 0))
                }
                (Some(_), None) => true,
                (None, None) => false,
            }
        };
        (0..recorded.len().max(inputs.len())).find(|&argument| mismatch(argument))
    }

    /// Whether `read`, where the recording read `slot`, is a constant that the pin the
    /// graph reads there now holds: the tensor it held, or another from outside the step
    /// that lies alike and was copied in (`ConstantPin::take`). A value of the step, or a
    /// tensor the recording reads from outside elsewhere (a parameter, a batch input),
    /// never is.
    fn takes_pin(&self, slot: &Slot, read: &Input<'_>) -> bool {
        if self.pins.is_empty() || slot.generation() != 0 {
            return false;
        }
        let (Some(key), tensor) = read else {
            return false;
        };
        let Some(pin) = self.pins.get(&slot.key()) else {
            return false;
        };
        let of_the_step = self.stand_ins.contains_key(key) || self.latest.contains_key(key);
        !of_the_step
            && !self.recording.reads_outside(&Slot::new(key.clone(), 0))
            && pin.take(key, *tensor)
    }
}
