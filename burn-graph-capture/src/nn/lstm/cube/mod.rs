//! The LSTM recurrence on the CubeCL stacks (this crate's runtime and stock burn-cuda, with
//! or without fusion). `nn::strategy` picks, per shape, one of two ways to run the time
//! loop: `stepwise` (a GEMM and a fused cell kernel per step each way) or `persistent` (one
//! cooperative launch each way, this crate's runtime only). Either way the recurrent
//! weight gradient is one GEMM over the whole sequence, here.
//!
//! States, gates and gate gradients are allocated contiguous and time-major, so each
//! step's GEMM operand is a packed slice of one block, which cuBLAS reads in place
//! (states are sliced as rows: `state_rows`).

mod fusion;
mod kernels;
mod persistent;
mod stepwise;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn_backend::{DeviceOps, TensorMetadata};
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl_runtime::server::ComputeServer;

use super::backend::{LstmKernels, LstmSaved, plain_backward, plain_forward, primitive, tensor};
use crate::nn::cube::{fused_dtype, gemm, on_graph_runtime, recurrence};
use crate::nn::strategy::{Cell, Direction, Recurrence, RecurrenceShape};

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

/// The packed states `[2, T+1, B, H]` as rows `[2(T+1)B, H]`, so that any step's `[B, H]`
/// block is a packed row slice. A slice of the 4-d tensor is not: its unit dimensions
/// keep the whole tensor's strides, and burn's reshape copies such a view.
fn state_rows<B: Backend>(states: FloatTensor<B>) -> Tensor<B, 2> {
    let states = tensor::<B, 4>(states);
    let [kinds, steps, batch, hidden] = states.dims();
    states.reshape([kinds * steps * batch, hidden])
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
        let shape = RecurrenceShape {
            batch,
            time,
            hidden: four_h / 4,
        };
        if let Recurrence::Persistent(grid) = recurrence(Cell::Lstm, Direction::Forward, &xp, shape)
            && let Some(out) = on_graph_runtime([&xp, &wh, &h0, &c0], |[xp, wh, h0, c0]| {
                let (states, gates) = persistent::forward(xp, wh, h0, c0, grid);
                [states, gates]
            })
        {
            let [states, gates] = out;
            return (states, gates);
        }
        stepwise::forward::<Self, R>(xp, wh, h0, c0)
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
        let shape = RecurrenceShape {
            batch,
            time,
            hidden,
        };
        let persistent = match recurrence(Cell::Lstm, Direction::Backward, &states, shape) {
            Recurrence::Persistent(grid) => {
                on_graph_runtime([&d_states, &states, &gates, &wh], |[ds, s, g, w]| {
                    let (dz, d_h0, d_c0) = persistent::backward(ds, s, g, w, grid);
                    [dz, d_h0, d_c0]
                })
            }
            Recurrence::Stepwise => None,
        };
        let [dz, d_h0, d_c0] = match persistent {
            Some(out) => out,
            None => {
                let (dz, d_h0, d_c0) =
                    stepwise::backward::<Self, R>(d_states, states.clone(), gates, wh);
                [dz, d_h0, d_c0]
            }
        };
        // The recurrent weight's gradient: one GEMM over the sequence, `h_{t-1}^T @ dz_t`
        // summed over t.
        let all_dz = tensor::<Self, 3>(dz);
        let h_prev = state_rows::<Self>(states).slice([0..time * batch, 0..hidden]);
        let d_wh = gemm::<Self, R>(
            h_prev.transpose(),
            all_dz.clone().reshape([time * batch, 4 * hidden]),
        );
        [primitive(all_dz.swap_dims(0, 1)), d_wh, d_h0, d_c0]
    }
}
