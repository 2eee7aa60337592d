//! Whether a model and an optimizer state belong together.
//!
//! A record loaded from another model gives the optimizer state for parameters the
//! model does not have (and none for those it has, which `init_state` then creates from
//! zero): training would silently start over. A model put back with another structure
//! makes every recorded step signature and pinned buffer meaningless. Both are checked
//! here, from parameter ids and shapes only (no device work).

use std::collections::{HashMap, HashSet};

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use super::error::StepError;
use crate::optim::{CapturableOptimizer, StateSlot};

/// Every float parameter's id and shape, in visiting order.
pub(crate) fn param_shapes<B: Backend, M: burn::module::Module<B>>(
    model: &M,
) -> Vec<(ParamId, Vec<usize>)> {
    struct Shapes(Vec<(ParamId, Vec<usize>)>);
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push((param.id, param.val().dims().to_vec()));
        }
    }
    let mut shapes = Shapes(Vec::new());
    model.visit(&mut shapes);
    shapes.0
}

/// Whether two models have the same parameter shapes in the same order (ids aside).
pub(crate) fn same_structure(a: &[(ParamId, Vec<usize>)], b: &[(ParamId, Vec<usize>)]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|((_, x), (_, y))| x == y)
}

/// The error for an optimizer whose state does not fit `model`: state of parameters
/// the model lacks, or of another size than the parameter it names.
pub(crate) fn state_mismatch<B, M, O>(model: &M, optimizer: &mut O) -> Option<StepError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: CapturableOptimizer<M, B>,
{
    let sizes: HashMap<ParamId, usize> = param_shapes(model)
        .into_iter()
        .map(|(id, shape)| (id, shape.iter().product()))
        .collect();
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
