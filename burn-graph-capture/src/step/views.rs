//! Copies of the trainer's model and optimizer that nothing the trainer does can change.
//!
//! Once a trainer pins (on GPUs, at its first capture), its model and optimizer sit on
//! the pinned buffers, and every later step writes their new values into those buffers
//! in place, as a replayed graph must. A clone of a tensor is a second handle on its
//! buffer, so a clone of the model would change under the user's feet. The trainer
//! therefore never lends its pinned tensors out: [`GraphTrainer::model`],
//! [`optimizer`](super::GraphTrainer::optimizer) and
//! [`take_model`](super::GraphTrainer::take_model) hand out copies in fresh buffers,
//! made at most once per step and only when asked for. A trainer that has not pinned
//! (every CPU trainer) lends its own tensors: eager steps never write in place, so
//! Burn's value semantics already hold.
//!
//! [`GraphTrainer::model`]: super::GraphTrainer::model

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use burn::module::{AutodiffModule, ModuleMapper, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use super::learner::{retie, with_own_state};
use crate::optim::CapturableOptimizer;

/// The copies lent out since the last step, and what making them cost.
pub(crate) struct Lent<M, O> {
    model: OnceLock<M>,
    optimizer: OnceLock<O>,
    /// Copies made so far, and the host milliseconds spent making them.
    stats: Mutex<(u64, f64)>,
}

impl<M, O> Default for Lent<M, O> {
    fn default() -> Self {
        Self {
            model: OnceLock::new(),
            optimizer: OnceLock::new(),
            stats: Mutex::new((0, 0.0)),
        }
    }
}

impl<M, O> Lent<M, O> {
    /// `model` to lend out, made once until the next [`clear`](Self::clear): with
    /// running statistics of its own, and, when `pinned`, its parameters in fresh
    /// buffers.
    pub(crate) fn model<B>(&self, model: &M, pinned: bool) -> &M
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
    {
        self.model.get_or_init(|| {
            if pinned {
                self.timed(|| copy_model(model))
            } else {
                with_own_state(model)
            }
        })
    }

    /// `optimizer` to lend out: itself, or when `pinned` a copy in fresh buffers, made
    /// once until the next [`clear`](Self::clear).
    pub(crate) fn optimizer<'a, B>(&'a self, optimizer: &'a O, pinned: bool) -> &'a O
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
        O: CapturableOptimizer<M, B> + Clone,
    {
        if !pinned {
            return optimizer;
        }
        self.optimizer
            .get_or_init(|| self.timed(|| copy_optimizer(optimizer)))
    }

    /// Forgets the copies: the trainer's tensors changed.
    pub(crate) fn clear(&mut self) {
        self.model.take();
        self.optimizer.take();
    }

    /// Copies made so far, and the host milliseconds spent making them.
    pub(crate) fn stats(&self) -> (u64, f64) {
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn timed<T>(&self, copy: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let copied = copy();
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        stats.0 += 1;
        stats.1 += started.elapsed().as_secs_f64() * 1e3;
        copied
    }
}

/// A copy of `model` in fresh buffers, with running statistics of its own (Burn's
/// `RunningState` is shared between clones), tied parameters tied, and every
/// parameter's `require_grad` flag kept.
pub(crate) fn copy_model<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> M {
    retie(M::from_inner(model.valid()).map(&mut Duplicate))
}

/// A copy of `optimizer` whose state tensors sit in fresh buffers.
pub(crate) fn copy_optimizer<B, M, O>(optimizer: &O) -> O
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: CapturableOptimizer<M, B> + Clone,
{
    let mut copy = optimizer.clone();
    copy.visit_state(&mut |_, tensor| *tensor = duplicate(tensor.clone()));
    copy
}

/// The tensor's values in a fresh buffer: `x · 1` is `x` exactly in IEEE arithmetic
/// (and CubeCL compiles without flush-to-zero).
fn duplicate<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Tensor<B, D> {
    tensor.mul_scalar(1.0)
}

/// Duplicates every float parameter of an autodiff module, keeping ids and
/// `require_grad` flags (`Param::from_mapped_value` reads the flag off the new tensor).
struct Duplicate;

impl<B: AutodiffBackend> ModuleMapper<B> for Duplicate {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let mut copy = Tensor::from_inner(duplicate(tensor.inner()));
        if require_grad {
            copy = copy.require_grad();
        }
        Param::from_mapped_value(id, copy, mapper)
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::backend::Flex;
    use burn::module::{Module, ModuleVisitor};
    use burn::nn::{Linear, LinearConfig};

    use super::*;
    use crate::backend::TrainBackend;

    type B = TrainBackend<Flex>;

    /// `(require_grad, values, storage address)` of every parameter.
    fn params(model: &Linear<B>) -> Vec<(bool, Vec<f32>, usize)> {
        struct Collect(Vec<(bool, Vec<f32>, usize)>);
        impl ModuleVisitor<B> for Collect {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let tensor = param.val();
                let primitive = tensor.clone().inner().into_primitive().tensor();
                let address = std::sync::Arc::as_ptr(&primitive.data_arc()) as usize;
                let values = tensor.into_data().to_vec::<f32>().unwrap();
                self.0.push((param.is_require_grad(), values, address));
            }
        }
        let mut collect = Collect(Vec::new());
        model.visit(&mut collect);
        collect.0
    }

    #[test]
    fn a_copy_keeps_values_and_flags_in_buffers_of_its_own() {
        let device = Default::default();
        let fresh = LinearConfig::new(3, 2).init::<B>(&device);
        let model = Linear {
            weight: Param::from_tensor(fresh.weight.val()),
            bias: fresh.bias.map(|bias| Param::from_tensor(bias.val())),
        };
        let frozen = Linear {
            weight: Param::from_tensor(model.weight.val()).set_require_grad(false),
            ..model.clone()
        };
        for model in [model, frozen] {
            let (original, copy) = (params(&model), params(&copy_model(&model)));
            assert_eq!(original.len(), copy.len());
            for ((flag, values, address), (copy_flag, copy_values, copy_address)) in
                original.iter().zip(&copy)
            {
                assert_eq!(flag, copy_flag, "require_grad kept");
                assert_eq!(values, copy_values, "values kept");
                assert_ne!(address, copy_address, "a buffer of its own");
            }
        }
    }
}
