//! What the recurrences' impls on the CubeCL stacks share (`lstm/cube`, `gru/cube`):
//! allocation, the GEMM, the strategy traced once per shape, the downcast to this crate's
//! runtime (where the persistent kernels launch), the persistent kernels' launch and the
//! custom fusion op.

pub(crate) mod fusion;
pub(crate) mod persistent;

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Mutex;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_backend::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use crate::nn::sequence::primitive;
use crate::nn::strategy::{self, Cell, Direction, Recurrence, RecurrenceShape};
use crate::runtime::CudaGraphRuntime;

/// An uninitialised contiguous tensor like `like`'s, of `shape`.
pub(crate) fn empty<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: impl Into<Shape>,
) -> CubeTensor<R> {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        like.dtype,
    )
}

/// `a @ b` through cuBLAS on this crate's runtime (`backend::cublas`), else the
/// backend's own matmul: the recurrences' GEMMs are most of their time.
pub(crate) fn gemm<B, R>(a: Tensor<B, 2>, b: Tensor<B, 2>) -> CubeTensor<R>
where
    B: Backend<FloatTensorPrimitive = CubeTensor<R>>,
    R: CubeRuntime,
{
    crate::backend::cublas::matmul_or(primitive(a), primitive(b), B::float_matmul)
}

/// Whether the fused kernels serve `dtype`; other dtypes run the plain recurrence.
pub(crate) fn fused_dtype(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
}

/// The strategy for a `cell` layer of `shape` (see `strategy.rs`), traced the first time
/// each cell and shape asks.
pub(crate) fn recurrence<R: CubeRuntime>(
    cell: Cell,
    direction: Direction,
    like: &CubeTensor<R>,
    shape: RecurrenceShape,
) -> Recurrence {
    let sms = like
        .client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .unwrap_or(0) as usize;
    let choice = strategy::choose(
        cell,
        direction,
        shape,
        like.dtype == DType::F32,
        sms,
        strategy::recurrence_preference(),
    );
    /// LSTM or not, forward or not, batch, time, hidden.
    type Traced = (bool, bool, usize, usize, usize);
    static TRACED: Mutex<BTreeSet<Traced>> = Mutex::new(BTreeSet::new());
    let key = (
        cell == Cell::Lstm,
        direction == Direction::Forward,
        shape.batch,
        shape.time,
        shape.hidden,
    );
    if TRACED.lock().is_ok_and(|mut traced| traced.insert(key)) {
        tracing::debug!(
            target: "burn_graph_capture::recurrence",
            ?cell,
            ?direction,
            batch = shape.batch,
            time = shape.time,
            hidden = shape.hidden,
            ?choice,
            "recurrence"
        );
    }
    choice
}

/// `run` on `tensors` as tensors of this crate's runtime, the only one the persistent
/// kernels launch on; `None` on any other runtime (stock burn-cuda runs stepwise).
pub(crate) fn on_graph_runtime<R: CubeRuntime, const N: usize, const M: usize>(
    tensors: [&CubeTensor<R>; N],
    run: impl FnOnce([&CubeTensor<CudaGraphRuntime>; N]) -> [CubeTensor<CudaGraphRuntime>; M],
) -> Option<[CubeTensor<R>; M]> {
    let ours: Vec<_> = tensors
        .iter()
        .map(|t| (*t as &dyn Any).downcast_ref::<CubeTensor<CudaGraphRuntime>>())
        .collect::<Option<_>>()?;
    let ours: [_; N] = ours.try_into().ok()?;
    let out = run(ours);
    Some(out.map(|t| {
        *(Box::new(t) as Box<dyn Any>)
            .downcast::<CubeTensor<R>>()
            .expect("R is CudaGraphRuntime: its tensors were downcast above")
    }))
}
