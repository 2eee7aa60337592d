//! The model and its optimizer, and the one training step that eager runs and captures
//! share.
//!
//! Every step, eager or recorded into a graph, runs exactly [`Learner::train`]: the
//! user's closure, its gradients, the optimizer, then [`settle`], which makes the model's state
//! after a step what the next step must read: tied parameters stay tied, and pending
//! running statistics are flushed into the module. A step recorded into a graph thus
//! does what an eager step does, op for op.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorPrimitive};

use super::error::StepError;
use super::output::{StepOutput, unaliased};
use super::parallel::{Rank, average_gradients};
use super::random::TrainerRandom;
use crate::backend::trace;
use crate::backend::{GraphBackend, GraphCapture, TrainBackend};
use crate::optim::CapturableOptimizer;

/// Why the model can be missing: taken by [`Learner::update`] while it runs.
const LOST: &str = "the trainer's model is missing: a model update did not return";

/// The model and the optimizer that updates it.
pub(crate) struct Learner<M, O> {
    /// `None` only while [`update`](Self::update) runs, or after a panic in a caller's
    /// `update` other than the optimizer's step (which puts the model back).
    model: Option<M>,
    optimizer: O,
}

impl<M, O> Learner<M, O> {
    pub(crate) fn new(model: M, optimizer: O) -> Self {
        Self {
            model: Some(model),
            optimizer,
        }
    }

    /// The model. Panics only if a panic left an earlier [`update`](Self::update).
    pub(crate) fn model(&self) -> &M {
        self.model.as_ref().expect(LOST)
    }

    pub(crate) fn optimizer(&self) -> &O {
        &self.optimizer
    }

    pub(crate) fn optimizer_mut(&mut self) -> &mut O {
        &mut self.optimizer
    }

    /// The model and the optimizer, for code that changes both.
    pub(crate) fn parts_mut(&mut self) -> (&M, &mut O) {
        let model = self.model.as_ref().expect(LOST);
        (model, &mut self.optimizer)
    }

    /// Replaces the model by `f(model, optimizer)`.
    pub(crate) fn update(&mut self, f: impl FnOnce(M, &mut O) -> M) {
        let model = self.model.take().expect(LOST);
        self.model = Some(f(model, &mut self.optimizer));
    }

    /// Puts `model` back if an optimizer panicked inside [`update`](Self::update) and
    /// took the model with it; otherwise keeps the model it has.
    pub(crate) fn restore_if_lost(&mut self, model: M) {
        if self.model.is_none() {
            self.model = Some(model);
        }
    }

    pub(crate) fn into_parts(self) -> (M, O) {
        let model = self.model.expect(LOST);
        (model, self.optimizer)
    }
}

impl<M, O> Learner<M, O> {
    /// One training step: the user's closure on the model, its gradients (backward of
    /// a loss, or those a `TrainStep` computed), averaged over the ranks of `member`'s
    /// group in data-parallel training, the optimizer's update, [`settle`].
    /// Returns the closure's item, still attached.
    pub(crate) fn train<B, F, I, R>(
        &mut self,
        step_fn: &mut F,
        batch: &I,
        rank: Option<&Rank<B::InnerBackend>>,
    ) -> Result<R::Item, StepError>
    where
        B: AutodiffBackend<InnerBackend: GraphBackend>,
        M: AutodiffModule<B>,
        O: CapturableOptimizer<M, B>,
        F: FnMut(&M, &I) -> R,
        R: StepOutput<B>,
    {
        let (mut grads, item) = step_fn(self.model(), batch).into_update(self.model())?;
        let item = unaliased(item, self.model());
        if let Some(rank) = rank {
            // A rank's trace agrees with its peers' before the average (all matched, or
            // all go on eagerly from here).
            trace::before_collective()
                .map_err(|failed| rank.failure().unwrap_or_else(|| rank.fail(failed)))?;
            average_gradients(self.model(), &mut grads, rank).map_err(StepError::DataParallel)?;
        }
        self.optimize(grads);
        Ok(item)
    }

    /// The optimizer's update of the model, then [`settle`]. A panic in it (a user's
    /// optimizer, a shape error) leaves the model and the optimizer state as they were
    /// before it and goes on to the caller, as a panic in the step closure does: both
    /// are kept aside first as handles (no device work), which also keeps the update
    /// from writing into them in place, so they still hold the pre-step values.
    fn optimize<B>(&mut self, grads: burn::optim::GradientsParams)
    where
        B: AutodiffBackend<InnerBackend: GraphBackend>,
        M: AutodiffModule<B>,
        O: CapturableOptimizer<M, B>,
    {
        let before = self.model().clone();
        let mut state = HashMap::new();
        self.optimizer.visit_state(&mut |slot, tensor| {
            state.insert(slot, tensor.clone());
        });
        let updated = catch_unwind(AssertUnwindSafe(|| {
            self.update(|model, optimizer| settle(optimizer.step(model, grads)))
        }));
        if let Err(panic) = updated {
            self.model = Some(before);
            self.optimizer.visit_state(&mut |slot, tensor| {
                if let Some(saved) = state.remove(&slot) {
                    *tensor = saved;
                }
            });
            resume_unwind(panic);
        }
    }
}

/// What a step borrows of its trainer besides the graphs, as one value: the parts that
/// every step running the closure needs, eager or recorded.
pub(crate) struct StepContext<'a, G: GraphBackend, M, O, F> {
    pub(crate) learner: &'a mut Learner<M, O>,
    pub(crate) step_fn: &'a mut F,
    /// The generator the step's random ops draw from.
    pub(crate) random: &'a mut TrainerRandom<G>,
    pub(crate) device: &'a G::Device,
    /// Data-parallel training: the trainer's rank.
    pub(crate) rank: Option<&'a Rank<GraphCapture<G>>>,
}

impl<G: GraphBackend, M, O, F> StepContext<'_, G, M, O, F> {
    /// [`Learner::train`] with its random ops drawn from the trainer's generator, whose
    /// state the caller then advances past the draws.
    pub(crate) fn train<I, R>(&mut self, batch: &I) -> Result<R::Item, StepError>
    where
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>>,
        F: FnMut(&M, &I) -> R,
        R: StepOutput<TrainBackend<G>>,
    {
        let (learner, step_fn) = (&mut *self.learner, &mut *self.step_fn);
        let rank = self.rank;
        self.random.draw_in(|| learner.train(step_fn, batch, rank))
    }
}

/// Makes a model after an optimizer step what the next step must read.
///
/// - **Tied parameters.** A module reached through two fields holds one `ParamId`
///   twice. Autodiff sums both uses into one gradient, but Burn's optimizers update
///   only the first occurrence and leave the other at its old value, so the tie breaks
///   after one step (and the next step's ops differ: two autodiff leaves instead of
///   one). Every later occurrence is re-seated on the updated tensor.
/// - **Running statistics.** Burn's `RunningState` (BatchNorm's running mean and
///   variance) keeps a step's new value aside until the next read; `valid()` flushes
///   it into the module, where the trainer can see it, pin it and write it back.
pub(crate) fn settle<B: AutodiffBackend, M: AutodiffModule<B>>(model: M) -> M {
    let model = retie(model);
    flush_running_stats(&model);
    model
}

/// Flushes the values a step left aside in `model`'s running statistics (Burn's
/// `RunningState` keeps them until the next read) into the module. After a step that
/// stopped inside the closure (a trace that unwound) this must come before the model is
/// seated on its pins, so that the pins replace what the stopped step computed from
/// stand-ins: unflushed, the next step's first read would take it.
pub(crate) fn flush_running_stats<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) {
    let _flushed = model.valid();
}

/// Re-seats every occurrence of a `ParamId` after the first on the first one's tensor
/// (one autodiff leaf for all): what a module reached through two fields must hold.
pub(crate) fn retie<B: AutodiffBackend, M: AutodiffModule<B>>(model: M) -> M {
    if has_tied_params(&model) {
        model.map(&mut Retie::default())
    } else {
        model
    }
}

/// `model` with running statistics of its own: Burn's `RunningState` is shared between
/// clones of a module, so without this a clone kept by the user would see (and make)
/// the trainer's updates. Tied parameters stay tied.
pub(crate) fn with_own_state<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> M {
    retie(M::from_inner(model.valid()))
}

fn has_tied_params<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> bool {
    #[derive(Default)]
    struct Ids {
        seen: BTreeSet<ParamId>,
        tied: bool,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.tied |= !self.seen.insert(param.id);
        }
    }
    let mut ids = Ids::default();
    model.visit(&mut ids);
    ids.tied
}

/// Re-seats every occurrence of a `ParamId` after the first on the first one's tensor.
struct Retie<B: AutodiffBackend> {
    first: BTreeMap<ParamId, TensorPrimitive<B>>,
}

impl<B: AutodiffBackend> Default for Retie<B> {
    fn default() -> Self {
        Self {
            first: BTreeMap::new(),
        }
    }
}

impl<B: AutodiffBackend> ModuleMapper<B> for Retie<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let tensor = match self.first.get(&id) {
            Some(first) => Tensor::from_primitive(first.clone()),
            None => {
                self.first.insert(id, tensor.clone().into_primitive());
                tensor
            }
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}
