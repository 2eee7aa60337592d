//! Walking a module's parameters: creating their state and applying an update rule.
//!
//! Burn's optimizers visit parameters through `ModuleMapper`; so do these. Each
//! parameter with a gradient is flattened, updated by the rule on the inner backend,
//! reshaped back and re-wrapped with its `ParamId` and `require_grad` flag, exactly as
//! Burn's `OptimizerAdaptor` re-wraps it. Parameters without a gradient are left alone.

use std::collections::BTreeMap;

use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::grad_clipping::GradientClipping;
use burn::optim::{GradientsParams, MultiGradientsParams};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use super::UpdateRule;

pub(crate) type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Per-parameter state, ordered by `ParamId` so that every walk over it is stable.
pub(crate) type ParamStates<B> = BTreeMap<ParamId, Vec<Tensor<B, 1>>>;

/// Gradients of one device or of several (Burn's `step` and `step_multi`).
pub(crate) enum Grads {
    Single(GradientsParams),
    Multi(MultiGradientsParams),
}

impl Grads {
    /// Takes the gradient of `id`, on `device` (multi-device gradients are summed and
    /// moved there; single-device ones are used as they are).
    fn remove<B: Backend, const D: usize>(
        &mut self,
        id: ParamId,
        device: &B::Device,
    ) -> Option<Tensor<B, D>> {
        match self {
            Grads::Single(grads) => grads.remove(id),
            Grads::Multi(grads) => grads
                .remove::<B, D>(id)
                .map(|(grad, _)| grad.to_device(device)),
        }
    }
}

fn zeros<B: Backend>(slots: usize, numel: usize, device: &B::Device) -> Vec<Tensor<B, 1>> {
    (0..slots).map(|_| Tensor::zeros([numel], device)).collect()
}

/// Creates zero state for every trainable float parameter that has none yet.
pub(crate) struct StateInit<'a, B: Backend> {
    pub(crate) states: &'a mut ParamStates<B>,
    pub(crate) slots: usize,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for StateInit<'_, Inner<B>> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.slots == 0 || self.states.contains_key(&param.id) {
            return;
        }
        let value = param.val();
        if !value.is_require_grad() {
            return;
        }
        let numel = value.shape().num_elements();
        let state = zeros(self.slots, numel, &value.device());
        self.states.insert(param.id, state);
    }
}

/// Every float parameter's number of elements, by id.
pub(crate) fn param_sizes<B: AutodiffBackend, M: burn::module::Module<B>>(
    module: &M,
) -> BTreeMap<ParamId, usize> {
    struct Sizes(BTreeMap<ParamId, usize>);
    impl<B: Backend> ModuleVisitor<B> for Sizes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.insert(param.id, param.val().shape().num_elements());
        }
    }
    let mut sizes = Sizes(BTreeMap::new());
    module.visit(&mut sizes);
    sizes.0
}

/// Applies `rule` with this step's `terms` to every parameter that has a gradient.
pub(crate) struct RuleMapper<'a, B: AutodiffBackend, R: UpdateRule<Inner<B>>> {
    pub(crate) rule: &'a R,
    pub(crate) terms: &'a R::Terms,
    pub(crate) clipping: Option<&'a GradientClipping>,
    pub(crate) grads: &'a mut Grads,
    pub(crate) states: &'a mut ParamStates<Inner<B>>,
}

impl<B: AutodiffBackend, R: UpdateRule<Inner<B>>> ModuleMapper<B> for RuleMapper<'_, B, R> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let device = tensor.device();
        let Some(grad) = self.grads.remove::<Inner<B>, D>(id, &device) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let grad = match self.clipping {
            Some(clipping) => clipping.clip_gradient(grad),
            None => grad,
        };
        let require_grad = tensor.is_require_grad();
        let shape = tensor.shape();
        let numel = shape.num_elements();
        let slots = self.rule.slots();
        // State is normally created by `init_state`; creating it here keeps plain eager
        // use (and Burn's `Optimizer` trait) working without that call.
        let state = self
            .states
            .entry(id)
            .or_insert_with(|| zeros(slots, numel, &device));
        let flat = self.rule.apply(
            self.terms,
            tensor.inner().reshape([numel]),
            grad.reshape([numel]),
            state,
        );
        let mut tensor = Tensor::from_inner(flat.reshape(shape));
        if require_grad {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}
