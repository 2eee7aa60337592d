//! [`Capturable`]: an [`UpdateRule`] plus its device state, as an optimizer.
//!
//! It implements both this crate's [`CapturableOptimizer`] (what the step API captures)
//! and Burn's own [`Optimizer`], so the same optimizer, and its checkpoints, also work in
//! an ordinary Burn training loop.
//!
//! Two entry points, on purpose:
//! - [`CapturableOptimizer::step`] takes no learning rate. It reads the learning-rate
//!   tensor, which [`CapturableOptimizer::set_lr`] (or the step API, writing into the
//!   pinned buffer) changes between steps. This is the one to capture.
//! - [`Optimizer::step`] takes `lr: f64` as Burn's trait demands. It first uploads `lr`
//!   into the learning-rate tensor, then steps. The upload is a host-to-device transfer,
//!   so this entry point is for eager training only; the arithmetic is the same.
//!
//! Both traits name their methods `step`, `to_record` and `load_record`, so a call on
//! the concrete type would be ambiguous with both in scope. The capturable API is
//! therefore also inherent: `optim.step(module, grads)` always means the capturable
//! step; Burn's is `Optimizer::step(&mut optim, lr, module, grads)` (generic code bound
//! by `O: Optimizer` calls it as usual).

use std::collections::BTreeMap;

use burn::module::AutodiffModule;
use burn::optim::grad_clipping::GradientClipping;
use burn::optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::mapping::{Grads, Inner, ParamStates, RuleMapper, StateInit, param_sizes};
use super::{CapturableOptimizer, CapturableRecord, DeviceScalars, StateSlot, UpdateRule};

/// A capturable optimizer: the rule `R` (SGD, Adam, AdamW) and all its state on the
/// device. Built by the configs, e.g. [`CapturableAdamConfig`](super::CapturableAdamConfig).
///
/// The step count is global: it advances once per step, not per parameter. Burn counts
/// per parameter, so the two differ only for a parameter that misses its gradient in
/// some steps (e.g. one that is used conditionally); with static control flow, which
/// capture requires anyway, every parameter gets a gradient every step.
#[derive(Clone)]
pub struct Capturable<R, B: AutodiffBackend> {
    rule: R,
    clipping: Option<GradientClipping>,
    scalars: DeviceScalars<Inner<B>>,
    states: ParamStates<Inner<B>>,
}

impl<R, B> Capturable<R, B>
where
    R: UpdateRule<Inner<B>>,
    B: AutodiffBackend,
{
    /// An optimizer with learning rate `lr`, no steps taken, on `device`.
    pub fn new(
        rule: R,
        clipping: Option<GradientClipping>,
        lr: LearningRate,
        device: &B::Device,
    ) -> Self {
        Self {
            rule,
            clipping,
            scalars: DeviceScalars::new(lr, device),
            states: BTreeMap::new(),
        }
    }

    /// The update rule (its constants).
    pub fn rule(&self) -> &R {
        &self.rule
    }

    /// The learning-rate and step-count tensors.
    pub fn scalars(&self) -> &DeviceScalars<Inner<B>> {
        &self.scalars
    }

    /// Creates zero state for every trainable parameter of `module` that has none.
    /// See [`CapturableOptimizer::init_state`].
    pub fn init_state<M: AutodiffModule<B>>(&mut self, module: &M) {
        module.visit(&mut StateInit {
            states: &mut self.states,
            slots: self.rule.slots(),
        });
    }

    /// Makes the state fit `module`: drops the state of parameters it lacks or has
    /// resized, then creates zero state where it is missing. See
    /// [`CapturableOptimizer::fit_state`].
    pub fn fit_state<M: AutodiffModule<B>>(&mut self, module: &M) {
        let sizes = param_sizes(module);
        self.states.retain(|id, state| {
            let size = state.first().map(|tensor| tensor.shape().num_elements());
            sizes
                .get(id)
                .is_some_and(|&numel| size.is_none_or(|s| s == numel))
        });
        self.init_state(module);
    }

    /// One update with the learning rate in the lr tensor. See
    /// [`CapturableOptimizer::step`].
    pub fn step<M: AutodiffModule<B>>(&mut self, module: M, grads: GradientsParams) -> M {
        self.step_grads(module, Grads::Single(grads))
    }

    /// Replaces the learning-rate tensor. See [`CapturableOptimizer::set_lr`].
    pub fn set_lr(&mut self, lr: LearningRate) {
        self.scalars.set_lr(lr);
    }

    /// The state as a record (a copy of the tensor handles).
    pub fn to_record(&self) -> CapturableRecord<B> {
        CapturableRecord {
            lr: self.scalars.lr.clone(),
            step: self.scalars.step.clone(),
            params: self.states.clone(),
        }
    }

    /// Restores the state, learning rate and step count from a record.
    pub fn load_record(mut self, record: CapturableRecord<B>) -> Self {
        self.scalars = DeviceScalars {
            lr: record.lr,
            step: record.step,
        };
        self.states = record.params;
        self
    }

    fn step_grads<M: AutodiffModule<B>>(&mut self, module: M, mut grads: Grads) -> M {
        let (before, after) = self.scalars.advance();
        let terms = self.rule.terms(&self.scalars.lr, &before, &after);
        module.map(&mut RuleMapper::<B, R> {
            rule: &self.rule,
            terms: &terms,
            clipping: self.clipping.as_ref(),
            grads: &mut grads,
            states: &mut self.states,
        })
    }
}

impl<R, M, B> CapturableOptimizer<M, B> for Capturable<R, B>
where
    R: UpdateRule<Inner<B>>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    type Record = CapturableRecord<B>;

    fn init_state(&mut self, module: &M) {
        Capturable::init_state(self, module);
    }

    fn fit_state(&mut self, module: &M) {
        Capturable::fit_state(self, module);
    }

    fn step(&mut self, module: M, grads: GradientsParams) -> M {
        Capturable::step(self, module, grads)
    }

    fn set_lr(&mut self, lr: LearningRate) {
        Capturable::set_lr(self, lr);
    }

    fn visit_state(&mut self, visitor: &mut dyn FnMut(StateSlot, &mut Tensor<Inner<B>, 1>)) {
        visitor(StateSlot::LearningRate, &mut self.scalars.lr);
        visitor(StateSlot::StepCount, &mut self.scalars.step);
        for (id, state) in self.states.iter_mut() {
            for (index, tensor) in state.iter_mut().enumerate() {
                visitor(StateSlot::Param { id: *id, index }, tensor);
            }
        }
    }

    fn to_record(&self) -> Self::Record {
        Capturable::to_record(self)
    }

    fn load_record(self, record: Self::Record) -> Self {
        Capturable::load_record(self, record)
    }
}

/// Burn's optimizer trait. `lr` is uploaded into the learning-rate tensor before the
/// step (eager use only, see the module docs); records are the same as above.
impl<R, M, B> Optimizer<M, B> for Capturable<R, B>
where
    R: UpdateRule<Inner<B>>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    type Record = CapturableRecord<B>;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        self.scalars.set_lr(lr);
        self.step_grads(module, Grads::Single(grads))
    }

    /// Sums each parameter's gradients from all devices onto the parameter's device,
    /// as Burn does; the optimizer's own state stays on the device it was built on, so
    /// parameters must live there too.
    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        self.scalars.set_lr(lr);
        self.step_grads(module, Grads::Multi(grads))
    }

    fn to_record(&self) -> Self::Record {
        Capturable::to_record(self)
    }

    fn load_record(self, record: Self::Record) -> Self {
        Capturable::load_record(self, record)
    }
}
