//! Flex as an inner backend: no graphs, no arena, real buffer identities; draws and
//! collectives on the host (the values the devices compute).

#[cfg(feature = "flex")]
mod flex {
    use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor, IntTensorOps};
    use burn::tensor::{Distribution, Int, Tensor};
    use burn_backend::{FloatDType, Shape, TensorData};
    use burn_flex::Flex;

    use crate::backend::{
        AnyTensor, BufferId, Captured, GraphBackend, GraphError, NoGraph, RoutedMatmul,
    };
    use crate::cause::Cause;
    use crate::parallel::error::CollectiveFailure;
    use crate::parallel::{Collectives, DistError, RankLink, host};
    use crate::rng::{RandomDraws, draw, state::Words};

    /// Flex computes on the calling thread: its reads are ready at once.
    fn ready<F: std::future::Future>(future: F) -> F::Output {
        use std::task::{Context, Poll, Waker};
        let mut future = std::pin::pin!(future);
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(output) => output,
            Poll::Pending => unreachable!("a Flex read is ready when it is made"),
        }
    }

    /// The tensors' values on the host, and back as Flex tensors on their device.
    fn on_host(
        tensors: Vec<FloatTensor<Flex>>,
        f: impl FnOnce(Vec<TensorData>) -> Result<Vec<TensorData>, DistError>,
    ) -> Result<Vec<FloatTensor<Flex>>, DistError> {
        let device = tensors.first().map(Flex::float_device).unwrap_or_default();
        let data = tensors
            .into_iter()
            .map(|t| {
                ready(Flex::float_into_data(t)).map_err(|err| {
                    DistError::Collective(CollectiveFailure::TensorRead(Cause::new(err)))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(f(data)?
            .into_iter()
            .map(|data| Flex::float_from_data(data, &device))
            .collect())
    }

    /// The generator state's words, read on the host (Flex has no graphs to break).
    fn words(state: &IntTensor<Flex>) -> Words {
        let data = Tensor::<Flex, 1, Int>::from_primitive(state.clone()).into_data();
        Words::from_data(&data).expect("a generator state holds four 32-bit words")
    }

    impl GraphBackend for Flex {
        type Graph = NoGraph;

        fn supports_hardware_graphs(_device: &Self::Device) -> bool {
            false
        }

        fn capture<R>(_device: &Self::Device, _step: impl FnOnce() -> R) -> Captured<R, NoGraph> {
            Captured::Refused(GraphError::NoHardwareGraphs)
        }

        fn replay(graph: &Self::Graph) -> Result<(), GraphError> {
            match *graph {}
        }

        fn pin(_tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
            Err(GraphError::NoArena)
        }

        fn copy_into(_dst: &AnyTensor<Self>, _src: &AnyTensor<Self>) -> Result<(), GraphError> {
            Err(GraphError::NoArena)
        }

        /// Flex tensors share their bytes through an `Arc`: its address.
        fn buffer_id(tensor: &AnyTensor<Self>) -> Option<BufferId> {
            let (AnyTensor::Float(t) | AnyTensor::Int(t) | AnyTensor::Bool(t)) = tensor;
            Some(BufferId(
                std::sync::Arc::as_ptr(&t.data_arc()) as usize as u64
            ))
        }
    }

    impl RoutedMatmul for Flex {}

    impl RandomDraws for Flex {
        /// Draws on the host, through `rng::draw`: the values the device kernel computes.
        fn draws_random(_shape: &Shape, _dtype: FloatDType) -> bool {
            true
        }

        fn random(
            state: &IntTensor<Self>,
            draw: u32,
            shape: Shape,
            distribution: Distribution,
            dtype: FloatDType,
        ) -> FloatTensor<Self> {
            let Words { key, offset } = words(state);
            let offset = offset.wrapping_add(u64::from(draw));
            let values = draw::values(key, offset, distribution, shape.num_elements());
            let data = TensorData::new(values, shape).convert_dtype(dtype.into());
            Self::float_from_data(data, &Self::int_device(state))
        }

        fn advance_random(state: IntTensor<Self>, draws: u32) -> IntTensor<Self> {
            let next = words(&state).advanced(draws);
            let data = next
                .to_data(state.dtype())
                .expect("a generator state is of an int type of 32 bits or more");
            Self::int_from_data(data, &Self::int_device(&state))
        }
    }

    impl Collectives for Flex {
        /// Flex's collectives run on the host, through the group's rendezvous.
        fn join_group(_device: &Self::Device, _member: &RankLink) -> Result<(), DistError> {
            Ok(())
        }

        fn all_reduce_mean(
            tensors: Vec<FloatTensor<Self>>,
            member: &RankLink,
        ) -> Result<Vec<FloatTensor<Self>>, DistError> {
            on_host(tensors, |data| host::all_reduce_mean(member, data))
        }

        fn broadcast(
            tensors: Vec<FloatTensor<Self>>,
            root: usize,
            member: &RankLink,
        ) -> Result<Vec<FloatTensor<Self>>, DistError> {
            on_host(tensors, |data| host::broadcast(member, data, root))
        }
    }
}
