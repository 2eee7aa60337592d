//! Gates packed side by side, as both fused recurrences store them (`[rows, n · H]`
//! weights, `[n · H]` biases): packing Burn's per-gate `Linear`s, unpacking them again,
//! and drawing fresh ones per gate as Burn's modules do.

use burn::module::Param;
use burn::nn::{Initializer, Linear};
use burn::tensor::{Tensor, backend::Backend};

/// The gates' weights packed along the output dimension, and their biases if every gate
/// has one.
pub(crate) fn pack<B: Backend>(
    linears: &[&Linear<B>],
) -> (Param<Tensor<B, 2>>, Option<Param<Tensor<B, 1>>>) {
    let weight = Tensor::cat(linears.iter().map(|l| l.weight.val()).collect(), 1);
    let biases: Option<Vec<_>> = linears
        .iter()
        .map(|l| l.bias.as_ref().map(Param::val))
        .collect();
    (
        Param::from_tensor(weight.detach()),
        biases.map(|b| Param::from_tensor(Tensor::cat(b, 0).detach())),
    )
}

/// Gate `k`'s block of a weight packing `gates` gates.
pub(crate) fn unpack_weight<B: Backend>(
    weight: &Param<Tensor<B, 2>>,
    k: usize,
    gates: usize,
) -> Param<Tensor<B, 2>> {
    let h = weight.dims()[1] / gates;
    Param::from_tensor(weight.val().narrow(1, k * h, h).detach())
}

/// Gate `k`'s block of a bias packing `gates` gates.
pub(crate) fn unpack_bias<B: Backend>(
    bias: &Option<Param<Tensor<B, 1>>>,
    k: usize,
    gates: usize,
) -> Option<Param<Tensor<B, 1>>> {
    bias.as_ref().map(|b| {
        let h = b.dims()[0] / gates;
        Param::from_tensor(b.val().narrow(0, k * h, h).detach())
    })
}

/// A fresh `[rows, gates · hidden]` weight, drawn per gate as Burn's `Linear`s draw theirs
/// (fan-in `rows`, fan-out `hidden`).
pub(crate) fn init_weight<B: Backend>(
    initializer: &Initializer,
    rows: usize,
    hidden: usize,
    gates: usize,
    device: &B::Device,
) -> Param<Tensor<B, 2>> {
    let parts = (0..gates).map(|_| {
        initializer
            .init_with([rows, hidden], Some(rows), Some(hidden), device)
            .val()
    });
    Param::from_tensor(Tensor::cat(parts.collect(), 1).detach())
}

/// A fresh `[gates · hidden]` bias, drawn per gate as [`init_weight`]'s.
pub(crate) fn init_bias<B: Backend>(
    initializer: &Initializer,
    rows: usize,
    hidden: usize,
    gates: usize,
    device: &B::Device,
) -> Param<Tensor<B, 1>> {
    let parts = (0..gates).map(|_| {
        initializer
            .init_with([hidden], Some(rows), Some(hidden), device)
            .val()
    });
    Param::from_tensor(Tensor::cat(parts.collect(), 0).detach())
}
