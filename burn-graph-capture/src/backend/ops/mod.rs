//! `GraphCapture<B>`'s op traits: a generated table expanded by `forward_ops!`.

mod generated;

/// Names that the generated table refers to, as burn-backend's trait files spell them.
mod prelude {
    pub(super) use crate::backend::GraphCapture;
    pub(super) use crate::backend::forward::forward_ops;
    pub(super) use burn_backend::ops::*;
    pub(super) use burn_backend::quantization::*;
    pub(super) use burn_backend::tensor::Device;
    pub(super) use burn_backend::tensor::*;
    pub(super) use burn_backend::*;
    pub(super) use core::future::Future;
    pub(super) use core::ops::Range;
}
