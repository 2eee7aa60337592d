//! What the trainer needs to know about a batch: its tensors, checked and keyed.
//!
//! A replay reads the batch from static buffers that the trainer fills before every
//! launch, so the trainer must see every tensor of the batch, of every kind: a tensor
//! it does not see would be read by every replay as it was when the graph was captured.
//! The unlisted-input guard (`step::guard`) catches such a tensor and keeps its shape
//! eager; listing it, with `#[derive(StepInput)]`, makes it graph.

use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Bool, DType, Int, Shape, Tensor, TensorPrimitive};

use super::error::{EmptyBatch, StepError};
use crate::backend::{AnyTensor, GraphBackend};

/// A batch that a [`GraphTrainer`](super::GraphTrainer) can check, key graphs by and
/// copy into static buffers.
///
/// Implemented for float, int and bool tensors and for tuples of inputs. For a batch
/// struct, derive it: `#[derive(StepInput)]` lists every field, nested batch structs
/// included, in declaration order. The struct's first type parameter is its backend
/// (or say `#[step_input(backend = YourBackend)]` on the struct).
///
/// ```
/// use burn::prelude::*;
/// use burn_graph_capture::StepInput;
///
/// #[derive(Clone, StepInput)]
/// struct Tokens<B: Backend> {
///     ids: Tensor<B, 2, Int>,
///     padding: Tensor<B, 2, Bool>,
/// }
///
/// #[derive(Clone, StepInput)]
/// struct Batch<B: Backend> {
///     inputs: Tokens<B>,
///     targets: Tensor<B, 2, Int>,
///     /// Graphs are keyed by this host value: another value, another graph.
///     #[step_input(key)]
///     task: u8,
///     /// Never read by the step closure (a replay would not see it).
///     #[step_input(skip)]
///     source: String,
/// }
/// ```
///
/// No field is silently left out: one that is not an input must say what it is.
///
/// ```compile_fail,E0277
/// # use burn::prelude::*;
/// #[derive(Clone, burn_graph_capture::StepInput)]
/// struct Batch<B: Backend> {
///     x: Tensor<B, 2>,
///     name: String, // neither an input, nor `key`, nor `skip`
/// }
/// ```
///
/// A batch without a type parameter names its backend; without it, the derive says so.
///
/// ```compile_fail
/// # use burn::prelude::*;
/// type B = burn_graph_capture::TrainBackend<burn::backend::Flex>;
/// #[derive(Clone, burn_graph_capture::StepInput)]
/// struct Batch {
///     x: Tensor<B, 2>,
/// }
/// ```
pub trait StepInput<B: AutodiffBackend>: Sized {
    /// Appends the batch's tensors, as inner-backend primitives, in a fixed order.
    fn collect_tensors(&self, tensors: &mut Vec<AnyTensor<B::InnerBackend>>);

    /// The same batch with its tensors replaced, in
    /// [`collect_tensors`](Self::collect_tensors) order, by the next ones of `tensors`
    /// (the trainer's static input buffers on GPUs). A tensor missing there, or of
    /// another kind, stays as it is; a replay would then read it unlisted, which the
    /// trainer's guard refuses to capture.
    fn with_tensors(&self, tensors: &mut std::vec::IntoIter<AnyTensor<B::InnerBackend>>) -> Self;

    /// Feeds the host values the step depends on into `state`: a batch with other
    /// values gets its own graph. None by default.
    fn hash_key(&self, _state: &mut dyn Hasher) {}

    /// The batch's tensors, in [`collect_tensors`](Self::collect_tensors) order.
    fn tensors(&self) -> Vec<AnyTensor<B::InnerBackend>> {
        let mut tensors = Vec::new();
        self.collect_tensors(&mut tensors);
        tensors
    }
}

/// Implements `StepInput` for one tensor kind.
macro_rules! tensor_input {
    ($kind:ty, $variant:ident, $wrap:expr, $unwrap:expr) => {
        impl<B: AutodiffBackend, const D: usize> StepInput<B> for Tensor<B, D, $kind> {
            fn collect_tensors(&self, tensors: &mut Vec<AnyTensor<B::InnerBackend>>) {
                let unwrap = $unwrap;
                tensors.push(AnyTensor::$variant(unwrap(self.clone().inner())));
            }

            fn with_tensors(
                &self,
                tensors: &mut std::vec::IntoIter<AnyTensor<B::InnerBackend>>,
            ) -> Self {
                match tensors.next() {
                    Some(AnyTensor::$variant(primitive)) => {
                        let wrap = $wrap;
                        Tensor::from_inner(wrap(primitive))
                    }
                    _ => self.clone(),
                }
            }
        }
    };
}

tensor_input!(
    burn::tensor::Float,
    Float,
    |p| Tensor::from_primitive(TensorPrimitive::Float(p)),
    |t: Tensor<B::InnerBackend, D>| t.into_primitive().tensor()
);
tensor_input!(
    Int,
    Int,
    Tensor::from_primitive,
    Tensor::<B::InnerBackend, D, Int>::into_primitive
);
tensor_input!(
    Bool,
    Bool,
    Tensor::from_primitive,
    Tensor::<B::InnerBackend, D, Bool>::into_primitive
);

/// Implements `StepInput` for a tuple of inputs, in element order.
macro_rules! tuple_input {
    ($($name:ident . $index:tt),+) => {
        impl<B: AutodiffBackend, $($name: StepInput<B>),+> StepInput<B> for ($($name,)+) {
            fn collect_tensors(&self, tensors: &mut Vec<AnyTensor<B::InnerBackend>>) {
                $(self.$index.collect_tensors(tensors);)+
            }

            fn with_tensors(
                &self,
                tensors: &mut std::vec::IntoIter<AnyTensor<B::InnerBackend>>,
            ) -> Self {
                ($(self.$index.with_tensors(tensors),)+)
            }

            fn hash_key(&self, state: &mut dyn Hasher) {
                $(self.$index.hash_key(state);)+
            }
        }
    };
}

tuple_input!(X.0, Y.1);
tuple_input!(X.0, Y.1, Z.2);
tuple_input!(X.0, Y.1, Z.2, W.3);

/// Kinds, shapes and dtypes of a batch's tensors, and its host key: one graph per key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InputKey {
    pub(crate) tensors: Vec<(Shape, DType)>,
    pub(crate) host: u64,
}

impl InputKey {
    /// A key of float tensors of these shapes and no host values (tests).
    #[cfg(test)]
    pub(crate) fn of_shapes(shapes: impl IntoIterator<Item = Shape>) -> Self {
        Self {
            tensors: shapes.into_iter().map(|s| (s, DType::F32)).collect(),
            host: 0,
        }
    }
}

/// The host key of a batch: its `hash_key` values, hashed.
pub(crate) fn host_key<B: AutodiffBackend, I: StepInput<B>>(batch: &I) -> u64 {
    let mut state = DefaultHasher::new();
    batch.hash_key(&mut state);
    state.finish()
}

/// Checks a batch's tensors against the model's device and returns its key.
pub(crate) fn check_batch<G: GraphBackend>(
    tensors: &[AnyTensor<G>],
    device: &G::Device,
    host: u64,
) -> Result<InputKey, StepError> {
    if tensors.is_empty() {
        return Err(StepError::EmptyBatch(EmptyBatch::NoTensors));
    }
    check_devices(device, tensors.iter().map(AnyTensor::device))?;
    let mut key = Vec::with_capacity(tensors.len());
    for (index, tensor) in tensors.iter().enumerate() {
        let shape = tensor.shape();
        if shape.num_elements() == 0 {
            return Err(StepError::EmptyBatch(EmptyBatch::EmptyTensor {
                kind: tensor.kind(),
                index,
                shape: shape.as_slice().to_vec(),
            }));
        }
        key.push((shape, tensor.dtype()));
    }
    Ok(InputKey { tensors: key, host })
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

/// Hashes a host value of a batch into its key; what `#[step_input(key)]` calls.
#[doc(hidden)]
pub fn hash_key_value<T: Hash + ?Sized>(value: &T, mut state: &mut dyn Hasher) {
    value.hash(&mut state);
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
