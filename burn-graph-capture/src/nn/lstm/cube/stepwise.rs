//! The stepwise recurrence: per time step one recurrent GEMM and one fused cell kernel
//! forward, one fused gate-gradient kernel and one GEMM backward. It serves every shape
//! and dtype the fused kernels take (`strategy.rs` picks it where the persistent one does
//! not apply).

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn_backend::TensorMetadata;
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;

use super::{cells, kernels, state_rows};
use crate::nn::cube::{empty, gemm};
use crate::nn::lstm::backend::{primitive, tensor};

/// Whether a step's hidden gradient is computed as `(W_h @ dz_t^T)^T`. At batch 8,
/// cuBLAS's heuristics give `dz_t @ W_h^T` an unsplit 32x128-tile kernel (54 µs a step at
/// h128 on the H200) and the transposed product a split-K GEMM (the step: 1.77 ms
/// against 4.61); at batches 32 and 128 the direct product is 3-5% faster
/// (`bench/results/lstm-2026-12-01.md`, session 13). Batches between were not measured.
fn hidden_gradient_transposed(batch: usize) -> bool {
    batch <= 16
}

/// States `[2, T + 1, B, H]` and activated gates `[T, B, 4H]`.
pub(super) fn forward<B, R>(
    xp: CubeTensor<R>,
    wh: CubeTensor<R>,
    h0: CubeTensor<R>,
    c0: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>)
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>>,
    R: CubeRuntime,
{
    let [batch, time, four_h] = xp.shape().dims();
    let hidden = four_h / 4;
    let states = empty(&xp, [2, time + 1, batch, hidden]);
    let gates = empty(&xp, [time, batch, four_h]);
    let state_rows = state_rows::<B>(states.clone());
    let wh = tensor::<B, 2>(wh);
    let (count, dim) = cells(batch, hidden);
    for t in 0..time {
        let h_prev = match t {
            0 => tensor::<B, 2>(h0.clone()),
            _ => state_rows
                .clone()
                .slice([t * batch..(t + 1) * batch, 0..hidden]),
        };
        let z = gemm::<B, R>(h_prev, wh.clone());
        kernels::cell_forward::launch::<R>(
            &xp.client,
            count.clone(),
            dim,
            z.into_tensor_arg(),
            xp.clone().into_tensor_arg(),
            h0.clone().into_tensor_arg(),
            c0.clone().into_tensor_arg(),
            states.clone().into_tensor_arg(),
            gates.clone().into_tensor_arg(),
            t as u32,
            t == 0,
            xp.dtype.into(),
        );
    }
    (states, gates)
}

/// The gate gradients `dz` `[T, B, 4H]` and the initial state's gradients `[B, H]`
/// (hidden, cell), for `time > 0`.
pub(super) fn backward<B, R>(
    d_states: FloatTensor<B>,
    states: CubeTensor<R>,
    gates: CubeTensor<R>,
    wh: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>>,
    R: CubeRuntime,
{
    let [_, steps, batch, hidden] = states.shape().dims();
    let time = steps - 1;
    let four_h = 4 * hidden;
    let dz = empty(&states, [time, batch, four_h]);
    let dc = empty(&states, [batch, hidden]);
    let all_dz = tensor::<B, 3>(dz.clone());
    let wh = tensor::<B, 2>(wh);
    // Each step's hidden gradient `dz_t @ W_h^T`, with `W_h^T` packed once per
    // sequence; at small batches as `(W_h @ dz_t^T)^T` instead (the same values).
    let wh_t = (!hidden_gradient_transposed(batch))
        .then(|| tensor::<B, 2>(into_contiguous(primitive(wh.clone().transpose()))));
    let (count, dim) = cells(batch, hidden);
    let mut dh_rec: Option<CubeTensor<R>> = None;
    for t in (0..time).rev() {
        let last = dh_rec.is_none();
        // The last step reads no carried gradient; any tensor fills the slot.
        let carried = dh_rec.take().unwrap_or_else(|| dc.clone());
        kernels::cell_backward::launch::<R>(
            &states.client,
            count.clone(),
            dim,
            d_states.clone().into_tensor_arg(),
            states.clone().into_tensor_arg(),
            gates.clone().into_tensor_arg(),
            carried.into_tensor_arg(),
            dc.clone().into_tensor_arg(),
            dz.clone().into_tensor_arg(),
            t as u32,
            last,
            states.dtype.into(),
        );
        let dz_t = all_dz
            .clone()
            .slice([t..t + 1, 0..batch, 0..four_h])
            .reshape([batch, four_h]);
        dh_rec = Some(match &wh_t {
            Some(wh_t) => gemm::<B, R>(dz_t, wh_t.clone()),
            // `(W_h @ dz_t^T)^T`: the same values, another GEMM shape for cuBLAS.
            None => {
                primitive(tensor::<B, 2>(gemm::<B, R>(wh.clone(), dz_t.transpose())).transpose())
            }
        });
    }
    // `d_states` may be any view, so its initial-state gradients are added as
    // `[1, 1, B, H]` blocks: the sums are fresh packed tensors, and reshape them freely.
    let d_states = tensor::<B, 4>(d_states);
    let with_initial = |grad: CubeTensor<R>, kind: usize| {
        let initial = d_states
            .clone()
            .slice([kind..kind + 1, 0..1, 0..batch, 0..hidden]);
        primitive(
            (tensor::<B, 2>(grad).reshape([1, 1, batch, hidden]) + initial)
                .reshape([batch, hidden]),
        )
    };
    let d_h0 = with_initial(dh_rec.expect("time > 0"), 0);
    let d_c0 = with_initial(dc, 1);
    (dz, d_h0, d_c0)
}
