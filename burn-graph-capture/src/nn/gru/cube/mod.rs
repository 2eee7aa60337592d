//! The GRU recurrence on the CubeCL stacks. On this crate's runtime, where `nn::strategy`
//! picks it, each direction is one persistent kernel (`persistent.rs`), and the recurrent
//! weight and bias gradients are one GEMM and one sum over the whole sequence, here.
//! Elsewhere (stock burn-cuda, shapes it does not fit, other dtypes) the plain tensor ops
//! run: one GEMM and a few element-wise kernels per step each way.

mod fusion;
mod persistent;

use burn::tensor::Tensor;
use burn::tensor::ops::FloatTensor;
use burn_backend::{DeviceOps, TensorMetadata};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl_runtime::server::ComputeServer;

use super::backend::{GruKernels, GruSaved, plain_backward, plain_forward};
use crate::nn::cube::{gemm, on_graph_runtime, recurrence};
use crate::nn::sequence::{primitive, tensor};
use crate::nn::strategy::{Cell, Direction, Recurrence, RecurrenceShape};

/// The plain recurrence's products through cuBLAS where it serves them (`nn::cube::gemm`):
/// CubeCL's matmul may run fp32 at TF32.
fn cublas<R, F, I, BT>(
    a: Tensor<CubeBackend<R, F, I, BT>, 2>,
    b: Tensor<CubeBackend<R, F, I, BT>, 2>,
) -> Tensor<CubeBackend<R, F, I, BT>, 2>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    tensor(gemm::<CubeBackend<R, F, I, BT>, R>(a, b))
}

impl<R, F, I, BT> GruKernels for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    R::Server: ComputeServer,
    R::Device: DeviceOps,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn gru_forward(
        xp: FloatTensor<Self>,
        wh: FloatTensor<Self>,
        bh: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [batch, time, three_h] = xp.shape().dims();
        let shape = RecurrenceShape {
            batch,
            time,
            hidden: three_h / 3,
        };
        // `choose` keeps other dtypes stepwise.
        if let Recurrence::Persistent(grid) = recurrence(Cell::Gru, Direction::Forward, &xp, shape)
            && let Some([states, gates]) =
                on_graph_runtime([&xp, &wh, &bh, &h0], |[xp, wh, bh, h0]| {
                    let (states, gates) = persistent::forward(xp, wh, bh, h0, grid);
                    [states, gates]
                })
        {
            return (states, gates);
        }
        plain_forward::<Self>(xp, wh, bh, h0, cublas::<R, F, I, BT>)
    }

    fn gru_backward(d_states: FloatTensor<Self>, saved: GruSaved<Self>) -> [FloatTensor<Self>; 4] {
        let [steps, batch, hidden] = saved.states.shape().dims();
        let time = steps.saturating_sub(1);
        let shape = RecurrenceShape {
            batch,
            time,
            hidden,
        };
        // `choose` keeps other dtypes and empty sequences stepwise.
        let Recurrence::Persistent(grid) =
            recurrence(Cell::Gru, Direction::Backward, &saved.states, shape)
        else {
            return plain_backward::<Self>(d_states, saved, cublas::<R, F, I, BT>);
        };
        let GruSaved { states, gates, wh } = saved;
        let Some([dxp, dhp, d_h0]) =
            on_graph_runtime([&d_states, &states, &gates, &wh], |[ds, s, g, w]| {
                let (dxp, dhp, d_h0) = persistent::backward(ds, s, g, w, grid);
                [dxp, dhp, d_h0]
            })
        else {
            return plain_backward::<Self>(
                d_states,
                GruSaved { states, gates, wh },
                cublas::<R, F, I, BT>,
            );
        };
        // The recurrent weight's and bias's gradients, once over the sequence:
        // `h_{t-1}^T @ dhp_t` and `dhp_t` summed over t and the batch.
        let three_h = 3 * hidden;
        let dhp = tensor::<Self, 3>(dhp).reshape([time * batch, three_h]);
        let h_prev = tensor::<Self, 3>(states)
            .reshape([steps * batch, hidden])
            .slice([0..time * batch, 0..hidden]);
        let d_wh = gemm::<Self, R>(h_prev.transpose(), dhp.clone());
        let d_bh = dhp.sum_dim(0).reshape([three_h]);
        [
            primitive(tensor::<Self, 3>(dxp).swap_dims(0, 1)),
            d_wh,
            primitive(d_bh),
            d_h0,
        ]
    }
}
