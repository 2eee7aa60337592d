//! burn-train's step outputs as this crate's step items.
//!
//! A `TrainStep` computes its gradients itself, so its `TrainOutput` is a
//! [`StepOutput`] whose item is the output the metrics read. The trainer hands that item
//! back as owned copies, never as a graph's buffers, so it must list its tensors: the
//! outputs burn-train defines do here.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::train::{
    ClassificationOutput, MultiLabelClassificationOutput, RegressionOutput, TrainOutput,
};

use crate::backend::AnyTensor;
use crate::step::{StepError, StepInput, StepOutput};

/// Gradients from the user's `TrainStep`, and its output for the metrics.
impl<B: AutodiffBackend, T: StepInput<B>> StepOutput<B> for TrainOutput<T> {
    type Item = T;

    fn into_update<M: AutodiffModule<B>>(
        self,
        _model: &M,
    ) -> Result<(GradientsParams, T), StepError> {
        Ok((self.grads, self.item))
    }
}

/// `StepInput` for a burn-train output struct with `loss`, `output` and `targets`.
macro_rules! output_item {
    ($output:ident) => {
        impl<B: AutodiffBackend> StepInput<B> for $output<B> {
            fn collect_tensors(&self, tensors: &mut Vec<AnyTensor<B::InnerBackend>>) {
                self.loss.collect_tensors(tensors);
                self.output.collect_tensors(tensors);
                self.targets.collect_tensors(tensors);
            }

            fn with_tensors(
                &self,
                tensors: &mut std::vec::IntoIter<AnyTensor<B::InnerBackend>>,
            ) -> Self {
                Self {
                    loss: self.loss.with_tensors(tensors),
                    output: self.output.with_tensors(tensors),
                    targets: self.targets.with_tensors(tensors),
                }
            }
        }
    };
}

output_item!(RegressionOutput);
output_item!(ClassificationOutput);
output_item!(MultiLabelClassificationOutput);
