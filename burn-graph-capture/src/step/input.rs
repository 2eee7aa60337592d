//! What the trainer needs to know about a batch: its tensors, checked and keyed.

use std::fmt::Debug;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata, TensorPrimitive};
use burn_backend::tensor::FloatTensor;

use super::error::StepError;
use crate::backend::GraphBackend;

/// A batch that a [`GraphTrainer`](super::GraphTrainer) can check and key graphs by.
///
/// Implemented for float tensors and tuples of inputs; implement it for your batch
/// struct by listing its tensors in a fixed order.
pub trait StepInput<B: AutodiffBackend>: Sized {
    /// The batch's float tensors, as inner-backend primitives, in a fixed order.
    fn float_tensors(&self) -> Vec<FloatTensor<B::InnerBackend>>;

    /// The same batch with its tensors replaced, in [`float_tensors`](Self::float_tensors)
    /// order, by `tensors` (the trainer's static input buffers on GPUs). Takes from the
    /// front of `tensors` what this batch needs.
    fn with_float_tensors(
        &self,
        tensors: &mut std::vec::IntoIter<FloatTensor<B::InnerBackend>>,
    ) -> Self;
}

impl<B: AutodiffBackend, const D: usize> StepInput<B> for Tensor<B, D> {
    fn float_tensors(&self) -> Vec<FloatTensor<B::InnerBackend>> {
        vec![self.clone().inner().into_primitive().tensor()]
    }

    fn with_float_tensors(
        &self,
        tensors: &mut std::vec::IntoIter<FloatTensor<B::InnerBackend>>,
    ) -> Self {
        match tensors.next() {
            Some(tensor) => {
                Tensor::from_inner(Tensor::from_primitive(TensorPrimitive::Float(tensor)))
            }
            None => self.clone(),
        }
    }
}

impl<B: AutodiffBackend, X: StepInput<B>, Y: StepInput<B>> StepInput<B> for (X, Y) {
    fn float_tensors(&self) -> Vec<FloatTensor<B::InnerBackend>> {
        let mut tensors = self.0.float_tensors();
        tensors.extend(self.1.float_tensors());
        tensors
    }

    fn with_float_tensors(
        &self,
        tensors: &mut std::vec::IntoIter<FloatTensor<B::InnerBackend>>,
    ) -> Self {
        let x = self.0.with_float_tensors(tensors);
        (x, self.1.with_float_tensors(tensors))
    }
}

impl<B: AutodiffBackend, X: StepInput<B>, Y: StepInput<B>, Z: StepInput<B>> StepInput<B>
    for (X, Y, Z)
{
    fn float_tensors(&self) -> Vec<FloatTensor<B::InnerBackend>> {
        let mut tensors = self.0.float_tensors();
        tensors.extend(self.1.float_tensors());
        tensors.extend(self.2.float_tensors());
        tensors
    }

    fn with_float_tensors(
        &self,
        tensors: &mut std::vec::IntoIter<FloatTensor<B::InnerBackend>>,
    ) -> Self {
        let x = self.0.with_float_tensors(tensors);
        let y = self.1.with_float_tensors(tensors);
        (x, y, self.2.with_float_tensors(tensors))
    }
}

/// Shapes and dtypes of a batch: one graph per key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InputKey(pub(crate) Vec<(Shape, DType)>);

/// Checks a batch against the model's device and returns its key.
pub(crate) fn check_batch<G: GraphBackend>(
    tensors: &[FloatTensor<G>],
    device: &G::Device,
) -> Result<InputKey, StepError> {
    if tensors.is_empty() {
        return Err(StepError::EmptyBatch("the batch has no tensors".into()));
    }
    check_devices(device, tensors.iter().map(G::float_device))?;
    let mut key = Vec::with_capacity(tensors.len());
    for (index, tensor) in tensors.iter().enumerate() {
        let shape = tensor.shape();
        if shape.num_elements() == 0 {
            return Err(StepError::EmptyBatch(format!(
                "tensor {index} has shape {:?}",
                shape.as_slice()
            )));
        }
        key.push((shape, tensor.dtype()));
    }
    Ok(InputKey(key))
}

/// Every tensor's device must be the model's.
fn check_devices<D: PartialEq + Debug>(
    expected: &D,
    found: impl Iterator<Item = D>,
) -> Result<(), StepError> {
    for (index, device) in found.enumerate() {
        if &device != expected {
            return Err(StepError::WrongDevice {
                index,
                expected: format!("{expected:?}"),
                found: format!("{device:?}"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    enum FakeDevice {
        Gpu(u8),
    }

    #[test]
    fn a_tensor_on_another_device_is_named() {
        let found = [FakeDevice::Gpu(0), FakeDevice::Gpu(1)];
        let error = check_devices(&FakeDevice::Gpu(0), found.into_iter()).unwrap_err();
        assert_eq!(
            error,
            StepError::WrongDevice {
                index: 1,
                expected: "Gpu(0)".into(),
                found: "Gpu(1)".into()
            }
        );
        assert!(check_devices(&FakeDevice::Gpu(0), [FakeDevice::Gpu(0)].into_iter()).is_ok());
    }
}
