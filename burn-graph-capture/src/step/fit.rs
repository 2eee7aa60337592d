//! Whether a model and an optimizer state belong together.
//!
//! A record loaded from another model gives the optimizer state for parameters the
//! model does not have (and none for those it has, which `init_state` then creates from
//! zero): training would silently start over. A model put back with another structure
//! (other ids, shapes, or trainable parameters) makes every recorded step signature and
//! pinned buffer meaningless. Both are checked here, from parameter ids, shapes and
//! flags only (no device work).

use std::collections::{HashMap, HashSet};

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use super::error::StepError;
use crate::optim::{CapturableOptimizer, StateSlot};

/// What a model's parameters are, for telling whether recorded steps still apply:
/// every float parameter's id, shape and whether it trains, in visiting order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Structure(Vec<(ParamId, Vec<usize>, bool)>);

impl Structure {
    pub(crate) fn of<B: Backend, M: burn::module::Module<B>>(model: &M) -> Self {
        struct Visit(Vec<(ParamId, Vec<usize>, bool)>);
        impl<B: Backend> ModuleVisitor<B> for Visit {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let value = param.val();
                let trains = value.is_require_grad();
                self.0.push((param.id, value.dims().to_vec(), trains));
            }
        }
        let mut visit = Visit(Vec::new());
        model.visit(&mut visit);
        Structure(visit.0)
    }

    /// Each parameter's number of elements, by id.
    fn sizes(&self) -> HashMap<ParamId, usize> {
        self.0
            .iter()
            .map(|(id, shape, _)| (*id, shape.iter().product()))
            .collect()
    }
}

/// The error for an optimizer whose state does not fit `model`: state of parameters
/// the model lacks, or of another size than the parameter it names.
pub(crate) fn state_mismatch<B, M, O>(model: &M, optimizer: &mut O) -> Option<StepError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: CapturableOptimizer<M, B>,
{
    let sizes = Structure::of(model).sizes();
    let mut foreign = HashSet::new();
    let mut misshapen = HashSet::new();
    optimizer.visit_state(&mut |slot, tensor| {
        let StateSlot::Param { id, .. } = slot else {
            return;
        };
        match sizes.get(&id) {
            None => {
                foreign.insert(id);
            }
            Some(&size) if size != tensor.shape().num_elements() => {
                misshapen.insert(id);
            }
            Some(_) => {}
        }
    });
    (!foreign.is_empty() || !misshapen.is_empty()).then_some(StepError::OptimizerStateMismatch {
        foreign: foreign.len(),
        misshapen: misshapen.len(),
    })
}
