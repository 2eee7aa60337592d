//! fp32 matmuls through cuBLAS on this crate's runtime (`runtime::blas`).
//!
//! At the shapes training steps use, cuBLAS's fp32 GEMM is faster than CubeCL's autotuned
//! matmul, and exact fp32 where CubeCL's runs at TF32 (`bench/results/lstm-*.md`). A
//! matmul that one strided-batched GEMM cannot read (another dtype, strides that do not
//! collapse), or every matmul when cuBLAS is off (`BURN_GRAPH_CAPTURE_CUBLAS=off`) or
//! missing, runs CubeCL's kernels; a missing cuBLAS is warned about once. Each shape runs
//! in the form `gemm_route` measured for it (`A B`, or `(Bᵀ Aᵀ)ᵀ` where cuBLAS's pick for
//! the planned form is slow).

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use burn_backend::DType;
use burn_cubecl::CubeRuntime;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl_core::zspace::striding::row_major_contiguous_strides;

use super::gemm_route::{self, Form};
use crate::runtime::blas::{Gemm, GemmRefusal};
use crate::runtime::{
    CaptureError, CudaGraphDevice, CudaGraphRuntime, submit_to_server, try_with_server, with_server,
};

/// Why a matmul did not go to cuBLAS.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// Not a tensor of this crate's runtime.
    #[error("not a tensor of CudaGraphRuntime")]
    OtherRuntime,
    /// cuBLAS here serves fp32 only.
    #[error("dtype {0:?} (cuBLAS serves f32 here)")]
    DType(DType),
    /// No single GEMM computes it.
    #[error(transparent)]
    Plan(GemmRefusal),
    /// The runtime did not queue it (cuBLAS off, missing, or failing).
    #[error(transparent)]
    Runtime(CaptureError),
}

/// `lhs @ rhs` through cuBLAS, in the form measured fastest for its shape
/// (`gemm_route`), or why not (then nothing was queued, and the caller runs its own
/// matmul on the same operands). An operand that one GEMM cannot read as it lies (a
/// broadcast, a view of a view) is copied packed first, as CubeCL's matmul would.
pub(crate) fn matmul(
    lhs: &CubeTensor<CudaGraphRuntime>,
    rhs: &CubeTensor<CudaGraphRuntime>,
) -> Result<CubeTensor<CudaGraphRuntime>, Refusal> {
    match routed(lhs, rhs) {
        Err(Refusal::Plan(GemmRefusal::Layout(_) | GemmRefusal::Batch(_))) => {
            routed(&packed(lhs), &packed(rhs))
        }
        other => other,
    }
}

/// Repetitions of each form when a shape is measured (after one untimed call each).
const REPETITIONS: usize = 10;

/// `lhs @ rhs` in its shape's form: the one measured before, else measured now (outside
/// a window), else as laid.
fn routed(
    lhs: &CubeTensor<CudaGraphRuntime>,
    rhs: &CubeTensor<CudaGraphRuntime>,
) -> Result<CubeTensor<CudaGraphRuntime>, Refusal> {
    if !gemm_route::enabled() {
        return matmul_as_laid(lhs, rhs);
    }
    let shape = output_shape(lhs, rhs)?;
    let key = plan(lhs, rhs, &row_major_contiguous_strides(&shape))?;
    let device = lhs.device.index;
    let form = match gemm_route::known(device, &key) {
        Some(form) => form,
        None => match measure(lhs, rhs)? {
            Some(form) => gemm_route::record(device, key, form),
            None => Form::AsLaid,
        },
    };
    run(form, lhs, rhs)
}

/// `lhs @ rhs` in `form`.
fn run(
    form: Form,
    lhs: &CubeTensor<CudaGraphRuntime>,
    rhs: &CubeTensor<CudaGraphRuntime>,
) -> Result<CubeTensor<CudaGraphRuntime>, Refusal> {
    match form {
        Form::AsLaid => matmul_as_laid(lhs, rhs),
        // `(Bᵀ Aᵀ)ᵀ`: views in, a view out.
        Form::Transposed => {
            matmul_as_laid(&transposed(rhs), &transposed(lhs)).map(|out| transposed(&out))
        }
    }
}

/// The view of `tensor` with its last two dimensions swapped.
fn transposed(tensor: &CubeTensor<CudaGraphRuntime>) -> CubeTensor<CudaGraphRuntime> {
    let mut view = tensor.clone();
    let rank = view.meta.shape().len();
    view.meta.swap(rank - 2, rank - 1);
    view
}

/// Times both forms of `lhs @ rhs` on the stream (CUDA events) and picks one
/// (`gemm_route::choose`); `None` inside a window, where no host may wait. A transposed
/// form cuBLAS cannot run loses.
fn measure(
    lhs: &CubeTensor<CudaGraphRuntime>,
    rhs: &CubeTensor<CudaGraphRuntime>,
) -> Result<Option<Form>, Refusal> {
    let event =
        || try_with_server(&lhs.device, |server| server.timing_event()).map_err(Refusal::Runtime);
    // Nothing may run before this answer: inside a window it would be recorded.
    if event()?.is_none() {
        return Ok(None);
    }
    let mut times = [0.0f64; 2];
    for (form, time) in [Form::AsLaid, Form::Transposed].into_iter().zip(&mut times) {
        // The first call outside the timing: cuBLAS's heuristics, the pools' growth.
        if let Err(refusal) = run(form, lhs, rhs) {
            return match form {
                Form::AsLaid => Err(refusal),
                Form::Transposed => Ok(Some(Form::AsLaid)),
            };
        }
        let Some(start) = event()? else {
            return Ok(None);
        };
        for _ in 0..REPETITIONS {
            run(form, lhs, rhs)?;
        }
        let Some(end) = event()? else {
            return Ok(None);
        };
        let elapsed = start
            .elapsed_ms(&end)
            .map_err(|err| Refusal::Runtime(CaptureError::driver("cuEventElapsedTime", err)))?;
        *time = f64::from(elapsed);
    }
    let form = gemm_route::choose(times[0], times[1]);
    tracing::debug!(
        target: "burn_graph_capture::matmul",
        shape = ?(lhs.meta.shape(), rhs.meta.shape()),
        as_laid_ms = times[0],
        transposed_ms = times[1],
        ?form,
        "GEMM form measured"
    );
    Ok(Some(form))
}

/// The shape of `lhs @ rhs`.
fn output_shape(
    lhs: &CubeTensor<CudaGraphRuntime>,
    rhs: &CubeTensor<CudaGraphRuntime>,
) -> Result<Vec<usize>, Refusal> {
    Gemm::output_shape(lhs.meta.shape(), rhs.meta.shape()).map_err(Refusal::Plan)
}

/// The GEMM of `lhs @ rhs` into an output with `out_strides`.
fn plan(
    lhs: &CubeTensor<CudaGraphRuntime>,
    rhs: &CubeTensor<CudaGraphRuntime>,
    out_strides: &[usize],
) -> Result<Gemm, Refusal> {
    Gemm::plan(
        (lhs.meta.shape(), lhs.meta.strides()),
        (rhs.meta.shape(), rhs.meta.strides()),
        out_strides,
    )
    .map_err(Refusal::Plan)
}

/// `tensor`, or a packed copy of it where it is not packed.
fn packed(tensor: &CubeTensor<CudaGraphRuntime>) -> CubeTensor<CudaGraphRuntime> {
    if tensor.is_contiguous() {
        tensor.clone()
    } else {
        into_contiguous(tensor.clone())
    }
}

fn matmul_as_laid(
    lhs: &CubeTensor<CudaGraphRuntime>,
    rhs: &CubeTensor<CudaGraphRuntime>,
) -> Result<CubeTensor<CudaGraphRuntime>, Refusal> {
    if !crate::runtime::blas::enabled() {
        return Err(Refusal::Runtime(CaptureError::BlasUnavailable));
    }
    for dtype in [lhs.dtype, rhs.dtype] {
        if dtype != DType::F32 {
            return Err(Refusal::DType(dtype));
        }
    }
    blas_ready(&lhs.device)?;
    // Planned against packed output strides before the output exists, so a refusal
    // allocates nothing.
    let shape = output_shape(lhs, rhs)?;
    let packed = row_major_contiguous_strides(&shape);
    let gemm = plan(lhs, rhs, &packed)?;
    let out = empty_device_contiguous_dtype(
        lhs.client.clone(),
        lhs.device,
        shape.clone().into(),
        DType::F32,
    );
    // The pools may pitch even a "contiguous" output's rows: plan against what it got.
    let gemm = if **out.meta.strides() == *packed {
        gemm
    } else {
        plan(lhs, rhs, out.meta.strides())?
    };
    let operands = [
        lhs.handle.clone().binding(),
        rhs.handle.clone().binding(),
        out.handle.clone().binding(),
    ];
    // Queued like a kernel launch, without waiting: the bindings keep the buffers alive
    // until the server has queued the GEMM on the stream.
    submit_to_server(&lhs.device, move |server| server.queue_gemm(gemm, operands));
    Ok(out)
}

/// Whether `device` queues GEMMs: asked of the server once per device and process
/// (cuBLAS loads or it does not), then answered here without a round trip.
fn blas_ready(device: &CudaGraphDevice) -> Result<(), Refusal> {
    static READY: Mutex<BTreeMap<usize, bool>> = Mutex::new(BTreeMap::new());
    let index = device.index;
    if let Some(&ready) = READY.lock().expect("no panic holds it").get(&index) {
        return ready
            .then_some(())
            .ok_or(Refusal::Runtime(CaptureError::BlasUnavailable));
    }
    let answer = with_server(device, |server| server.blas_ready()).map_err(Refusal::Runtime)?;
    match answer {
        Some(ready) => {
            READY
                .lock()
                .expect("no panic holds it")
                .insert(index, ready);
            ready
                .then_some(())
                .ok_or(Refusal::Runtime(CaptureError::BlasUnavailable))
        }
        // Not decided (a window is open before any handle was made): CubeCL this time.
        None => Err(Refusal::Runtime(CaptureError::BlasUnavailable)),
    }
}

/// `lhs @ rhs` through cuBLAS when both are tensors of this crate's runtime and one GEMM
/// serves them; otherwise `fallback` (the caller's own matmul) on the same operands.
pub(crate) fn matmul_or<R: CubeRuntime>(
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
    fallback: impl FnOnce(CubeTensor<R>, CubeTensor<R>) -> CubeTensor<R>,
) -> CubeTensor<R> {
    let routed = (&lhs as &dyn Any)
        .downcast_ref::<CubeTensor<CudaGraphRuntime>>()
        .zip((&rhs as &dyn Any).downcast_ref::<CubeTensor<CudaGraphRuntime>>())
        .ok_or(Refusal::OtherRuntime)
        .and_then(|(lhs, rhs)| matmul(lhs, rhs));
    match routed {
        Ok(out) => *(Box::new(out) as Box<dyn Any>)
            .downcast::<CubeTensor<R>>()
            .expect("the runtime checked above"),
        Err(refusal) => {
            note(&refusal);
            fallback(lhs, rhs)
        }
    }
}

/// Reports a refusal: a missing or failing cuBLAS as a warning (once for a missing one),
/// the rest at debug level (they are expected: other dtypes, odd views).
fn note(refusal: &Refusal) {
    static WARNED_MISSING: AtomicBool = AtomicBool::new(false);
    match refusal {
        Refusal::Runtime(CaptureError::BlasUnavailable) => {
            if crate::runtime::blas::enabled() && !WARNED_MISSING.swap(true, Ordering::Relaxed) {
                tracing::warn!("cuBLAS could not be loaded: matmuls run CubeCL's kernels");
            }
        }
        Refusal::Runtime(err) => {
            tracing::warn!("a cuBLAS matmul failed, CubeCL's kernels run it: {err}");
        }
        other => tracing::debug!(target: "burn_graph_capture::matmul", "CubeCL matmul: {other}"),
    }
}
