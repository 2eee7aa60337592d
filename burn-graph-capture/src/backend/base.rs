//! The decorator type and its `Backend` impl.

use core::marker::PhantomData;

use burn_backend::{Backend, BackendTypes, DType, DTypeUsageSet, ExecutionError, TensorData};

use super::session::{self, BreakerKind};

/// A backend decorator that runs every op on `B` and, during a capture session,
/// records the step's op signature and capture breakers.
///
/// Tensor primitives are `B`'s own: wrapping them would cost a conversion per op and
/// hide `B`'s buffers from the step API, which needs their identities. Use it under
/// autodiff, e.g. `Autodiff<GraphCapture<Flex>>` on the CPU or
/// `Autodiff<GraphCapture<Fusion<CubeBackend<CudaGraphRuntime, f32, i32, u8>>>>` on GPUs.
#[derive(Clone, Copy, Default, Debug)]
pub struct GraphCapture<B> {
    _inner: PhantomData<B>,
}

impl<B: Backend> BackendTypes for GraphCapture<B> {
    type Device = B::Device;
    type FloatTensorPrimitive = B::FloatTensorPrimitive;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = B::IntTensorPrimitive;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = B::BoolTensorPrimitive;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = B::QuantizedTensorPrimitive;
}

/// The backend a trainer runs its steps on: autodiff over the decorator over `G`.
///
/// The decorator is not optional: without it the trainer could not see the step's op
/// signature, its capture breakers or the tensors it reads, and could not tell a static
/// step from one that would replay wrongly.
pub type TrainBackend<G> = burn::backend::Autodiff<GraphCapture<G>>;

/// With Burn's `distributed` feature (this crate's feature of that name), `Autodiff<B>`
/// needs `B: DistributedBackend`. The decorator takes the trait's defaults: a trainer's
/// data-parallel steps average through this crate's collectives
/// (`GraphBackend::all_reduce_mean`), not Burn's sync server, and Burn's own strategy
/// runs on `Autodiff<CudaFused>`, whose backends implement the trait.
#[cfg(feature = "distributed")]
impl<B: super::GraphBackend> burn_backend::distributed::DistributedBackend for GraphCapture<B> {}

/// Records a host-level call that breaks captures.
fn record_breaker(op: &'static str, kind: BreakerKind) {
    if session::is_recording() {
        session::record_op(op, Some(kind), |_| {});
    }
}

impl<B: super::GraphBackend> Backend for GraphCapture<B> {
    fn ad_enabled(device: &Self::Device) -> bool {
        B::ad_enabled(device)
    }

    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &Self::Device,
        input: Input,
        func: Func,
    ) -> Output {
        B::memory_persistent_allocations(device, input, func)
    }

    fn memory_cleanup(device: &Self::Device) {
        B::memory_cleanup(device)
    }

    fn name(device: &Self::Device) -> String {
        format!("graph_capture<{}>", B::name(device))
    }

    /// Seeds `B`'s generator and the device generator trainers draw from (`rng::seed`).
    fn seed(device: &Self::Device, seed: u64) {
        record_breaker("seed", BreakerKind::Rng);
        crate::rng::seed::set(burn_backend::DeviceOps::id(device), seed);
        B::seed(device, seed)
    }

    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        record_breaker("sync", BreakerKind::HostRead);
        B::sync(device)
    }

    fn staging<'a, Iter>(data: Iter, device: &Self::Device)
    where
        Iter: Iterator<Item = &'a mut TensorData>,
    {
        B::staging(data, device)
    }

    fn supports_dtype(device: &Self::Device, dtype: DType) -> bool {
        B::supports_dtype(device, dtype)
    }

    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        B::device_count(type_id)
    }
}
