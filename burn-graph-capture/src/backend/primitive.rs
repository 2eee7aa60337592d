//! A tensor primitive of any kind: what a batch lists and what the trainer pins.

use std::any::Any;
use std::fmt;

use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::{Backend, DType, Scalar, Shape, TensorMetadata};

use super::emulated::program::{Key, key_of};
use super::error::CopyMismatch;
use super::identity::{Allocated, AllocationId};
use super::tensor_kind::TensorKind;

/// A float, int or bool tensor primitive of backend `B`.
pub enum AnyTensor<B: Backend> {
    /// A float tensor.
    Float(FloatTensor<B>),
    /// An int tensor (token ids, targets, indices).
    Int(IntTensor<B>),
    /// A bool tensor (masks).
    Bool(BoolTensor<B>),
}

impl<B: Backend> AnyTensor<B> {
    /// The tensor's shape.
    pub fn shape(&self) -> Shape {
        match self {
            AnyTensor::Float(t) => t.shape(),
            AnyTensor::Int(t) => t.shape(),
            AnyTensor::Bool(t) => t.shape(),
        }
    }

    /// The tensor's element type.
    pub fn dtype(&self) -> DType {
        match self {
            AnyTensor::Float(t) => t.dtype(),
            AnyTensor::Int(t) => t.dtype(),
            AnyTensor::Bool(t) => t.dtype(),
        }
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> B::Device {
        match self {
            AnyTensor::Float(t) => B::float_device(t),
            AnyTensor::Int(t) => B::int_device(t),
            AnyTensor::Bool(t) => B::bool_device(t),
        }
    }

    /// Its kind.
    pub fn kind(&self) -> TensorKind {
        match self {
            AnyTensor::Float(_) => TensorKind::Float,
            AnyTensor::Int(_) => TensorKind::Int,
            AnyTensor::Bool(_) => TensorKind::Bool,
        }
    }

    /// A type-erased primitive (as sessions and traces keep them) as a tensor of `kind`
    /// of this backend, if it is one.
    pub(crate) fn downcast(kind: TensorKind, value: &dyn Any) -> Option<Self> {
        Some(match kind {
            TensorKind::Float => AnyTensor::Float(value.downcast_ref::<FloatTensor<B>>()?.clone()),
            TensorKind::Int => AnyTensor::Int(value.downcast_ref::<IntTensor<B>>()?.clone()),
            TensorKind::Bool => AnyTensor::Bool(value.downcast_ref::<BoolTensor<B>>()?.clone()),
        })
    }

    /// A copy from `src` into `self` needs one kind, shape and dtype on both sides.
    pub fn check_copy_from(&self, src: &Self) -> Result<(), CopyMismatch> {
        if self.kind() != src.kind() {
            return Err(CopyMismatch::Kind {
                dst: self.kind(),
                src: src.kind(),
            });
        }
        let (dst_shape, src_shape) = (self.shape(), src.shape());
        let (dst_dtype, src_dtype) = (self.dtype(), src.dtype());
        if dst_shape != src_shape || dst_dtype != src_dtype {
            return Err(CopyMismatch::Shape {
                dst_shape: dst_shape.to_vec(),
                dst_dtype,
                src_shape: src_shape.to_vec(),
                src_dtype,
            });
        }
        Ok(())
    }

    /// The same values in a buffer of their own (an identity op: `x * 1`, `x + 0`,
    /// `!!x`), so later writes into this tensor's buffer leave the copy as it is.
    pub fn fresh_copy(self) -> Self {
        match self {
            AnyTensor::Float(t) => {
                let one = Scalar::new(1.0f32, &t.dtype());
                AnyTensor::Float(B::float_mul_scalar(t, one))
            }
            AnyTensor::Int(t) => {
                let zero = Scalar::new(0i32, &t.dtype());
                AnyTensor::Int(B::int_add_scalar(t, zero))
            }
            AnyTensor::Bool(t) => AnyTensor::Bool(B::bool_not(B::bool_not(t))),
        }
    }

    /// The float primitive, if this is one.
    pub fn into_float(self) -> Option<FloatTensor<B>> {
        match self {
            AnyTensor::Float(t) => Some(t),
            _ => None,
        }
    }
}

impl<B> AnyTensor<B>
where
    B: Backend<
            FloatTensorPrimitive: Allocated,
            IntTensorPrimitive: Allocated,
            BoolTensorPrimitive: Allocated,
        >,
{
    /// The allocation the tensor reads.
    pub fn allocation_id(&self) -> Option<AllocationId> {
        match self {
            AnyTensor::Float(t) => t.allocation_id(),
            AnyTensor::Int(t) => t.allocation_id(),
            AnyTensor::Bool(t) => t.allocation_id(),
        }
    }

    /// The key a trace knows the tensor by: its allocation and view.
    pub(crate) fn trace_key(&self) -> Option<Key> {
        match self {
            AnyTensor::Float(t) => key_of(t),
            AnyTensor::Int(t) => key_of(t),
            AnyTensor::Bool(t) => key_of(t),
        }
    }
}

impl<B: Backend> Clone for AnyTensor<B> {
    fn clone(&self) -> Self {
        match self {
            AnyTensor::Float(t) => AnyTensor::Float(t.clone()),
            AnyTensor::Int(t) => AnyTensor::Int(t.clone()),
            AnyTensor::Bool(t) => AnyTensor::Bool(t.clone()),
        }
    }
}

impl<B: Backend> fmt::Debug for AnyTensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tensor {:?} {:?}",
            self.kind(),
            self.shape().as_slice(),
            self.dtype()
        )
    }
}
