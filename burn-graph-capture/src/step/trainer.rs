//! `GraphTrainer`: the user-facing training step.

use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::optim::LearningRate;
use burn::tensor::Tensor;
use burn_backend::Backend;
use burn_backend::tensor::FloatTensor;

use super::cache::{Observation, Plan};
use super::config::GraphTrainerConfig;
use super::error::StepError;
use super::fit;
use super::graphed::{Captured, Fallback, FallbackScope, Graphs, constants_by_place, on_inputs};
use super::guard::Accounted;
use super::input::{InputKey, StepInput, check_batch, host_key};
use super::learner::{Learner, StepContext, flush_running_stats, with_own_state};
use super::mode::{FallbackReason, StepChange, StepMode};
use super::output::{StepOutput, detached};
use super::parallel::{Proposal, Rank, Verdict, broadcast_start, same_structure_as_rank_zero};
use super::pinning::{buffer_id, shareable_buffers};
use super::random::TrainerRandom;
use super::registry::{self, Registration, TrainerId};
use super::report::TrainerReport;
use super::views::Lent;
use crate::backend::trace::{OnDifference, RunsAgain, Stop, Trace, Traced, Untraced};
use crate::backend::{
    AnyTensor, CaptureSession, GraphBackend, GraphCapture, GraphError, Recording, TrainBackend,
};
use crate::optim::CapturableOptimizer;
use crate::parallel::{Collectives, Disagreement, DistError, RankMember};

/// The result of one step; `T` is the step closure's item (its loss, for a closure that
/// returns one).
#[derive(Debug)]
pub struct StepOutcome<T> {
    /// What the step closure returned for the caller (the loss, or a `TrainStep`'s
    /// output item), detached from the autodiff graph, in buffers of its own: later
    /// steps never write into them.
    pub output: T,
    /// How the step ran.
    pub mode: StepMode,
}

/// Trains a model with one optimizer step per call, as a CUDA graph where that is safe.
///
/// Each input shape goes through eager warmup steps that must do the same thing (the
/// same ops, and the same tensors read from outside the batch), then, on backends with
/// hardware graphs, is captured once and replayed. Every step is guarded: a batch of a
/// new shape, a parameter shared with another trainer, a tensor the batch does not list,
/// or a step with capture breakers runs eagerly, and [`StepMode::Eager`] says why.
///
/// # Values stay values
/// [`model`](Self::model), [`optimizer`](Self::optimizer) and
/// [`take_model`](Self::take_model) hand out copies where the trainer's own tensors are
/// written in place by later steps (once it has pinned them for graphs), so a clone, a
/// `valid()` model or a record taken at step k keeps the step-k values for good.
///
/// # The step closure
/// It returns a [`StepOutput`]: a scalar loss, which the trainer differentiates, or
/// (feature `train`) burn-train's `TrainOutput`, whose gradients the user's `TrainStep`
/// computed. Every replay calls it first, in a trace that launches nothing: each op of the
/// step (the closure's, the backward pass's, the update's) is matched against the
/// graph's recording, and the graph launches only if the whole step matched; a step
/// that differs (a host value, a branch, a coin) runs eagerly and equals plain code. On
/// the fusion stack such a step runs again from its start, from clones of the closure
/// and of the optimizer taken before the trace: so both are `Clone`, and state the
/// closure changes (a counter, a host RNG) must be its own, moved into it; state it
/// shares with the loop (an `Rc<Cell<_>>`) would change twice for such a step. Graphs captured under
/// [`Untraced`](crate::Untraced) replay without calling it. Before each replay the
/// trainer also checks that the tensors the graph reads as constants are still held
/// outside it, and a graph not checked for
/// [`verify_every`](GraphTrainerConfig::verify_every) trainer steps runs its shape's next
/// step eagerly, compared with the graph (what a trace cannot see: the values an op
/// computes). A host value that changes every step is best passed in the batch, as a
/// tensor or a `#[step_input(key)]` field, so that one graph serves every value. Tensors
/// the closure keeps beyond a call alias the trainer's buffers.
///
/// # Panics in the step closure or the optimizer
/// The closure borrows the model, and the update is applied only after it returns. A
/// panic in the closure therefore propagates to the caller with the model and the
/// optimizer state as they were before the step; the trainer remains usable and the
/// step is not counted. A panic in the optimizer's update does the same: the model and
/// the state are kept aside before it and put back.
pub struct GraphTrainer<G, M, O, I, F, R = Tensor<TrainBackend<G>, 1>>
where
    G: GraphBackend,
    R: StepOutput<TrainBackend<G>>,
{
    id: TrainerId,
    config: GraphTrainerConfig,
    device: G::Device,
    step_fn: F,
    learner: Learner<M, O>,
    graphs: Graphs<G, R::Item>,
    lent: Lent<M, O>,
    /// Whether the model was taken out (`take_model`) and not put back.
    taken_out: bool,
    /// Set when the optimizer state does not fit the model (`fit.rs`): steps are
    /// refused until a fitting model is put in.
    misfit: Option<StepError>,
    /// Registered buffers, kept alive so that their identities stay unique.
    registration: Registration<FloatTensor<G>>,
    /// The generator the steps' random ops draw from (dropout masks).
    random: TrainerRandom<G>,
    shared_with: Option<TrainerId>,
    report: TrainerReport,
    last_mode: Option<StepMode>,
    /// Data-parallel training: this step replays untraced, as a peer must
    /// (`Verdict::ReplayUntraced`).
    untraced_replay: bool,
    /// Data-parallel training: this trainer's group membership. Last, so that it is
    /// dropped after the graphs, whose collectives use the group's communicator.
    rank: Option<Rank<GraphCapture<G>>>,
    _input: PhantomData<fn(&I) -> R>,
}

impl<G, M, O, I, F, R> GraphTrainer<G, M, O, I, F, R>
where
    G: GraphBackend,
    M: AutodiffModule<TrainBackend<G>>,
    O: CapturableOptimizer<M, TrainBackend<G>> + Clone,
    I: StepInput<TrainBackend<G>>,
    F: FnMut(&M, &I) -> R + Clone,
    R: StepOutput<TrainBackend<G>>,
{
    /// A trainer for `model`, updated by `optimizer`, with `step_fn` computing the loss
    /// of one batch (or its gradients, see [`StepOutput`]). The optimizer's state is
    /// created now, so every step runs the same ops, and the model's buffers are
    /// registered (a share with another trainer is detected here). An optimizer whose
    /// state belongs to another model is kept as it is, and steps are refused with
    /// [`StepError::OptimizerStateMismatch`] until that model is put in.
    pub fn new(model: M, optimizer: O, step_fn: F, config: GraphTrainerConfig) -> Self {
        let mut trainer = Self::unregistered(model, optimizer, step_fn, config);
        trainer.register_buffers();
        trainer
    }

    /// [`new`](Self::new) before the model's buffers are registered.
    fn unregistered(model: M, mut optimizer: O, step_fn: F, config: GraphTrainerConfig) -> Self {
        let device = model.devices().into_iter().next().unwrap_or_default();
        let model = with_own_state(&model);
        let misfit = fit::state_mismatch(&model, &mut optimizer);
        if misfit.is_none() {
            // (Left as it came otherwise, so that the model it fits can still be put in.)
            optimizer.init_state(&model);
        }
        let id = TrainerId::next();
        Self {
            id,
            graphs: Graphs::new(&config),
            config,
            // (Before `device` moves in.)
            random: TrainerRandom::new(&device),
            device,
            step_fn,
            learner: Learner::new(model, optimizer),
            lent: Lent::default(),
            taken_out: false,
            misfit,
            registration: Registration::new(id),
            shared_with: None,
            report: TrainerReport {
                trainer: Some(id),
                ..TrainerReport::default()
            },
            last_mode: None,
            untraced_replay: false,
            rank: None,
            _input: PhantomData,
        }
    }

    /// A trainer for one rank of data-parallel training ([`DataParallel`]): as
    /// [`new`](Self::new) builds, and each step averages the gradients over the group's
    /// ranks before the optimizer runs (inside the step's graph, on GPUs).
    ///
    /// Every rank calls this, each on its own thread and device, and each returns once
    /// all have: their backends join the group (an NCCL communicator), the ranks check
    /// that they train models of the same structure, and rank 0's parameters and
    /// optimizer state are copied to every rank, so that all start equal. Then every
    /// rank must run the same steps, on batches of the same shapes; see
    /// [`DataParallel`] for how they agree and fail together.
    ///
    /// [`DataParallel`]: crate::DataParallel
    pub fn data_parallel(
        model: M,
        optimizer: O,
        step_fn: F,
        config: GraphTrainerConfig,
        member: RankMember,
    ) -> Result<Self, StepError>
    where
        G: Collectives,
    {
        let rank = Rank::<GraphCapture<G>>::new(member);
        let member = rank.member();
        let device = model.devices().into_iter().next().unwrap_or_default();
        let joined = G::join_group(&device, member)
            .map_err(|error| StepError::DataParallel(member.fail(error)));
        // Every rank reaches the meeting points below, so that a rank whose join failed
        // does not leave the others waiting there.
        let model = same_structure_as_rank_zero(model, member)?;
        joined?;
        // Registered once rank 0's values are in: ranks handed clones of one model would
        // otherwise share its buffers.
        let mut trainer = Self::unregistered(model, optimizer, step_fn, config);
        let fits = rank.exchange(&trainer.misfit.is_none())?;
        if let Some(misfit) = &trainer.misfit {
            return Err(misfit.clone());
        }
        if let Some(other) = fits.iter().position(|fits| !fits) {
            let error = DistError::Mismatch(Disagreement::OptimizerState { rank: other });
            return Err(StepError::DataParallel(member.fail(error)));
        }
        let mut broadcast = Ok(());
        trainer.learner.update(|model, optimizer| {
            match broadcast_start(model.clone(), optimizer, member) {
                Ok(start) => start,
                Err(error) => {
                    broadcast = Err(error);
                    model
                }
            }
        });
        broadcast.map_err(|error| StepError::DataParallel(member.fail(error)))?;
        trainer.register_buffers();
        trainer.rank = Some(rank);
        Ok(trainer)
    }

    /// Runs one training step on `batch`.
    pub fn step(&mut self, batch: I) -> Result<StepOutcome<R::Item>, StepError> {
        if let Some(failure) = self.rank.as_ref().and_then(Rank::failure) {
            return Err(failure);
        }
        let checks = Instant::now();
        let planned = self.plan(&batch);
        let planned = match self.rank.clone() {
            Some(rank) => self.agree(&rank, planned),
            None => planned,
        };
        let (key, inputs, plan) = planned?;
        self.report.check_ms += checks.elapsed().as_secs_f64() * 1e3;
        let (output, mode) = match plan {
            Plan::Warmup | Plan::Rewarm(_) => {
                let rehearsal =
                    self.graphs
                        .rehearsal_inputs(&mut self.learner, &key, &inputs, &self.device);
                let (output, observed) = match rehearsal {
                    Some(pinned) => {
                        self.register_buffers();
                        let batch = on_inputs(&batch, &pinned);
                        self.observed_step(&batch, &pinned, true, Some(&key))?
                    }
                    None => self.observed_step(&batch, &inputs, false, None)?,
                };
                let reason = self.graphs.warmed(&key, observed).or(match plan {
                    Plan::Rewarm(why) => Some(why),
                    _ => None,
                });
                (
                    output,
                    StepMode::Eager(reason.unwrap_or(FallbackReason::Warmup)),
                )
            }
            Plan::Verify(checking) => {
                let (output, observed) = self.observed_step(&batch, &inputs, true, None)?;
                let reason = self.graphs.verified(&key, observed);
                (output, StepMode::Eager(reason.unwrap_or(checking)))
            }
            Plan::Eager(reason) => (self.eager_step(&batch, None)?.0, StepMode::Eager(reason)),
            Plan::Capture | Plan::Replay => self.graph_or_eager(&plan, &key, &batch, &inputs)?,
            Plan::Branch => self.branch_step(&key, &batch, &inputs)?,
        };
        self.graphs.step_done();
        self.lent.clear();
        self.finish_step(&mode);
        Ok(StepOutcome { output, mode })
    }

    /// Checks the batch and plans its step.
    fn plan(&mut self, batch: &I) -> Result<(InputKey, Vec<AnyTensor<G>>, Plan), StepError> {
        if self.taken_out {
            return Err(StepError::ModelTakenOut);
        }
        if let Some(misfit) = &self.misfit {
            return Err(misfit.clone());
        }
        let inputs: Vec<AnyTensor<G>> = batch
            .tensors()
            .into_iter()
            .map(AnyTensor::into_inner)
            .collect();
        let key = check_batch::<G>(&inputs, &self.device, host_key(batch))?;
        self.random.follow_seed();
        self.shared_with = registry::shared_with(self.id);
        let plan = match self.shared_with {
            Some(other) => {
                // The other trainer may sit on this one's pinned buffers (a model cloned
                // from this trainer's): writing back into them would change its values.
                self.graphs.unpin();
                Plan::Eager(FallbackReason::SharedWithTrainer(other))
            }
            None if !self.config.capture => Plan::Eager(FallbackReason::CaptureDisabled),
            None => self.graphs.plan(&key, &self.device),
        };
        Ok((key, inputs, plan))
    }

    /// Data-parallel training: the plan every rank can follow. A replay is prepared
    /// first (pins checked, the batch copied in), so that a rank that cannot replay says
    /// so before any rank launches. A refused step is refused on every rank.
    fn agree(
        &mut self,
        rank: &Rank<GraphCapture<G>>,
        planned: Result<(InputKey, Vec<AnyTensor<G>>, Plan), StepError>,
    ) -> Result<(InputKey, Vec<AnyTensor<G>>, Plan), StepError> {
        let (key, inputs, mut plan) = match planned {
            Ok(planned) => planned,
            Err(error) => {
                rank.agree(&Proposal::Refuse(Box::new(error.clone())))?;
                return Err(error);
            }
        };
        if matches!(plan, Plan::Replay | Plan::Branch)
            && let Err(fallback) = self.graphs.prepare_replay(&mut self.learner, &key, &inputs)
        {
            plan = match self.absorb(fallback, &key) {
                Ok(reason) => Plan::Eager(reason),
                Err(error) => {
                    rank.agree(&Proposal::Refuse(Box::new(error.clone())))?;
                    return Err(error);
                }
            };
        }
        let proposal = match &plan {
            // A step beside a shape's graphs replays where its trace matches one.
            Plan::Replay | Plan::Branch => Proposal::Replay {
                traced: !Untraced::active() && self.graphs.traceable(&key),
            },
            Plan::Capture => Proposal::Capture,
            Plan::Warmup => Proposal::Eager(FallbackReason::Warmup),
            Plan::Rewarm(reason) => Proposal::Eager(reason.clone()),
            Plan::Verify(checking) => Proposal::Eager(checking.clone()),
            Plan::Eager(reason) => Proposal::Eager(reason.clone()),
        };
        self.untraced_replay = false;
        match rank.agree(&proposal)? {
            Verdict::Proceed => {}
            Verdict::ReplayUntraced => {
                // Untraced, a step beside graphs of other paths replays the first.
                self.untraced_replay = true;
                plan = Plan::Replay;
            }
            Verdict::Eager(reason) => plan = Plan::Eager(reason),
            Verdict::DropGraph(reason) => {
                self.graphs.drop_graph(&key);
                plan = Plan::Eager(reason);
            }
            Verdict::Refuse(error) => return Err(error),
        }
        Ok((key, inputs, plan))
    }

    /// Sets the learning rate of the following steps, without re-capturing: once the
    /// optimizer state is pinned, the value is written into the pinned buffer.
    pub fn set_lr(&mut self, lr: LearningRate) {
        if !self.graphs.write_lr(lr, &self.device) {
            // A new lr tensor: if pins exist (the write into them failed), the next graph
            // step must see that the optimizer left them.
            self.learner.optimizer_mut().set_lr(lr);
            self.graphs.recheck();
        }
        self.lent.clear();
    }

    /// The model, for evaluation and checkpoints: a value that later steps leave as it
    /// is (see [`GraphTrainer`]'s "Values stay values"). `None` while the model is
    /// taken out.
    pub fn model(&self) -> Option<&M> {
        if self.taken_out {
            return None;
        }
        Some(self.lent.model(self.learner.model(), self.graphs.pinned()))
    }

    /// Takes the model out (to change or load it, say). Steps fail with
    /// [`StepError::ModelTakenOut`] until it is put back with
    /// [`put_model`](Self::put_model). `None` if it is already out.
    pub fn take_model(&mut self) -> Option<M> {
        let model = self.model()?.clone();
        self.taken_out = true;
        Some(model)
    }

    /// Puts a model back, or in: the trainer trains it from now on. On GPUs graphs
    /// survive: the next step runs eagerly on the model's own tensors (as plain code on
    /// it would) and writes its results into the pinned buffers; each shape's next step
    /// then runs eagerly and must do what its graph recorded before replays resume.
    ///
    /// A model of another structure (a parameter added, removed, resized under its id,
    /// frozen or unfrozen, or a head re-initialised with new ids) starts the graphs over:
    /// every shape warms up again and graphs again. The optimizer state is made to fit
    /// it ([`CapturableOptimizer::fit_state`]): the learning rate and step count stay,
    /// state of removed or resized parameters is dropped, and new or resized ones start
    /// from zero state. Only an optimizer that cannot fit its state (or one built from a
    /// record of another model) makes the steps refuse, with
    /// [`StepError::OptimizerStateMismatch`], until a model it fits is put in.
    pub fn put_model(&mut self, model: M) {
        let model = with_own_state(&model);
        let optimizer = self.learner.optimizer_mut();
        if self.misfit.is_some() {
            // A refused optimizer state may fit this model (the one it was saved with).
            self.misfit = fit::state_mismatch(&model, optimizer);
        }
        if self.misfit.is_none() {
            optimizer.fit_state(&model);
            self.misfit = fit::state_mismatch(&model, optimizer);
        }
        if fit::Structure::of(self.learner.model()) != fit::Structure::of(&model) {
            self.graphs.restart();
        }
        self.graphs.put_back(&mut self.learner, model);
        self.taken_out = false;
        self.lent.clear();
        self.register_buffers();
    }

    /// The optimizer, for saving its record: a value that later steps leave as it is.
    pub fn optimizer(&self) -> &O {
        self.lent
            .optimizer(self.learner.optimizer(), self.graphs.pinned())
    }

    /// The configuration the trainer was made with.
    pub fn config(&self) -> &GraphTrainerConfig {
        &self.config
    }

    /// This trainer's identity in the share registry and in logs.
    pub fn id(&self) -> TrainerId {
        self.id
    }

    /// What the trainer did so far.
    pub fn report(&self) -> TrainerReport {
        let graphs = self.graphs.stats();
        let (snapshot_copies, snapshot_ms) = self.lent.stats();
        TrainerReport {
            graphs_alive: self.graphs.graphs_alive(),
            shared_with: self.shared_with,
            capture_ms: graphs.capture_ms,
            recaptures: graphs.recaptures,
            evictions: graphs.evictions,
            rewarms: graphs.rewarms,
            pinned_bytes: graphs.pinned_bytes,
            snapshot_copies,
            snapshot_ms,
            ..self.report.clone()
        }
    }

    /// Gives back the model and the optimizer; the trainer's graphs are dropped and its
    /// buffers unregistered, so nothing writes into them any more.
    pub fn into_parts(self) -> (M, O) {
        self.learner.into_parts()
    }

    /// An eager step inside a capture session: what it did, as the graph cache judges
    /// it. The trainer accounts for its own tensors as they are before the step.
    /// `rehearse` runs it as the capture will run its step (`GraphBackend::rehearse`):
    /// the last warmup step (on the pins) and verifying steps, so that the fused kernels
    /// the capture launches under its own stream are compiled before the window. The
    /// warmup steps before run on the caller's stream, as plain eager code does. The
    /// rehearsal then finds every choice tuned, since pins keep the layouts the earlier
    /// steps had (`backend::layout`). The rehearsal of a shape (`rehearsal_of`) keeps
    /// the constants it read, for its capture's constant pins.
    fn observed_step(
        &mut self,
        batch: &I,
        inputs: &[AnyTensor<G>],
        rehearse: bool,
        rehearsal_of: Option<&InputKey>,
    ) -> Result<(R::Item, Observation), StepError> {
        let accounted = self
            .graphs
            .owned(&mut self.learner)
            .with(inputs.iter().map(AnyTensor::allocation_id))
            .with([self.random.accounted()]);
        let by_place = constants_by_place::<G>(self.rank.is_some());
        let keeping = rehearsal_of.filter(|_| by_place);
        let session = || match keeping {
            Some(_) => CaptureSession::begin_keeping(accounted.ids().clone()),
            None => CaptureSession::begin(),
        };
        let device = self.device.clone();
        let (output, recording) = if rehearse {
            G::rehearse(&device, || self.eager_step(batch, Some(session())))?
        } else {
            self.eager_step(batch, Some(session()))?
        };
        let observed =
            self.observation(&accounted, recording.unwrap_or_default(), by_place, keeping);
        Ok((output, observed))
    }

    /// What an eager step recorded, as the graph cache judges it; the constants it read
    /// are kept for the capture pins of `keeping`'s shape, if given.
    fn observation(
        &mut self,
        accounted: &Accounted,
        recording: Recording,
        by_place: bool,
        keeping: Option<&InputKey>,
    ) -> Observation {
        if let Some(key) = keeping {
            let reads = accounted.unaccounted(recording.reads.clone());
            self.graphs.rehearsed(key, &reads, recording.kept());
        }
        Observation {
            signature: recording.signature,
            breakers: recording.breakers,
            unaccounted: accounted.unaccounted(recording.reads),
            by_place,
        }
    }

    /// A step of a shape that warms up a new path of its step closure beside graphs of
    /// its other paths: traced against them, it replays the one it matches; a step
    /// that matches none ran eagerly, observed whole, and counts as a warmup step of
    /// the new path.
    fn branch_step(
        &mut self,
        key: &InputKey,
        batch: &I,
        inputs: &[AnyTensor<G>],
    ) -> Result<(R::Item, StepMode), StepError> {
        // A rank prepared its replay before the ranks agreed on it.
        let rank = self.rank.clone();
        let fail = |fallback| past_agreement(rank.as_ref(), fallback);
        let prepared = match rank {
            Some(_) => Ok(()),
            None => self.prepare(key, inputs),
        };
        let traced = prepared.and_then(|()| self.trace(key, batch, inputs, true));
        let attempt = match traced.map_err(fail) {
            Ok(None) => self
                .launch(key)
                .map(|output| (output, StepMode::Replayed))
                .map_err(fail),
            Ok(Some(TracedEager {
                item,
                mode,
                observed,
            })) => {
                let reason =
                    observed.and_then(|observed| self.graphs.warmed_unmatched(key, observed));
                return Ok((item, reason.map_or(mode, StepMode::Eager)));
            }
            Err(fallback) => Err(fallback),
        };
        let reason = match attempt {
            Ok(done) => return Ok(done),
            Err(fallback) => self.absorb(fallback, key)?,
        };
        let (output, _) = self.eager_step(batch, None)?;
        Ok((output, StepMode::Eager(reason)))
    }

    /// Runs a graph step, or the step eagerly with the reason the graph step failed.
    fn graph_or_eager(
        &mut self,
        plan: &Plan,
        key: &InputKey,
        batch: &I,
        inputs: &[AnyTensor<G>],
    ) -> Result<(R::Item, StepMode), StepError> {
        let attempt = if *plan == Plan::Capture {
            let (graphs, cx) = self.parts();
            let captured = graphs.capture(cx, key, batch, inputs);
            // Pinning moved the model and optimizer onto other buffers.
            self.register_buffers();
            captured.map(|captured| match captured {
                Captured::Graph(output) => {
                    self.report.graphed_random(self.random.served());
                    (output, StepMode::Captured)
                }
                Captured::Once(output, reason) => (output, StepMode::Eager(reason)),
            })
        } else {
            self.replay(key, batch, inputs)
        };
        let reason = match attempt {
            Ok(done) => return Ok(done),
            Err(fallback) => self.absorb(fallback, key)?,
        };
        let (output, _) = self.eager_step(batch, None)?;
        Ok((output, StepMode::Eager(reason)))
    }

    /// A replay: prepared here, or (data-parallel) before the ranks agreed on it. Where
    /// the graph has a trace recording, the step is traced first and replays only if it
    /// matched; otherwise it went on eagerly from where it differed. A data-parallel
    /// launch that fails fails the group: the peers launched theirs.
    fn replay(
        &mut self,
        key: &InputKey,
        batch: &I,
        inputs: &[AnyTensor<G>],
    ) -> Result<(R::Item, StepMode), Fallback> {
        let Some(rank) = self.rank.clone() else {
            self.prepare(key, inputs)?;
            if let Some(eager) = self.trace(key, batch, inputs, false)? {
                return Ok((eager.item, eager.mode));
            }
            return self.launch(key).map(|output| (output, StepMode::Replayed));
        };
        let fail = |fallback| past_agreement(Some(&rank), fallback);
        if !self.untraced_replay
            && let Some(eager) = self.trace(key, batch, inputs, false).map_err(fail)?
        {
            return Ok((eager.item, eager.mode));
        }
        self.launch(key)
            .map(|output| (output, StepMode::Replayed))
            .map_err(fail)
    }

    /// A lone trainer's replay prepared (pins checked, the batch copied in), timed into
    /// the report's launch time; a rank prepares before the ranks agree (`check_ms`).
    fn prepare(&mut self, key: &InputKey, inputs: &[AnyTensor<G>]) -> Result<(), Fallback> {
        let preparing = Instant::now();
        let prepared = self.graphs.prepare_replay(&mut self.learner, key, inputs);
        self.report.launch_ms += preparing.elapsed().as_secs_f64() * 1e3;
        prepared
    }

    /// Launches `key`'s first graph, timed into the report.
    fn launch(&mut self, key: &InputKey) -> Result<R::Item, Fallback> {
        let launching = Instant::now();
        let output = self.graphs.launch_replay(key);
        self.report.launch_ms += launching.elapsed().as_secs_f64() * 1e3;
        output
    }

    /// Traces the step against `key`'s graphs (`backend::trace`): the closure, backward
    /// pass and update run on the first graph's batch inputs, each op matched instead
    /// of run. `None`: every op of a graph matched (or the graphs have no trace
    /// recording), and that graph, now the first, may launch. Otherwise the step went
    /// on eagerly from the first difference, with the difference as its reason; the
    /// graphs stay, and the shape warms up the new path beside them. An `observing`
    /// trace records the whole step as an eager one (the shape already warms up a new
    /// path: the step is one of its warmup steps).
    fn trace(
        &mut self,
        key: &InputKey,
        batch: &I,
        inputs: &[AnyTensor<G>],
        observing: bool,
    ) -> Result<Option<TracedEager<R::Item>>, Fallback> {
        let (candidates, static_inputs) = self.graphs.traces_of(key);
        let device = self.device.clone();
        let keep_ready = Box::new(move || G::keep_ready(&device));
        let on_difference = if G::traces_run_again() || RunsAgain::active() {
            OnDifference::RunAgain
        } else {
            OnDifference::GoOn
        };
        let trace = match &self.rank {
            Some(rank) => Trace::begin_ranked(
                &candidates,
                observing,
                on_difference,
                Box::new(rank.clone()),
                keep_ready,
            ),
            None => Trace::begin(&candidates, observing, on_difference, keep_ready),
        };
        let Some(trace) = trace else {
            return Ok(None);
        };
        // The closure and the optimizer (its host state: a count of its updates, say) as
        // they are before the trace, for a step that runs again.
        let before = (on_difference == OnDifference::RunAgain)
            .then(|| (self.step_fn.clone(), self.learner.optimizer().clone()));
        let started = Instant::now();
        let static_batch = on_inputs(batch, &static_inputs);
        let by_place = constants_by_place::<G>(self.rank.is_some());
        let accounted = observing.then(|| {
            self.graphs
                .owned(&mut self.learner)
                .with(static_inputs.iter().map(AnyTensor::allocation_id))
                .with([self.random.accounted()])
        });
        let session = match &accounted {
            Some(accounted) if by_place => CaptureSession::begin_keeping(accounted.ids().clone()),
            Some(_) => CaptureSession::begin(),
            None => CaptureSession::begin_unrecorded(),
        };
        // A panic in the closure, resumed below, leaves the peers inside the trace's
        // meeting points.
        let _unwinding = self.rank.clone().map(FailOnUnwind);
        let (_, mut cx) = self.parts();
        let item = catch_unwind(AssertUnwindSafe(|| cx.train(&static_batch)));
        let recording = session.finish();
        let (item, traced) = match item {
            // A rank's closure that fails leaves its peers at the trace's meeting points.
            Ok(Err(error)) if let Some(rank) = &self.rank => {
                drop(trace);
                return Err(Fallback::Refused(rank.fail_step(error)));
            }
            Ok(item) => (Some(item), trace.end()),
            // The trace stopped inside the closure (it could not compute what it had
            // handed out, or the step runs again): nothing it ran is kept.
            Err(payload) => match payload.downcast::<Stop>() {
                Ok(stop) => {
                    drop(trace);
                    (None, stop.into_traced())
                }
                Err(payload) => resume_unwind(payload),
            },
        };
        self.report.trace_ms += started.elapsed().as_secs_f64() * 1e3;
        let (graphs, cx) = self.parts();
        match traced {
            Traced::Matched(index) => {
                graphs.reseat(cx.learner);
                item.expect("a matched trace ran the closure to its end")
                    .map_err(Fallback::Refused)?;
                graphs.matched(cx.learner, key, index, inputs)?;
                self.report.traces_matched += 1;
                Ok(None)
            }
            Traced::Diverged(difference) => {
                let item = item
                    .expect("a trace that went on eagerly ran the closure to its end")
                    .map_err(Fallback::Refused)?;
                cx.random.advance_eager();
                graphs.write_back_eager(cx.learner);
                if !observing {
                    graphs.branch(key);
                }
                self.register_buffers();
                let change = StepChange::from(difference);
                tracing::info!(%change, "a step differed from its graphs; it ran eagerly");
                let observed = accounted.map(|accounted| {
                    let keeping = Some(key).filter(|_| by_place);
                    self.observation(&accounted, recording, by_place, keeping)
                });
                Ok(Some(TracedEager {
                    item: detached(&item),
                    mode: StepMode::Eager(FallbackReason::GraphStale { change }),
                    observed,
                }))
            }
            Traced::RunAgain(difference) => {
                // Nothing the trace ran is kept: the pins hold the values before the
                // step, and the closure and the optimizer are as they were before it.
                let (step_fn, optimizer) = before.expect("a trace that runs again kept both");
                *cx.learner.optimizer_mut() = optimizer;
                flush_running_stats(cx.learner.model());
                graphs.reseat(cx.learner);
                drop(item);
                self.step_fn = step_fn;
                if !observing {
                    self.graphs.branch(key);
                }
                self.report.traces_run_again += 1;
                let change = StepChange::from(difference);
                tracing::info!(%change, "a step differed from its graphs; it runs again eagerly");
                let (item, observed) = if observing {
                    let keeping = Some(key).filter(|_| by_place);
                    let (item, observed) = self
                        .observed_step(batch, inputs, false, keeping)
                        .map_err(Fallback::Refused)?;
                    (item, Some(observed))
                } else {
                    (
                        self.eager_step(batch, None).map_err(Fallback::Refused)?.0,
                        None,
                    )
                };
                Ok(Some(TracedEager {
                    item,
                    mode: StepMode::Eager(FallbackReason::GraphStale { change }),
                    observed,
                }))
            }
            Traced::Failed(why) => {
                // Nothing the trace ran is kept: the pins hold the values before the step.
                tracing::error!(%why, "a trace could not continue eagerly; the step runs again");
                flush_running_stats(cx.learner.model());
                graphs.reseat(cx.learner);
                graphs.stale(key);
                Err(Fallback::step(FallbackReason::Graph(
                    GraphError::EmulatedReplay(why),
                )))
            }
        }
    }

    /// What a failed graph step leaves for later steps (a shape or the whole trainer
    /// eager), and the reason this step runs eagerly; a refused step's error.
    fn absorb(&mut self, fallback: Fallback, key: &InputKey) -> Result<FallbackReason, StepError> {
        let (scope, reason) = match fallback {
            Fallback::Eager { scope, reason } => (scope, reason),
            Fallback::Refused(error) => return Err(error),
        };
        match scope {
            FallbackScope::Step => {}
            FallbackScope::Shape => self.graphs.disable(key, reason.clone()),
            FallbackScope::Trainer => self.graphs.disable_all(reason.clone()),
        }
        Ok(reason)
    }

    /// One eager optimizer step, recorded by `session` if given; its results are
    /// written into the pinned buffers where there are any.
    fn eager_step(
        &mut self,
        batch: &I,
        session: Option<CaptureSession>,
    ) -> Result<(R::Item, Option<Recording>), StepError> {
        let (_, mut cx) = self.parts();
        // A panic in the closure leaves the peers inside the step's collectives.
        let unwinding = cx.rank.cloned().map(FailOnUnwind);
        let device = cx.device;
        let item = G::isolate(device, || {
            let item = cx.train(batch);
            cx.random.advance_eager();
            item
        });
        let item = match (item, cx.rank) {
            (Err(error), Some(rank)) => return Err(rank.fail_step(error)),
            (item, _) => item?,
        };
        drop(unwinding);
        let recording = session.map(CaptureSession::finish);
        self.graphs.write_back_eager(&mut self.learner);
        self.register_buffers();
        Ok((detached(&item), recording))
    }

    /// The graphs, and apart from them what a step borrows of the rest.
    fn parts(&mut self) -> Parts<'_, G, M, O, F, R::Item> {
        let cx = StepContext {
            learner: &mut self.learner,
            step_fn: &mut self.step_fn,
            random: &mut self.random,
            device: &self.device,
            rank: self.rank.as_ref(),
        };
        (&mut self.graphs, cx)
    }

    fn finish_step(&mut self, mode: &StepMode) {
        self.report.count(mode);
        let changed = self.last_mode.as_ref() != Some(mode);
        if changed {
            tracing::info!(trainer = self.id.0, mode = mode.kind(), detail = %ModeDetail(mode), "graph trainer mode change");
            self.last_mode = Some(mode.clone());
        }
        tracing::debug!(trainer = self.id.0, step = self.report.steps, mode = ?mode, "graph trainer step");
    }

    /// Registers the current buffers that decide a share (trainable parameters and the
    /// optimizer state a step replaces), releasing the previous ones.
    fn register_buffers(&mut self) {
        let (model, optimizer) = self.learner.parts_mut();
        let buffers = shareable_buffers::<G, M, O>(model, optimizer)
            .into_iter()
            .filter_map(|tensor| buffer_id::<G>(&tensor).map(|id| (id, tensor)))
            .collect();
        let shared = self.registration.replace(buffers);
        if shared.is_some() && self.shared_with.is_none() {
            tracing::info!(trainer = self.id.0, shared_with = ?shared, "trainer shares a buffer; running eagerly");
        }
        self.shared_with = shared;
    }
}

/// A traced step that matched no graph and ran eagerly: its item, its mode, and what it
/// did where the trace observed it.
struct TracedEager<T> {
    item: T,
    mode: StepMode,
    observed: Option<Observation>,
}

/// A trainer's graphs, and apart from them the rest of it that a step borrows.
type Parts<'a, G, M, O, F, T> = (&'a mut Graphs<G, T>, StepContext<'a, G, M, O, F>);

/// What a rank that panicked inside a step tells its peers.
#[derive(Debug, thiserror::Error)]
#[error("the step panicked")]
struct StepPanicked;

/// Fails a data-parallel group if dropped while its thread unwinds (a panic inside a
/// step, after which the peers would wait in its collectives).
struct FailOnUnwind<B: Backend>(Rank<B>);

/// A data-parallel rank's fallback past the ranks' agreement fails the group: its peers
/// are inside the step's collectives (or a trace's meeting points). A lone trainer's
/// stays a fallback.
fn past_agreement<B: Backend>(rank: Option<&Rank<B>>, fallback: Fallback) -> Fallback {
    match (fallback, rank) {
        (Fallback::Eager { reason, .. }, Some(rank)) => Fallback::Refused(rank.fail(reason)),
        (fallback, _) => fallback,
    }
}

impl<B: Backend> Drop for FailOnUnwind<B> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail(StepPanicked);
        }
    }
}

/// A mode for logs: its reason in words.
struct ModeDetail<'a>(&'a StepMode);

impl std::fmt::Display for ModeDetail<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            StepMode::Eager(reason) => write!(f, "eager: {reason}"),
            other => f.write_str(other.kind()),
        }
    }
}
