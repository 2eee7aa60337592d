//! Per-input-shape lifecycle: warmup, then a graph, or eager with a reason.
//!
//! This is the trainer's decision logic with no backend calls in it, so every path,
//! including the ones only GPUs reach, is unit-tested on the CPU.

use std::collections::HashMap;

use super::guard;
use super::input::InputKey;
use super::mode::{FallbackReason, StepChange};
use super::paths::Paths;
use crate::backend::{CaptureBreaker, ExternalRead, OpSignature};

/// What one recorded step did, as far as graph decisions go.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Observation {
    /// Its op signature.
    pub(crate) signature: OpSignature,
    /// Its capture breakers.
    pub(crate) breakers: Vec<CaptureBreaker>,
    /// Its reads of allocations the trainer does not account for (`guard`).
    pub(crate) unaccounted: Vec<ExternalRead>,
    /// Whether its constants are known by their place in the step, not by allocation:
    /// steps whose graphs read them through pins that traced replays fill
    /// (`GraphBackend::pins_constants`).
    pub(crate) by_place: bool,
}

impl Observation {
    /// Why a step that did this cannot follow `previous` (the steps before it) into a
    /// graph: a breaker, another signature, or reads that are not constants.
    pub(crate) fn verdict(&self, previous: Option<&Observation>) -> Option<FallbackReason> {
        if let Some(breaker) = self.breakers.first() {
            return Some(FallbackReason::CaptureBreaker(breaker.clone()));
        }
        if let Some(first_difference) =
            previous.and_then(|p| p.signature.first_difference(&self.signature))
        {
            return Some(FallbackReason::NonStaticControlFlow { first_difference });
        }
        self.constants_after(previous).err()
    }

    /// Whether the reads of this step are constants after those of `previous`: by place
    /// where both know them so, else by allocation.
    fn constants_after(&self, previous: Option<&Observation>) -> Result<(), FallbackReason> {
        let before = previous.map(|previous| previous.unaccounted.as_slice());
        if self.by_place && previous.is_none_or(|previous| previous.by_place) {
            guard::check_constant_places(before, &self.unaccounted)
        } else {
            guard::check_constants(before, &self.unaccounted)
        }
    }

    /// What this step did differently from the graph that recorded `graph`, if
    /// anything: a breaker, the first op that differs (and how), or a tensor read from
    /// outside that is not the graph's (a constant replaced since the capture).
    pub(crate) fn change_from(&self, graph: &Observation) -> Option<StepChange> {
        if let Some(breaker) = self.breakers.first() {
            return Some(StepChange::Breaker(breaker.clone()));
        }
        if let Some(index) = graph.signature.first_difference(&self.signature) {
            let (recorded, now) = (graph.signature.ops(), self.signature.ops());
            return Some(match (recorded.get(index), now.get(index)) {
                (Some(recorded), Some(now)) if recorded.op != now.op => StepChange::OtherOp {
                    index,
                    graph: recorded.op.into(),
                    step: now.op.into(),
                },
                (Some(_), Some(now)) if recorded[index].inputs != now.inputs => {
                    StepChange::InputShapes {
                        index,
                        op: now.op.into(),
                    }
                }
                (Some(_), Some(now)) => StepChange::HostValues {
                    index,
                    op: now.op.into(),
                },
                _ => StepChange::OpCount {
                    graph: recorded.len(),
                    step: now.len(),
                },
            });
        }
        match self.constants_after(Some(graph)) {
            Err(FallbackReason::UnlistedInput { op, shape, dtype }) => {
                Some(StepChange::Read { op, shape, dtype })
            }
            _ => None,
        }
    }
}

/// A graph with what its step did when it was recorded.
pub(crate) trait Recorded {
    /// The recorded step's observation.
    fn observation(&self) -> &Observation;
}

/// Why a graph must match an eager step before it replays again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// The model was put back (`put_model`).
    ModelReplaced,
    /// It replayed `verify_every` times since it was last checked.
    Periodic,
}

impl Check {
    /// The mode reason of the eager step that checks it.
    fn reason(self) -> FallbackReason {
        match self {
            Check::ModelReplaced => FallbackReason::ModelReplaced,
            Check::Periodic => FallbackReason::ReplayCheck,
        }
    }
}

/// Where one input shape stands.
#[derive(Debug)]
pub(crate) enum Phase<G> {
    /// Eager warmup steps so far, and what they all did.
    Warming {
        done: usize,
        seen: Option<Observation>,
    },
    /// Warmup verified a static step; the next step may be captured if it does the same.
    Ready(Observation),
    /// A graph recorded for this shape, and the trainer step (the cache's clock) at
    /// which it was captured or last checked.
    Captured { graph: G, checked_at: u64 },
    /// A graph whose next step runs eagerly and must do what the graph recorded before
    /// the graph replays again.
    Suspect { graph: G, check: Check },
    /// This shape runs eagerly for `reason`: for good, or (`left`) for that many more
    /// steps, after which it warms up again (`CacheLimits::rewarm_after`).
    Disabled {
        reason: FallbackReason,
        left: Option<usize>,
    },
}

impl<G> Phase<G> {
    fn graph(&self) -> Option<&G> {
        match self {
            Phase::Captured { graph, .. } | Phase::Suspect { graph, .. } => Some(graph),
            _ => None,
        }
    }
}

/// One input shape: its phase, when it was last planned, how often its warmup started
/// over, and how often it was made eager, since it last got a graph.
#[derive(Debug)]
struct Entry<G> {
    phase: Phase<G>,
    used: u64,
    restarts: usize,
    disables: u32,
    /// The shape's graphs of other paths of the step closure (a host branch), most
    /// recently matched first: a trace picks among them and the phase's graph.
    branches: Branches<G>,
    /// Paths its warmup saw besides the one it counts now.
    paths: Paths<Observation>,
}

/// The graphs a shape keeps for paths of its step other than the one it warms up or
/// replays, and how trying for a new path goes.
#[derive(Debug)]
struct Branches<G> {
    graphs: Vec<G>,
    /// Steps spent warming up and capturing the new path.
    tries: usize,
    /// Steps that differ from every graph to run eagerly, graphs kept, before a new
    /// path is tried again.
    wait: usize,
    /// Times trying for a new path gave up since the shape last got a graph.
    gave_up: u32,
}

impl<G> Branches<G> {
    fn new() -> Self {
        Self {
            graphs: Vec::new(),
            tries: 0,
            wait: 0,
            gave_up: 0,
        }
    }
}

/// Whether a path whose steps did what the argument did is the one `step` took.
fn took(step: &Observation) -> impl Fn(&Observation) -> bool + '_ {
    move |path| step.verdict(Some(path)).is_none()
}

/// Steps a shape with graphs spends warming up and capturing a new path before it
/// gives up and replays the paths it has.
const BRANCH_TRIES: usize = 64;

/// Steps that differ from every graph of a shape, run eagerly, before it tries for a
/// new path again after giving up once (doubled at each repeat, up to [`MAX_BACKOFF`]
/// times).
const BRANCH_WAIT: usize = 8;

impl<G> Entry<G> {
    fn new(used: u64) -> Self {
        Self {
            phase: placeholder(),
            used,
            restarts: 0,
            disables: 0,
            branches: Branches::new(),
            paths: Paths::default(),
        }
    }

    /// Whether `step` took the path of one of the shape's branches.
    fn has_graph_for(&self, step: &Observation) -> bool
    where
        G: Recorded,
    {
        self.branches
            .graphs
            .iter()
            .any(|graph| step.change_from(graph.observation()).is_none())
    }

    /// Graphs alive for this shape.
    fn graphs(&self) -> usize {
        usize::from(self.phase.graph().is_some()) + self.branches.graphs.len()
    }

    /// Stops trying for a new path: the most recently matched graph replays again, and
    /// the next steps that differ from every graph run eagerly for a wait that doubles
    /// each time. False if there is no graph to go back to.
    fn give_up_branch(&mut self) -> bool {
        if self.branches.graphs.is_empty() {
            return false;
        }
        let graph = self.branches.graphs.remove(0);
        let doubling = self.branches.gave_up.min(MAX_BACKOFF.trailing_zeros());
        self.branches.gave_up = self.branches.gave_up.saturating_add(1);
        self.branches.wait = BRANCH_WAIT << doubling;
        self.branches.tries = 0;
        self.phase = Phase::Captured {
            graph,
            checked_at: self.used,
        };
        tracing::debug!(
            wait = self.branches.wait,
            "a new path did not graph; the shape replays the paths it has"
        );
        true
    }

    /// Makes the shape eager for `reason`, for a wait that doubles with every time it
    /// was made eager since its last graph, up to [`MAX_BACKOFF`] times `rewarm_after`
    /// (`0`: for good).
    fn disable(&mut self, reason: FallbackReason, rewarm_after: usize) {
        let doubling = self.disables.min(MAX_BACKOFF.trailing_zeros());
        self.disables = self.disables.saturating_add(1);
        let left = (rewarm_after > 0).then(|| rewarm_after.saturating_mul(1 << doubling));
        self.phase = Phase::Disabled { reason, left };
        self.branches.graphs.clear();
        self.paths.clear();
    }
}

/// What the trainer should do for one step.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Run eagerly inside a capture session and report the observation.
    Warmup,
    /// Run eagerly, for this reason.
    Eager(FallbackReason),
    /// Capture this step into a graph.
    Capture,
    /// Replay this shape's graph.
    Replay,
    /// Trace the step against the shape's graphs, each recorded on another path of the
    /// step closure, and replay the one it matches; a step that matches none runs
    /// eagerly, observed, as a warmup step of its new path.
    Branch,
    /// Run as the first warmup step of a shape whose graph was just dropped, for this
    /// reason (a constant it reads is gone).
    Rewarm(FallbackReason),
    /// Run eagerly inside a session and compare with the shape's graph; the step's mode
    /// reason, if it matches.
    Verify(FallbackReason),
}

/// How a [`GraphCache`] decides.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CacheLimits {
    /// Most graphs alive at once; the least recently used one makes room for another.
    pub(crate) max_graphs: usize,
    /// Eager steps per shape before its capture.
    pub(crate) warmup_steps: usize,
    /// Times a shape's warmup may start over (a step unlike the ones before) before the
    /// shape stays eager.
    pub(crate) max_restarts: usize,
    /// Replays between two checks of a graph against an eager step; 0: never.
    pub(crate) verify_every: usize,
    /// Eager steps of a shape made eager for a reason before it warms up again (doubled
    /// at each repeat, up to [`MAX_BACKOFF`] times); 0: eager for good.
    pub(crate) rewarm_after: usize,
}

/// The longest wait of a shape made eager, in multiples of `rewarm_after`.
const MAX_BACKOFF: usize = 32;

/// Shapes without a graph remembered at most: beyond it, the least recently used of
/// them is forgotten (and warms up again if it comes back).
const MAX_SHAPES_WITHOUT_GRAPH: usize = 64;

/// A phase to hold while the real one is moved out.
fn placeholder<G>() -> Phase<G> {
    Phase::Warming {
        done: 0,
        seen: None,
    }
}

/// The graphs of one trainer, keyed by input shape, bounded in number.
#[derive(Debug)]
pub(crate) struct GraphCache<G> {
    entries: HashMap<InputKey, Entry<G>>,
    limits: CacheLimits,
    /// Counts plans, to find the least recently used shape.
    clock: u64,
    /// Graphs dropped to make room for another shape's.
    evictions: usize,
    /// Times a shape made eager warmed up again.
    rewarms: usize,
}

impl<G: Recorded> GraphCache<G> {
    pub(crate) fn new(limits: CacheLimits) -> Self {
        Self {
            entries: HashMap::new(),
            limits: CacheLimits {
                warmup_steps: limits.warmup_steps.max(1),
                ..limits
            },
            clock: 0,
            evictions: 0,
            rewarms: 0,
        }
    }

    /// Decides how the step for `key` runs. `hardware` tells whether graphs exist.
    pub(crate) fn plan(&mut self, key: &InputKey, hardware: bool) -> Plan {
        self.clock += 1;
        if !self.entries.contains_key(key) {
            self.forget_one_without_graph();
            self.entries.insert(key.clone(), Entry::new(0));
        }
        let verify_every = self.limits.verify_every;
        let entry = self.entries.get_mut(key).expect("inserted above");
        entry.used = self.clock;
        if let Phase::Disabled {
            left: Some(left), ..
        } = &mut entry.phase
        {
            if *left == 0 {
                tracing::debug!(?key, "a shape made eager warms up again");
                entry.phase = placeholder();
                entry.restarts = 0;
                self.rewarms += 1;
            } else {
                *left -= 1;
            }
        }
        // Counted in the trainer's steps, not the shape's replays: a shape seen once an
        // epoch (a partial last batch) is checked as often as the frequent ones.
        if let Phase::Captured { checked_at, .. } = &entry.phase
            && verify_every > 0
            && self.clock - *checked_at > verify_every as u64
            && let Phase::Captured { graph, .. } =
                std::mem::replace(&mut entry.phase, placeholder())
        {
            let check = Check::Periodic;
            entry.phase = Phase::Suspect { graph, check };
        }
        match &mut entry.phase {
            Phase::Warming { .. } if !entry.branches.graphs.is_empty() => Plan::Branch,
            Phase::Warming { .. } => Plan::Warmup,
            Phase::Ready(_) if !hardware => Plan::Eager(FallbackReason::NoHardwareGraphs),
            Phase::Ready(_) => self.make_room(key),
            Phase::Captured { .. } => Plan::Replay,
            Phase::Suspect { check, .. } => Plan::Verify(check.reason()),
            Phase::Disabled { reason, .. } => Plan::Eager(reason.clone()),
        }
    }

    /// A capture for `key`, once a graph slot is free: the least recently used other
    /// graph is dropped when all are taken (its shape captures again when it comes back).
    fn make_room(&mut self, key: &InputKey) -> Plan {
        if self.limits.max_graphs == 0 {
            return Plan::Eager(FallbackReason::GraphCacheFull);
        }
        if self.graphs_alive() >= self.limits.max_graphs
            && let Some(entry) = self.entries.get_mut(key)
            && entry.branches.graphs.pop().is_some()
        {
            tracing::debug!(
                ?key,
                "graph cache full: the shape's least recently matched path makes room"
            );
            self.evictions += 1;
        }
        if self.graphs_alive() >= self.limits.max_graphs {
            let victim = self
                .entries
                .iter()
                .filter(|(other, entry)| *other != key && entry.graphs() > 0)
                .min_by_key(|(_, entry)| entry.used)
                .map(|(other, _)| other.clone());
            if let Some(victim) = victim {
                tracing::debug!(key = ?victim, "graph cache full: the least recently used graph makes room");
                self.drop_graph(&victim);
                self.evictions += 1;
            }
        }
        Plan::Capture
    }

    /// Forgets the least recently used shape without a graph, if too many are kept.
    fn forget_one_without_graph(&mut self) {
        let without = || self.entries.iter().filter(|(_, entry)| entry.graphs() == 0);
        if without().count() < MAX_SHAPES_WITHOUT_GRAPH {
            return;
        }
        let oldest = without()
            .min_by_key(|(_, entry)| entry.used)
            .map(|(key, _)| key.clone());
        if let Some(oldest) = oldest {
            self.entries.remove(&oldest);
        }
    }

    /// Counts a step of `key` that took a path unlike the one its warmup counts now.
    /// A path the warmup saw before is counted on (several paths may come in any
    /// order); a new one starts the warmup over from this step, so that work done once
    /// (a constant built lazily on first use, an anchor that parts from the trainer's
    /// buffers after the first update) settles. After `max_restarts` new paths the
    /// shape gives up: it replays the graphs it has, or stays eager for `reason`. A step
    /// that cannot be graphed itself (a breaker) starts the warmup over empty.
    fn restart(&mut self, key: &InputKey, step: Observation, reason: FallbackReason) {
        let (warmup_steps, max_restarts) = (self.limits.warmup_steps, self.limits.max_restarts);
        let rewarm_after = self.limits.rewarm_after;
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let current = match std::mem::replace(&mut entry.phase, placeholder()) {
            Phase::Warming {
                done,
                seen: Some(seen),
            } => Some((seen, done)),
            Phase::Ready(seen) => Some((seen, warmup_steps)),
            _ => None,
        };
        let graphable = step.verdict(None).is_none();
        let taken = graphable.then(|| entry.paths.take(took(&step))).flatten();
        if let Some((seen, done)) = current {
            entry.paths.remember(seen, done);
        }
        let done = match taken {
            Some(before) => before + 1,
            None => {
                entry.restarts += 1;
                if entry.restarts > max_restarts {
                    if !entry.give_up_branch() {
                        entry.disable(reason, rewarm_after);
                    }
                    return;
                }
                // Counted as a warmup step, except where it would be the last of the
                // only path seen: the last one must run on the pins
                // (`Graphs::rehearsal_inputs`), which every step of a shape with
                // several paths does.
                if entry.paths.is_empty() {
                    1.min(warmup_steps - 1)
                } else {
                    1
                }
            }
        };
        entry.phase = match graphable {
            true if done >= warmup_steps => Phase::Ready(step),
            true => Phase::Warming {
                done,
                seen: Some(step),
            },
            false => placeholder(),
        };
    }

    /// Records a warmup step. Returns the reason it did not count as one, if it did
    /// not: it took another path than the steps before, started the shape's warmup over,
    /// or disabled the shape. Beside graphs of other paths, a step of one of those does
    /// not count, and the shape gives up after [`BRANCH_TRIES`] steps.
    pub(crate) fn warmed(&mut self, key: &InputKey, step: Observation) -> Option<FallbackReason> {
        self.warm(key, step, false)
    }

    /// [`warmed`](Self::warmed), for a step that a trace matched against every graph of
    /// `key` and found none of: a path of its own, even where its ops look like a
    /// graph's (the same ops reading another view of one tensor, or another tensor of
    /// one shape).
    pub(crate) fn warmed_unmatched(
        &mut self,
        key: &InputKey,
        step: Observation,
    ) -> Option<FallbackReason> {
        self.warm(key, step, true)
    }

    fn warm(
        &mut self,
        key: &InputKey,
        step: Observation,
        unmatched: bool,
    ) -> Option<FallbackReason> {
        let warmup_steps = self.limits.warmup_steps;
        let entry = self.entries.get_mut(key)?;
        if !matches!(entry.phase, Phase::Warming { .. }) {
            return None;
        }
        if !entry.branches.graphs.is_empty() {
            entry.branches.tries += 1;
            if entry.branches.tries >= BRANCH_TRIES {
                entry.give_up_branch();
                return None;
            }
            if !unmatched && entry.has_graph_for(&step) {
                return None;
            }
        }
        let Phase::Warming { done, seen } = &mut entry.phase else {
            unreachable!("warming: checked above");
        };
        match step.verdict(seen.as_ref()) {
            None => {
                *done += 1;
                if *done >= warmup_steps {
                    entry.phase = Phase::Ready(step);
                } else {
                    *seen = Some(step);
                }
                None
            }
            Some(reason) => {
                self.restart(key, step, reason.clone());
                Some(reason)
            }
        }
    }

    /// Whether the next step of `key` may be its last warmup step (the one before
    /// capture), and so must run on the pins: where several paths were seen, any step.
    pub(crate) fn last_warmup(&self, key: &InputKey) -> bool {
        matches!(
            self.entries.get(key),
            Some(Entry { phase: Phase::Warming { done, .. }, branches, paths, .. })
                if done + 1 >= self.limits.warmup_steps
                    || !branches.graphs.is_empty()
                    || !paths.is_empty()
        )
    }

    /// Why the step a capture of `key` recorded cannot stand for later steps: `None`
    /// where it took the path warmup made ready, or another path warmup saw recur as
    /// often (a host branch took it this time), and no branch has that path's graph.
    pub(crate) fn capture_verdict(
        &self,
        key: &InputKey,
        step: &Observation,
    ) -> Option<FallbackReason> {
        let entry = self.entries.get(key);
        let ready = match entry.map(|entry| &entry.phase) {
            Some(Phase::Ready(seen)) => Some(seen),
            _ => None,
        };
        let verdict = step.verdict(ready)?;
        let recurred = entry.is_some_and(|entry| {
            entry.paths.recurs(took(step), self.limits.warmup_steps) && !entry.has_graph_for(step)
        });
        (!recurred).then_some(verdict)
    }

    /// What the warmup steps of `key` did, once it is ready for capture.
    #[cfg(test)]
    pub(crate) fn warmed_up(&self, key: &InputKey) -> Option<&Observation> {
        match self.entries.get(key).map(|entry| &entry.phase) {
            Some(Phase::Ready(seen)) => Some(seen),
            _ => None,
        }
    }

    /// Stores the graph captured for `key`; its warmup restarts are forgiven. A graph
    /// the shape already has (a data-parallel capture kept unlaunched) moves into its
    /// branches; the path warmup made ready, where the capture took another, is
    /// remembered as warmed up.
    pub(crate) fn captured(&mut self, key: &InputKey, graph: G) {
        let used = self.clock;
        let warmup_steps = self.limits.warmup_steps;
        let entry = self.entries.entry(key.clone()).or_insert(Entry::new(used));
        entry.paths.take(took(graph.observation()));
        let other_path = |seen: &Observation| graph.observation().verdict(Some(seen)).is_some();
        match std::mem::replace(&mut entry.phase, placeholder()) {
            Phase::Captured { graph, .. } | Phase::Suspect { graph, .. } => {
                entry.branches.graphs.insert(0, graph);
            }
            Phase::Ready(seen) if other_path(&seen) => entry.paths.remember(seen, warmup_steps),
            _ => {}
        }
        entry.phase = Phase::Captured {
            graph,
            checked_at: used,
        };
        entry.restarts = 0;
        entry.disables = 0;
        entry.branches.tries = 0;
        entry.branches.gave_up = 0;
    }

    /// A capture of `key` whose recorded step took a path warmup did not make ready:
    /// counted as a warmup step of that path, after which the shape is ready again
    /// for the path it was ready for (the step closure takes it when it takes it). A
    /// step of a path a branch has a graph for counts towards giving up.
    pub(crate) fn capture_differed(
        &mut self,
        key: &InputKey,
        step: Observation,
        reason: FallbackReason,
    ) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let Phase::Ready(ready) = &entry.phase else {
            return self.restart(key, step, reason);
        };
        if !entry.branches.graphs.is_empty() {
            entry.branches.tries += 1;
            if entry.branches.tries >= BRANCH_TRIES {
                entry.give_up_branch();
                return;
            }
            if entry.has_graph_for(&step) {
                return;
            }
        }
        let ready = ready.clone();
        self.restart(key, step, reason);
        // The path made ready stays ready (remembered by the restart at its length).
        if let Some(entry) = self.entries.get_mut(key)
            && let Phase::Warming { seen: Some(_), .. } = entry.phase
            && entry.paths.take(took(&ready)).is_some()
        {
            let Phase::Warming {
                done,
                seen: Some(seen),
            } = std::mem::replace(&mut entry.phase, Phase::Ready(ready))
            else {
                unreachable!("warming on a path: checked above");
            };
            entry.paths.remember(seen, done);
        }
    }

    /// A trace of `key` matched its graph `index` (in [`graphs`](Self::graphs)'
    /// order): that graph becomes the one replayed and traced first.
    pub(crate) fn matched(&mut self, key: &InputKey, index: usize) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let branches = &mut entry.branches.graphs;
        match &mut entry.phase {
            Phase::Captured { graph: current, .. } if (1..=branches.len()).contains(&index) => {
                let graph = std::mem::replace(current, branches.remove(index - 1));
                branches.insert(0, graph);
            }
            Phase::Captured { .. } => {}
            _ if index < branches.len() => {
                let graph = branches.remove(index);
                branches.insert(0, graph);
            }
            _ => {}
        }
    }

    /// A step of `key` differed from every graph of the shape and ran eagerly: the
    /// graphs stay (a host branch takes their paths again) and the shape warms up the
    /// new path beside them; while it waits after giving up on one, nothing changes.
    pub(crate) fn branch(&mut self, key: &InputKey) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if entry.branches.wait > 0 {
            entry.branches.wait -= 1;
            return;
        }
        if let Phase::Captured { graph, .. } = std::mem::replace(&mut entry.phase, placeholder()) {
            entry.branches.graphs.insert(0, graph);
        }
        entry.branches.tries = 0;
        entry.restarts = 0;
    }

    /// The graphs of `key` a trace chooses among: the graph it replays first, then the
    /// branches, most recently matched first.
    pub(crate) fn graphs(&self, key: &InputKey) -> Vec<&G> {
        let Some(entry) = self.entries.get(key) else {
            return Vec::new();
        };
        let current = match &entry.phase {
            Phase::Captured { graph, .. } => Some(graph),
            _ => None,
        };
        current.into_iter().chain(&entry.branches.graphs).collect()
    }

    /// The graph a replay of `key` launches unless a trace picks another: the one it
    /// replays, or while it warms up a new path, its most recently matched branch.
    pub(crate) fn first(&self, key: &InputKey) -> Option<&G> {
        let entry = self.entries.get(key)?;
        match &entry.phase {
            Phase::Captured { graph, .. } => Some(graph),
            _ => entry.branches.graphs.first(),
        }
    }

    /// Records a verifying step of a suspect graph: the graph replays again when the
    /// step did what it recorded; otherwise it is dropped, the step counts as the first
    /// warmup step of a new graph, and the reason says what changed.
    pub(crate) fn verified(&mut self, key: &InputKey, step: Observation) -> Option<FallbackReason> {
        // A shape whose graph was dropped meanwhile keeps the phase it has now.
        let entry = self.entries.get_mut(key)?;
        if !matches!(entry.phase, Phase::Suspect { .. }) {
            return None;
        }
        let Phase::Suspect { graph, .. } = std::mem::replace(&mut entry.phase, placeholder())
        else {
            unreachable!("a suspect graph: checked above");
        };
        let Some(change) = step
            .change_from(graph.observation())
            .filter(|_| !entry.has_graph_for(&step))
        else {
            entry.phase = Phase::Captured {
                graph,
                checked_at: self.clock,
            };
            return None;
        };
        drop(graph);
        entry.restarts = 0;
        let reason = FallbackReason::GraphStale { change };
        self.restart(key, step, reason.clone());
        Some(reason)
    }

    /// Drops the graph of `key`, which no longer records the step: the shape warms up
    /// from its next step on, as a new shape would.
    pub(crate) fn stale(&mut self, key: &InputKey) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.phase = placeholder();
            entry.restarts = 0;
            entry.branches.graphs.clear();
            entry.paths.clear();
        }
    }

    /// Makes `key` eager for `reason`, until it warms up again (`rewarm_after`).
    pub(crate) fn disable(&mut self, key: &InputKey, reason: FallbackReason) {
        let used = self.clock;
        let rewarm_after = self.limits.rewarm_after;
        let entry = self.entries.entry(key.clone()).or_insert(Entry::new(used));
        entry.disable(reason, rewarm_after);
    }

    /// The graph for `key`, if one was captured.
    pub(crate) fn graph(&self, key: &InputKey) -> Option<&G> {
        match self.entries.get(key).map(|entry| &entry.phase) {
            Some(Phase::Captured { graph, .. }) => Some(graph),
            _ => None,
        }
    }

    /// Marks every graph suspect: each must match an eager step before it replays.
    pub(crate) fn suspect_graphs(&mut self) {
        for entry in self.entries.values_mut() {
            entry.branches.graphs.clear();
            entry.phase = match std::mem::replace(&mut entry.phase, placeholder()) {
                Phase::Captured { graph, .. } | Phase::Suspect { graph, .. } => Phase::Suspect {
                    graph,
                    check: Check::ModelReplaced,
                },
                other => other,
            };
        }
    }

    /// Drops the graph of `key`, if it has one: its next step captures again.
    pub(crate) fn drop_graph(&mut self, key: &InputKey) {
        if let Some(entry) = self.entries.get_mut(key) {
            entry.branches.graphs.clear();
            if let Some(graph) = entry.phase.graph() {
                entry.phase = Phase::Ready(graph.observation().clone());
            }
        }
    }

    /// Drops every graph; their shapes get captured again at their next step.
    pub(crate) fn drop_graphs(&mut self) {
        for entry in self.entries.values_mut() {
            entry.branches.graphs.clear();
            if let Some(graph) = entry.phase.graph() {
                entry.phase = Phase::Ready(graph.observation().clone());
            }
        }
    }

    /// Drops every graph and sends each shape that had one, or was ready for one, back
    /// to its last warmup step: the pins they would use are gone, and the next ones
    /// must be rehearsed on before a capture (`Graphs::rehearsal_inputs`).
    pub(crate) fn rewarm(&mut self) {
        let last = self.limits.warmup_steps - 1;
        for entry in self.entries.values_mut() {
            entry.branches.graphs.clear();
            let observation = match &entry.phase {
                Phase::Captured { graph, .. } | Phase::Suspect { graph, .. } => {
                    graph.observation().clone()
                }
                Phase::Ready(observation) => observation.clone(),
                _ => continue,
            };
            entry.phase = Phase::Warming {
                done: last,
                seen: Some(observation),
            };
        }
    }

    /// Forgets every shape (dropping all graphs): each warms up again at its next step.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// Makes every shape eager for `reason` (dropping all graphs), each until it warms
    /// up again (`rewarm_after`).
    pub(crate) fn disable_all(&mut self, reason: FallbackReason) {
        let rewarm_after = self.limits.rewarm_after;
        for entry in self.entries.values_mut() {
            entry.disable(reason.clone(), rewarm_after);
        }
    }

    /// Number of graphs alive.
    pub(crate) fn graphs_alive(&self) -> usize {
        self.entries.values().map(Entry::graphs).sum()
    }

    /// Graphs dropped so far to make room for another shape's.
    pub(crate) fn evictions(&self) -> usize {
        self.evictions
    }

    /// Times a shape made eager warmed up again.
    pub(crate) fn rewarms(&self) -> usize {
        self.rewarms
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{DType, Shape};

    use super::*;
    use crate::backend::{AllocationId, BreakerKind, CaptureSession, Recording, TensorSig};

    /// A stand-in graph: a name and the observation it was recorded with.
    #[derive(Debug, PartialEq)]
    struct Fake(&'static str, Observation);

    impl Recorded for Fake {
        fn observation(&self) -> &Observation {
            &self.1
        }
    }

    /// Limits with `max_graphs` and `warmup_steps`, 3 restarts, no periodic checks, and
    /// shapes made eager stay eager.
    fn limits(max_graphs: usize, warmup_steps: usize) -> CacheLimits {
        CacheLimits {
            max_graphs,
            warmup_steps,
            max_restarts: 3,
            verify_every: 0,
            rewarm_after: 0,
        }
    }

    /// Plans `steps` steps of `key` and asserts each is eager for `reason`.
    fn eager_for(
        cache: &mut GraphCache<Fake>,
        key: &InputKey,
        steps: usize,
        reason: &FallbackReason,
    ) {
        for step in 0..steps {
            assert_eq!(
                cache.plan(key, true),
                Plan::Eager(reason.clone()),
                "step {step}"
            );
        }
    }

    fn key(batch: usize) -> InputKey {
        InputKey::of_shapes([Shape::new([batch, 3])])
    }

    /// An observation of `ops` dummy ops (a signature of that length), reading `reads`.
    fn observed(ops: usize, reads: &[u64]) -> Observation {
        let (_, recording) = CaptureSession::record(|| {
            for _ in 0..ops {
                crate::backend::session::record_op("op", None, |_| {});
            }
        });
        let unaccounted = reads
            .iter()
            .map(|&id| ExternalRead {
                allocation: Some(AllocationId::unique(id)),
                op: "int_reshape",
                tensor: TensorSig {
                    shape: Shape::new([4]),
                    dtype: DType::I64,
                },
            })
            .collect();
        Observation {
            signature: recording.signature,
            breakers: recording.breakers,
            unaccounted,
            by_place: false,
        }
    }

    fn warm(cache: &mut GraphCache<Fake>, key: &InputKey, steps: usize) {
        warm_reading(cache, key, steps, &[9]);
    }

    fn warm_reading(cache: &mut GraphCache<Fake>, key: &InputKey, steps: usize, reads: &[u64]) {
        for _ in 0..steps {
            assert_eq!(cache.plan(key, true), Plan::Warmup);
            assert_eq!(cache.warmed(key, observed(2, reads)), None);
        }
    }

    fn capture(cache: &mut GraphCache<Fake>, key: &InputKey, name: &'static str) {
        assert_eq!(cache.plan(key, true), Plan::Capture);
        let seen = cache.warmed_up(key).unwrap().clone();
        cache.captured(key, Fake(name, seen));
    }

    /// A cache of `limits` whose shape `key(8)` has graph "a", captured after its warmup.
    fn graphed(limits: CacheLimits) -> GraphCache<Fake> {
        let warmup = limits.warmup_steps;
        let mut cache = GraphCache::new(limits);
        warm(&mut cache, &key(8), warmup);
        capture(&mut cache, &key(8), "a");
        cache
    }

    #[test]
    fn warmup_then_capture_then_replay() {
        let mut cache = GraphCache::new(limits(4, 3));
        warm(&mut cache, &key(8), 3);
        capture(&mut cache, &key(8), "graph");
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);
        assert_eq!(cache.graph(&key(8)).unwrap().0, "graph");
        assert_eq!(cache.graphs_alive(), 1);
    }

    #[test]
    fn without_hardware_a_ready_shape_says_so() {
        let mut cache = GraphCache::<Fake>::new(limits(4, 1));
        assert_eq!(cache.plan(&key(8), false), Plan::Warmup);
        cache.warmed(&key(8), observed(1, &[]));
        assert_eq!(
            cache.plan(&key(8), false),
            Plan::Eager(FallbackReason::NoHardwareGraphs)
        );
    }

    #[test]
    fn a_full_cache_drops_its_least_recently_used_graph_for_a_new_one() {
        let mut cache = graphed(limits(2, 1));
        warm(&mut cache, &key(4), 1);
        capture(&mut cache, &key(4), "b");
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Replay,
            "8 is now the newer"
        );
        warm(&mut cache, &key(2), 1);
        capture(&mut cache, &key(2), "c");
        assert_eq!(cache.graphs_alive(), 2);
        assert_eq!(cache.evictions(), 1);
        assert_eq!(cache.graph(&key(4)), None, "the least recently used went");
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);
        assert_eq!(
            cache.plan(&key(4), true),
            Plan::Capture,
            "an evicted shape captures again without warming up"
        );
    }

    #[test]
    fn shapes_without_a_graph_hold_no_slot() {
        let mut cache = GraphCache::new(limits(1, 2));
        // A ragged shape seen once, and one that never settles, before the frequent one.
        warm(&mut cache, &key(3), 1);
        cache.disable(&key(5), FallbackReason::RecaptureLimit);
        warm(&mut cache, &key(8), 2);
        capture(&mut cache, &key(8), "frequent");
        assert_eq!(cache.evictions(), 0);
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);
    }

    #[test]
    fn no_graph_slot_at_all_is_a_full_cache() {
        let mut cache = GraphCache::<Fake>::new(limits(0, 1));
        warm(&mut cache, &key(8), 1);
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Eager(FallbackReason::GraphCacheFull)
        );
    }

    #[test]
    fn shapes_without_a_graph_are_forgotten_beyond_their_bound() {
        let mut cache = GraphCache::<Fake>::new(limits(1, 2));
        for batch in 0..=MAX_SHAPES_WITHOUT_GRAPH {
            warm(&mut cache, &key(100 + batch), 1);
        }
        assert_eq!(cache.entries.len(), MAX_SHAPES_WITHOUT_GRAPH);
        assert!(!cache.entries.contains_key(&key(100)), "the oldest went");
        assert_eq!(
            cache.plan(&key(100), true),
            Plan::Warmup,
            "and warms up again"
        );
    }

    #[test]
    fn a_differing_warmup_step_starts_the_warmup_over_a_bounded_number_of_times() {
        let mut cache = GraphCache::<Fake>::new(limits(4, 3));
        cache.plan(&key(8), true);
        assert_eq!(cache.warmed(&key(8), observed(2, &[])), None);
        // Three restarts, each with a step of a new path as the new first warmup step.
        for ops in [3, 4, 5] {
            assert_eq!(cache.plan(&key(8), true), Plan::Warmup);
            let reason = cache.warmed(&key(8), observed(ops, &[])).unwrap();
            assert_eq!(reason.kind(), "NonStaticControlFlow");
        }
        assert_eq!(cache.plan(&key(8), true), Plan::Warmup);
        let reason = FallbackReason::NonStaticControlFlow {
            first_difference: 5,
        };
        assert_eq!(
            cache.warmed(&key(8), observed(6, &[])),
            Some(reason.clone()),
            "the fourth new path disables the shape"
        );
        assert_eq!(cache.plan(&key(8), true), Plan::Eager(reason));
    }

    #[test]
    fn a_step_done_once_settles_after_a_restart() {
        let mut cache = GraphCache::<Fake>::new(limits(4, 3));
        // Step 1 builds a constant inside the step (more ops); later steps read it.
        cache.plan(&key(8), true);
        assert_eq!(cache.warmed(&key(8), observed(5, &[])), None);
        cache.plan(&key(8), true);
        assert!(cache.warmed(&key(8), observed(2, &[7])).is_some());
        warm_reading(&mut cache, &key(8), 2, &[7]);
        assert_eq!(cache.plan(&key(8), true), Plan::Capture);
    }

    #[test]
    fn a_restart_never_skips_the_rehearsed_last_warmup_step() {
        let mut cache = GraphCache::<Fake>::new(limits(4, 2));
        warm_reading(&mut cache, &key(8), 1, &[1]);
        // A step unlike the first: the warmup starts over with it, and the step after it
        // is the last warmup step before the capture, run on the pins.
        cache.plan(&key(8), true);
        assert!(cache.warmed(&key(8), observed(3, &[1])).is_some());
        assert!(cache.last_warmup(&key(8)));
    }

    #[test]
    fn paths_taken_in_any_order_each_warm_up_and_a_capture_may_take_any_that_recurred() {
        let mut cache = GraphCache::<Fake>::new(limits(4, 3));
        let (a, b, c) = (observed(2, &[]), observed(3, &[]), observed(4, &[]));
        // Two paths interleaved: each counts on; neither restarts the warmup for good.
        for (index, step) in [&a, &b, &a, &b].into_iter().enumerate() {
            assert_eq!(cache.plan(&key(8), true), Plan::Warmup);
            cache.warmed(&key(8), step.clone());
            // Once two paths were seen, every step may end the warmup.
            assert_eq!(cache.last_warmup(&key(8)), index > 0);
        }
        assert_eq!(cache.plan(&key(8), true), Plan::Warmup);
        // Another path than the step before: said so, and counted on.
        assert!(cache.warmed(&key(8), a.clone()).is_some());
        assert_eq!(cache.plan(&key(8), true), Plan::Capture, "a took 3 steps");
        // The capture took b, which recurred as often with this step: it graphs.
        assert_eq!(cache.capture_verdict(&key(8), &b), None);
        // A new path is no graph for it: counted as its first step, a still ready.
        assert!(cache.capture_verdict(&key(8), &c).is_some());
        cache.capture_differed(&key(8), c.clone(), FallbackReason::Warmup);
        assert_eq!(cache.plan(&key(8), true), Plan::Capture);
        assert_eq!(cache.capture_verdict(&key(8), &a), None);
        cache.captured(&key(8), Fake("a", a.clone()));
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);
    }

    #[test]
    fn a_breaker_in_warmup_restarts_empty_then_disables_the_shape() {
        let mut cache = GraphCache::<Fake>::new(limits(4, 3));
        let mut with_breaker = observed(1, &[]);
        let breaker = CaptureBreaker::new(BreakerKind::HostRead, "float_into_data");
        with_breaker.breakers.push(breaker.clone());
        let reason = FallbackReason::CaptureBreaker(breaker);
        for _ in 0..4 {
            assert_eq!(cache.plan(&key(8), true), Plan::Warmup);
            assert_eq!(
                cache.warmed(&key(8), with_breaker.clone()),
                Some(reason.clone())
            );
        }
        assert_eq!(cache.plan(&key(8), true), Plan::Eager(reason));
    }

    #[test]
    fn a_shape_made_eager_warms_up_again_after_a_doubling_wait() {
        let mut cache = GraphCache::<Fake>::new(CacheLimits {
            rewarm_after: 5,
            ..limits(4, 1)
        });
        let reason = FallbackReason::Graph(crate::backend::GraphError::NoArena);
        for wait in [5, 10, 20, 40, 80, 160, 160] {
            cache.disable(&key(8), reason.clone());
            eager_for(&mut cache, &key(8), wait, &reason);
            assert_eq!(
                cache.plan(&key(8), true),
                Plan::Warmup,
                "after {wait} steps"
            );
        }
        assert_eq!(cache.rewarms(), 7);
        // A graph forgives the waits: the next one is the shortest again.
        assert_eq!(cache.warmed(&key(8), observed(2, &[])), None);
        capture(&mut cache, &key(8), "a");
        cache.disable(&key(8), reason.clone());
        eager_for(&mut cache, &key(8), 5, &reason);
        assert_eq!(cache.plan(&key(8), true), Plan::Warmup);
    }

    #[test]
    fn a_shape_disabled_by_its_restarts_tries_again_and_graphs_once_settled() {
        let mut cache = GraphCache::<Fake>::new(CacheLimits {
            rewarm_after: 3,
            ..limits(4, 2)
        });
        // A transient schedule: every step differs from the one before, four times.
        for ops in [2, 3, 4, 5, 6] {
            assert_eq!(cache.plan(&key(8), true), Plan::Warmup);
            cache.warmed(&key(8), observed(ops, &[]));
        }
        let reason = FallbackReason::NonStaticControlFlow {
            first_difference: 5,
        };
        eager_for(&mut cache, &key(8), 3, &reason);
        // Settled since: the shape warms up from scratch and graphs.
        warm(&mut cache, &key(8), 2);
        capture(&mut cache, &key(8), "settled");
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);
        // One try was enough.
        assert_eq!(cache.rewarms(), 1);
    }

    #[test]
    fn a_trainer_made_eager_tries_every_shape_again() {
        let mut cache = graphed(CacheLimits {
            rewarm_after: 2,
            ..limits(4, 1)
        });
        cache.disable_all(FallbackReason::RecaptureLimit);
        eager_for(&mut cache, &key(8), 2, &FallbackReason::RecaptureLimit);
        assert_eq!(cache.plan(&key(8), true), Plan::Warmup);
    }

    #[test]
    fn graphs_are_checked_every_verify_every_replays() {
        let mut cache = graphed(CacheLimits {
            verify_every: 3,
            ..limits(4, 1)
        });
        for _ in 0..3 {
            assert_eq!(cache.plan(&key(8), true), Plan::Replay);
        }
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Verify(FallbackReason::ReplayCheck)
        );
        assert_eq!(cache.verified(&key(8), observed(2, &[9])), None);
        for _ in 0..3 {
            assert_eq!(cache.plan(&key(8), true), Plan::Replay, "counted afresh");
        }
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Verify(FallbackReason::ReplayCheck)
        );
        let stale = cache.verified(&key(8), observed(3, &[9])).unwrap();
        assert_eq!(
            stale,
            FallbackReason::GraphStale {
                change: StepChange::OpCount { graph: 2, step: 3 }
            }
        );
        assert_eq!(cache.graphs_alive(), 0);
        assert_eq!(cache.plan(&key(8), true), Plan::Warmup, "rehearsed again");
    }

    #[test]
    fn a_rare_shape_is_checked_once_verify_every_trainer_steps_passed() {
        let mut cache = GraphCache::new(CacheLimits {
            verify_every: 5,
            ..limits(4, 1)
        });
        for batch in [8, 2] {
            warm(&mut cache, &key(batch), 1);
            capture(&mut cache, &key(batch), "a");
        }
        // The full batch's graph, captured two trainer steps before the partial one's,
        // replays three times and is checked at the sixth step since its capture.
        for _ in 0..3 {
            assert_eq!(cache.plan(&key(8), true), Plan::Replay);
        }
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Verify(FallbackReason::ReplayCheck)
        );
        assert_eq!(cache.verified(&key(8), observed(2, &[9])), None);
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);
        // The partial batch comes back: its graph was captured more than 5 trainer
        // steps ago, though it never replayed since.
        assert_eq!(
            cache.plan(&key(2), true),
            Plan::Verify(FallbackReason::ReplayCheck)
        );
        assert_eq!(cache.verified(&key(2), observed(2, &[9])), None);
        assert_eq!(cache.plan(&key(2), true), Plan::Replay, "checked just now");
    }

    #[test]
    fn a_change_names_the_op_and_what_differs() {
        let op = |name: &'static str, scalar: f32| {
            CaptureSession::record(|| {
                crate::backend::session::record_op("float_add", None, |_| {});
                crate::backend::session::record_op(name, None, |r| r.attr(&scalar));
            })
            .1
        };
        let observation = |recording: Recording, reads: &[u64]| Observation {
            signature: recording.signature,
            breakers: recording.breakers,
            unaccounted: observed(0, reads).unaccounted,
            by_place: false,
        };
        let graph = observation(op("float_mul_scalar", 0.5), &[4]);
        let same = observation(op("float_mul_scalar", 0.5), &[4]);
        assert_eq!(same.change_from(&graph), None);
        let weight = observation(op("float_mul_scalar", 0.25), &[4]);
        assert_eq!(
            weight.change_from(&graph),
            Some(StepChange::HostValues {
                index: 1,
                op: "float_mul_scalar".into()
            })
        );
        let branch = observation(op("float_div_scalar", 0.5), &[4]);
        assert_eq!(
            branch.change_from(&graph),
            Some(StepChange::OtherOp {
                index: 1,
                graph: "float_mul_scalar".into(),
                step: "float_div_scalar".into()
            })
        );
        let replaced = observation(op("float_mul_scalar", 0.5), &[5]);
        assert!(matches!(
            replaced.change_from(&graph),
            Some(StepChange::Read { op, .. }) if op == "int_reshape"
        ));
    }

    #[test]
    fn a_suspect_graph_replays_again_only_after_a_matching_step() {
        let mut cache = graphed(limits(4, 1));
        cache.suspect_graphs();
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Verify(FallbackReason::ModelReplaced)
        );
        assert_eq!(cache.verified(&key(8), observed(2, &[9])), None);
        assert_eq!(cache.plan(&key(8), true), Plan::Replay);

        cache.suspect_graphs();
        let reason = cache.verified(&key(8), observed(2, &[10])).unwrap();
        assert!(
            matches!(
                &reason,
                FallbackReason::GraphStale {
                    change: StepChange::Read { .. }
                }
            ),
            "{reason:?}"
        );
        assert_eq!(cache.graphs_alive(), 0, "the outdated graph is dropped");
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Warmup,
            "the verifying step was the first of a new warmup, whose last runs on the pins"
        );
        assert_eq!(cache.warmed(&key(8), observed(2, &[10])), None);
        assert_eq!(cache.plan(&key(8), true), Plan::Capture);
    }

    #[test]
    fn dropped_graphs_are_captured_again_and_disabled_shapes_stay_eager() {
        let mut cache = graphed(limits(4, 1));
        cache.drop_graphs();
        assert_eq!(cache.graphs_alive(), 0);
        assert_eq!(cache.plan(&key(8), true), Plan::Capture);
        cache.disable_all(FallbackReason::RecaptureLimit);
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Eager(FallbackReason::RecaptureLimit)
        );
    }

    #[test]
    fn one_dropped_graph_is_captured_again_and_the_others_stay() {
        let mut cache = GraphCache::new(limits(4, 1));
        for batch in [8, 4] {
            warm(&mut cache, &key(batch), 1);
            capture(&mut cache, &key(batch), "a");
        }
        cache.drop_graph(&key(8));
        cache.drop_graph(&key(2));
        assert_eq!(cache.graphs_alive(), 1);
        assert_eq!(cache.plan(&key(8), true), Plan::Capture);
        assert_eq!(cache.plan(&key(4), true), Plan::Replay);
    }

    #[test]
    fn rewarmed_shapes_run_their_last_warmup_step_before_capturing_again() {
        let mut cache = graphed(limits(4, 3));
        warm(&mut cache, &key(4), 3);
        warm(&mut cache, &key(2), 1);
        cache.disable(&key(1), FallbackReason::RecaptureLimit);
        cache.rewarm();
        assert_eq!(cache.graphs_alive(), 0, "graphs dropped");
        for ready in [key(8), key(4)] {
            assert!(cache.last_warmup(&ready), "{ready:?}");
            warm(&mut cache, &ready, 1);
            assert_eq!(cache.plan(&ready, true), Plan::Capture);
        }
        assert!(
            !cache.last_warmup(&key(2)),
            "a warming shape keeps its count"
        );
        assert_eq!(
            cache.plan(&key(1), true),
            Plan::Eager(FallbackReason::RecaptureLimit)
        );
    }

    #[test]
    fn verifying_a_shape_whose_graph_was_dropped_keeps_its_phase() {
        let mut cache = graphed(limits(4, 3));
        cache.suspect_graphs();
        assert_eq!(
            cache.plan(&key(8), true),
            Plan::Verify(FallbackReason::ModelReplaced)
        );
        // The verifying step's write-back dropped the graphs (the pins' layout moved).
        cache.drop_graphs();
        cache.rewarm();
        assert_eq!(cache.verified(&key(8), observed(2, &[9])), None);
        assert!(cache.last_warmup(&key(8)), "still at its last warmup step");
    }
}
