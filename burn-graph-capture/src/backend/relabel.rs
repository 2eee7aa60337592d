//! Moves Burn's backend-generic structs between `GraphCapture<B>` and `B`.
//!
//! A few op signatures use structs generic over the backend (`TensorPrimitive<B>`,
//! `MaxPool2dWithIndices<B>`, ...). Their fields are the same primitives on both sides,
//! so relabelling is a field-by-field move with no copy.

use burn_backend::TensorPrimitive;
use burn_backend::ops::{
    DeformConv2dBackward, MaxPool1dBackward, MaxPool1dWithIndices, MaxPool2dBackward,
    MaxPool2dWithIndices, TransactionPrimitive,
};
use burn_backend::quantization::QuantizationParametersPrimitive;

use super::session::OpRecorder;
use super::{GraphBackend, GraphCapture};

/// A struct of `GraphCapture<B>` primitives that has a twin over `B`.
pub(crate) trait Relabel {
    type Inner;
    fn to_inner(self) -> Self::Inner;
    fn from_inner(inner: Self::Inner) -> Self;
    /// Records the tensors it carries as op inputs, or as outputs when `output`.
    fn record(&self, recorder: &mut OpRecorder, output: bool);
}

impl<B: GraphBackend> Relabel for TensorPrimitive<GraphCapture<B>> {
    type Inner = TensorPrimitive<B>;
    fn to_inner(self) -> Self::Inner {
        match self {
            TensorPrimitive::Float(t) => TensorPrimitive::Float(t),
            TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(t),
        }
    }
    fn from_inner(inner: Self::Inner) -> Self {
        match inner {
            TensorPrimitive::Float(t) => TensorPrimitive::Float(t),
            TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(t),
        }
    }
    fn record(&self, recorder: &mut OpRecorder, output: bool) {
        match self {
            TensorPrimitive::Float(t) => recorder.tensor_as(t, output),
            TensorPrimitive::QFloat(t) => recorder.tensor_as(t, output),
        }
    }
}

impl<B: GraphBackend> Relabel for QuantizationParametersPrimitive<GraphCapture<B>> {
    type Inner = QuantizationParametersPrimitive<B>;
    fn to_inner(self) -> Self::Inner {
        QuantizationParametersPrimitive {
            scales: self.scales,
        }
    }
    fn from_inner(inner: Self::Inner) -> Self {
        Self {
            scales: inner.scales,
        }
    }
    fn record(&self, recorder: &mut OpRecorder, output: bool) {
        recorder.tensor_as(&self.scales, output)
    }
}

/// `execute_async` takes the transaction's ordering before calling `tr_execute`, so
/// rebuilding it from its four lists loses nothing.
impl<B: GraphBackend> Relabel for TransactionPrimitive<GraphCapture<B>> {
    type Inner = TransactionPrimitive<B>;
    fn to_inner(self) -> Self::Inner {
        TransactionPrimitive::new(
            self.read_floats,
            self.read_qfloats,
            self.read_ints,
            self.read_bools,
        )
    }
    fn from_inner(inner: Self::Inner) -> Self {
        TransactionPrimitive::new(
            inner.read_floats,
            inner.read_qfloats,
            inner.read_ints,
            inner.read_bools,
        )
    }
    fn record(&self, recorder: &mut OpRecorder, output: bool) {
        self.read_floats
            .iter()
            .for_each(|t| recorder.tensor_as(t, output));
        self.read_qfloats
            .iter()
            .for_each(|t| recorder.tensor_as(t, output));
        self.read_ints
            .iter()
            .for_each(|t| recorder.tensor_as(t, output));
        self.read_bools
            .iter()
            .for_each(|t| recorder.tensor_as(t, output));
    }
}

/// Relabels output structs, whose fields are all primitives.
macro_rules! relabel_outputs {
    ($($ty:ident { $($field:ident),* }),* $(,)?) => {$(
        impl<B: GraphBackend> Relabel for $ty<GraphCapture<B>> {
            type Inner = $ty<B>;
            fn to_inner(self) -> Self::Inner {
                $ty { $($field: self.$field),* }
            }
            fn from_inner(inner: Self::Inner) -> Self {
                $ty { $($field: inner.$field),* }
            }
            fn record(&self, recorder: &mut OpRecorder, output: bool) {
                $(recorder.tensor_as(&self.$field, output);)*
            }
        }
    )*};
}

relabel_outputs!(
    MaxPool1dWithIndices { output, indices },
    MaxPool2dWithIndices { output, indices },
    MaxPool1dBackward { x_grad },
    MaxPool2dBackward { x_grad },
);

impl<B: GraphBackend> Relabel for DeformConv2dBackward<GraphCapture<B>> {
    type Inner = DeformConv2dBackward<B>;
    fn to_inner(self) -> Self::Inner {
        DeformConv2dBackward {
            x_grad: self.x_grad,
            offset_grad: self.offset_grad,
            weight_grad: self.weight_grad,
            mask_grad: self.mask_grad,
            bias_grad: self.bias_grad,
        }
    }
    fn from_inner(inner: Self::Inner) -> Self {
        DeformConv2dBackward {
            x_grad: inner.x_grad,
            offset_grad: inner.offset_grad,
            weight_grad: inner.weight_grad,
            mask_grad: inner.mask_grad,
            bias_grad: inner.bias_grad,
        }
    }
    fn record(&self, recorder: &mut OpRecorder, output: bool) {
        recorder.tensor_as(&self.x_grad, output);
        recorder.tensor_as(&self.offset_grad, output);
        recorder.tensor_as(&self.weight_grad, output);
        recorder.optional_as(&self.mask_grad, output);
        recorder.optional_as(&self.bias_grad, output);
    }
}
