//! Copies of the trainer's model and optimizer that nothing the trainer does can change.
//!
//! Once a trainer pins (on GPUs, at its first capture), its model and optimizer sit on
//! the pinned buffers, and every later step writes their new values into those buffers
//! in place, as a replayed graph must. A clone of a tensor is a second handle on its
//! buffer, so a clone of the model would change under the user's feet. The trainer
//! therefore never lends its pinned tensors out: [`GraphTrainer::model`],
//! [`optimizer`](super::GraphTrainer::optimizer) and
//! [`take_model`](super::GraphTrainer::take_model) hand out copies in fresh buffers,
//! made at most once per step and only when asked for. The copies lie in their buffers
//! as the trainer's tensors do (`GraphBackend::duplicate`): kernels follow strides, so
//! an evaluation on a copy, or training on one put back, runs what it would on the
//! original (an `x * 1` copy would pitch packed rows, and round apart). A trainer that has not pinned
//! (every CPU trainer) lends its own tensors: eager steps never write in place, so
//! Burn's value semantics already hold.
//!
//! [`GraphTrainer::model`]: super::GraphTrainer::model

use std::marker::PhantomData;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use burn::module::{AutodiffModule, ModuleMapper, Param};
use burn::tensor::{Tensor, TensorPrimitive};

use super::learner::{retie, with_own_state};
use crate::backend::{AnyTensor, GraphBackend, GraphCapture, TrainBackend};
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
    pub(crate) fn model<G>(&self, model: &M, pinned: bool) -> &M
    where
        G: GraphBackend,
        M: AutodiffModule<TrainBackend<G>>,
    {
        self.model.get_or_init(|| {
            if pinned {
                self.timed(|| copy_model::<G, M>(model))
            } else {
                with_own_state(model)
            }
        })
    }

    /// `optimizer` to lend out: itself, or when `pinned` a copy in fresh buffers, made
    /// once until the next [`clear`](Self::clear).
    pub(crate) fn optimizer<'a, G>(&'a self, optimizer: &'a O, pinned: bool) -> &'a O
    where
        G: GraphBackend,
        M: AutodiffModule<TrainBackend<G>>,
        O: CapturableOptimizer<M, TrainBackend<G>> + Clone,
    {
        if !pinned {
            return optimizer;
        }
        self.optimizer
            .get_or_init(|| self.timed(|| copy_optimizer::<G, M, O>(optimizer)))
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

/// A copy of `model` in fresh buffers, laid out as the model's own (so that code on
/// the copy runs the kernels code on the model would: `backend::layout`), with running
/// statistics of its own (Burn's `RunningState` is shared between clones), tied
/// parameters tied, and every parameter's `require_grad` flag kept.
pub(crate) fn copy_model<G: GraphBackend, M: AutodiffModule<TrainBackend<G>>>(model: &M) -> M {
    retie(M::from_inner(model.valid()).map(&mut Duplicate::<G>(PhantomData)))
}

/// A copy of `optimizer` whose state tensors sit in fresh buffers, laid out as its own.
pub(crate) fn copy_optimizer<G, M, O>(optimizer: &O) -> O
where
    G: GraphBackend,
    M: AutodiffModule<TrainBackend<G>>,
    O: CapturableOptimizer<M, TrainBackend<G>> + Clone,
{
    let mut copy = optimizer.clone();
    copy.visit_state(&mut |_, tensor| *tensor = duplicate::<G, 1>(tensor.clone()));
    copy
}

/// The tensor's values in a fresh buffer, laid out as they lie (`GraphBackend::duplicate`).
/// If the backend cannot copy so, `x · 1`: the same values (exact in IEEE arithmetic, and
/// CubeCL compiles without flush-to-zero), in a layout the backend picks.
fn duplicate<G: GraphBackend, const D: usize>(
    tensor: Tensor<GraphCapture<G>, D>,
) -> Tensor<GraphCapture<G>, D> {
    let primitive = tensor.clone().into_primitive().tensor();
    match G::duplicate(AnyTensor::Float(primitive)).map(AnyTensor::into_float) {
        Ok(Some(copy)) => Tensor::from_primitive(TensorPrimitive::Float(copy)),
        failed => {
            tracing::warn!(
                ?failed,
                "a layout-keeping copy failed; lending an x * 1 copy"
            );
            tensor.mul_scalar(1.0)
        }
    }
}

/// Duplicates every float parameter of an autodiff module, keeping ids and
/// `require_grad` flags (`Param::from_mapped_value` reads the flag off the new tensor).
struct Duplicate<G>(PhantomData<G>);

impl<G: GraphBackend> ModuleMapper<TrainBackend<G>> for Duplicate<G> {
    fn map_float<const D: usize>(
        &mut self,
        param: Param<Tensor<TrainBackend<G>, D>>,
    ) -> Param<Tensor<TrainBackend<G>, D>> {
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let mut copy = Tensor::from_inner(duplicate::<G, D>(tensor.inner()));
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
            let (original, copy) = (params(&model), params(&copy_model::<Flex, _>(&model)));
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
