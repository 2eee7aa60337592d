//! The recurrence on the CubeCL stacks (this crate's runtime and stock burn-cuda, with or
//! without fusion): per step one recurrent GEMM and one fused cell kernel forward, one
//! fused gate-gradient kernel and one GEMM backward; the recurrent weight gradient is
//! one GEMM over the whole sequence.
//!
//! States, gates and gate gradients are allocated contiguous and time-major, so each
//! step's GEMM operand is a packed slice of one block, which cuBLAS reads in place
//! (states are sliced as rows: `state_rows`).

mod fusion;
mod kernels;

use burn::tensor::Tensor;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn_backend::{DType, DeviceOps, Shape, TensorMetadata};
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl_runtime::server::ComputeServer;

use super::backend::{LstmKernels, LstmSaved, plain_backward, plain_forward, primitive, tensor};

/// Threads per cube of the cell kernels.
const CUBE_THREADS: u32 = 256;

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// Cubes covering one thread per `(batch, hidden unit)`.
fn cells(batch: usize, hidden: usize) -> (CubeCount, CubeDim) {
    let cubes = (batch * hidden).div_ceil(CUBE_THREADS as usize) as u32;
    (
        CubeCount::Static(cubes, 1, 1),
        CubeDim::new_1d(CUBE_THREADS),
    )
}

/// An uninitialised contiguous tensor like `like`'s, of `shape`.
fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: impl Into<Shape>) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        like.dtype,
    )
}

/// `a @ b` through cuBLAS on this crate's runtime (`backend::cublas`), else the
/// backend's own matmul: the recurrence's GEMMs are most of its time.
fn gemm<R, F, I, BT>(
    a: Tensor<Cube<R, F, I, BT>, 2>,
    b: Tensor<Cube<R, F, I, BT>, 2>,
) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    crate::backend::cublas::matmul_or(
        primitive(a),
        primitive(b),
        <Cube<R, F, I, BT> as FloatTensorOps<_>>::float_matmul,
    )
}

/// The packed states `[2, T+1, B, H]` as rows `[2(T+1)B, H]`, so that any step's `[B, H]`
/// block is a packed row slice. A slice of the 4-d tensor is not: its unit dimensions
/// keep the whole tensor's strides, and burn's reshape copies such a view.
fn state_rows<B: burn::tensor::backend::Backend>(states: FloatTensor<B>) -> Tensor<B, 2> {
    let states = tensor::<B, 4>(states);
    let [kinds, steps, batch, hidden] = states.dims();
    states.reshape([kinds * steps * batch, hidden])
}

/// Whether a step's hidden gradient is computed as `(W_h @ dz_t^T)^T`. At batch 8,
/// cuBLAS's heuristics give `dz_t @ W_h^T` an unsplit 32x128-tile kernel (54 µs a step at
/// h128 on the H200) and the transposed product a split-K GEMM (the step: 1.77 ms
/// against 4.61); at batches 32 and 128 the direct product is 3-5% faster
/// (`bench/results/lstm-2026-12-01.md`, session 13). Batches between were not measured.
fn hidden_gradient_transposed(batch: usize) -> bool {
    batch <= 16
}

/// Whether the fused kernels serve `dtype`; other dtypes run the plain recurrence.
fn fused_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
}

impl<R, F, I, BT> LstmKernels for Cube<R, F, I, BT>
where
    R: CubeRuntime,
    R::Server: ComputeServer,
    R::Device: DeviceOps,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn lstm_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        c0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        if !fused_dtype(xp.dtype) {
            return plain_forward::<Self>(xp, wh, h0, c0);
        }
        let [batch, time, four_h] = xp.shape().dims();
        let hidden = four_h / 4;
        let states = empty(&xp, [2, time + 1, batch, hidden]);
        let gates = empty(&xp, [time, batch, four_h]);
        let state_rows = state_rows::<Self>(states.clone());
        let wh = tensor::<Self, 2>(wh);
        let (count, dim) = cells(batch, hidden);
        for t in 0..time {
            let h_prev = match t {
                0 => tensor::<Self, 2>(h0.clone()),
                _ => state_rows
                    .clone()
                    .slice([t * batch..(t + 1) * batch, 0..hidden]),
            };
            let z = gemm(h_prev, wh.clone());
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

    fn lstm_backward(
        d_states: FloatTensor<Self>,
        saved: LstmSaved<Self>,
    ) -> [FloatTensor<Self>; 4] {
        if !fused_dtype(saved.states.dtype) {
            return plain_backward::<Self>(d_states, saved);
        }
        let LstmSaved { states, gates, wh } = saved;
        let [_, steps, batch, hidden] = states.shape().dims();
        let time = steps - 1;
        if time == 0 {
            return plain_backward::<Self>(d_states, LstmSaved { states, gates, wh });
        }
        let four_h = 4 * hidden;
        let dz = empty(&states, [time, batch, four_h]);
        let dc = empty(&states, [batch, hidden]);
        let all_dz = tensor::<Self, 3>(dz.clone());
        let wh = tensor::<Self, 2>(wh);
        // Each step's hidden gradient `dz_t @ W_h^T`, with `W_h^T` packed once per
        // sequence; at small batches as `(W_h @ dz_t^T)^T` instead (the same values).
        let wh_t = (!hidden_gradient_transposed(batch))
            .then(|| tensor::<Self, 2>(into_contiguous(primitive(wh.clone().transpose()))));
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
                Some(wh_t) => gemm(dz_t, wh_t.clone()),
                // `(W_h @ dz_t^T)^T`: the same values, another GEMM shape for cuBLAS.
                None => {
                    primitive(tensor::<Self, 2>(gemm(wh.clone(), dz_t.transpose())).transpose())
                }
            });
        }
        // `d_states` may be any view, so its initial-state gradients are added as
        // `[1, 1, B, H]` blocks: the sums are fresh packed tensors, and reshape them freely.
        let d_states = tensor::<Self, 4>(d_states);
        let with_initial = |grad: CubeTensor<R>, kind: usize| {
            let initial = d_states
                .clone()
                .slice([kind..kind + 1, 0..1, 0..batch, 0..hidden]);
            (tensor::<Self, 2>(grad).reshape([1, 1, batch, hidden]) + initial)
                .reshape([batch, hidden])
        };
        let d_h0 = with_initial(dh_rec.expect("time > 0"), 0);
        let d_c0 = with_initial(dc, 1);
        let h_prev = state_rows::<Self>(states).slice([0..time * batch, 0..hidden]);
        let d_wh = tensor::<Self, 2>(gemm(
            h_prev.transpose(),
            all_dz.clone().reshape([time * batch, four_h]),
        ));
        [
            primitive(all_dz.swap_dims(0, 1)),
            primitive(d_wh),
            primitive(d_h0),
            primitive(d_c0),
        ]
    }
}
