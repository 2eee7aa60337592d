//! The optimizer a `Learner` holds when a [`GraphStrategy`](super::GraphStrategy)
//! trains it.
//!
//! burn-train's `Learner` keeps its optimizer private: a strategy can neither read it
//! (to train with it) nor see what a resumed checkpoint loaded into it. Both the
//! `Learner` and the strategy therefore hold one [`SharedOptimizer`]: clones share one
//! cell, so the state the `Learner` restores from a checkpoint is the state the strategy
//! trains from, and the state the strategy writes back before each checkpoint is what
//! the `Learner` saves.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;

/// A capturable optimizer in a cell shared by its clones (see the module docs).
pub struct SharedOptimizer<O> {
    cell: Arc<Mutex<O>>,
}

impl<O> Clone for SharedOptimizer<O> {
    fn clone(&self) -> Self {
        Self {
            cell: Arc::clone(&self.cell),
        }
    }
}

impl<O> SharedOptimizer<O> {
    /// Shares `optimizer`.
    pub fn new(optimizer: O) -> Self {
        Self {
            cell: Arc::new(Mutex::new(optimizer)),
        }
    }

    /// A copy of the optimizer as it is now.
    pub fn get(&self) -> O
    where
        O: Clone,
    {
        self.lock().clone()
    }

    /// Replaces the optimizer every clone sees.
    pub fn set(&self, optimizer: O) {
        *self.lock() = optimizer;
    }

    fn lock(&self) -> MutexGuard<'_, O> {
        // The cell only ever holds a whole optimizer: a panic elsewhere cannot leave
        // it half-written.
        self.cell.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Burn's optimizer trait, for the `Learner`: steps (used only where the strategy runs
/// burn-train's own loop, with gradient accumulation) and records go to the shared
/// optimizer.
impl<O, M, B> Optimizer<M, B> for SharedOptimizer<O>
where
    O: Optimizer<M, B>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    type Record = O::Record;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        self.lock().step(lr, module, grads)
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        self.lock().step_multi(lr, module, grads)
    }

    fn to_record(&self) -> Self::Record {
        self.lock().to_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        {
            let mut optimizer = self.lock();
            let loaded = optimizer.clone().load_record(record);
            *optimizer = loaded;
        }
        self
    }
}
