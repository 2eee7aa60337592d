//! The per-algorithm part of a capturable optimizer, apart from the machinery.
//!
//! SGD, Adam and AdamW differ only in the arithmetic applied to one flattened parameter.
//! An [`UpdateRule`] states that arithmetic; [`Capturable`](super::Capturable) does the
//! rest (parameter mapping, state creation, records, both optimizer traits) once for all.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// The arithmetic of one optimizer, on the inner backend `B`.
///
/// Implementations hold only constants (betas, epsilon, penalties); everything that
/// changes between steps arrives as a device tensor, so the ops of a step never depend
/// on the step number (I3).
pub trait UpdateRule<B: Backend>: Clone + Send + Sync {
    /// Device terms shared by all parameters of one step (e.g. bias corrections).
    type Terms;

    /// How many state tensors each parameter has.
    fn slots(&self) -> usize;

    /// Computes this step's terms from the learning rate and the step count before and
    /// after this step (`after = before + 1`), all `[1]`-shaped.
    fn terms(&self, lr: &Tensor<B, 1>, before: &Tensor<B, 1>, after: &Tensor<B, 1>) -> Self::Terms;

    /// Updates one flattened parameter given its flattened gradient; replaces its state
    /// tensors (`state.len() == self.slots()`, zeros before the first step) in place.
    fn apply(
        &self,
        terms: &Self::Terms,
        param: Tensor<B, 1>,
        grad: Tensor<B, 1>,
        state: &mut [Tensor<B, 1>],
    ) -> Tensor<B, 1>;
}
