//! Flex as an inner backend: real buffer identities; draws and collectives on the host
//! (the values the devices compute). No graphs, unless they are emulated on the host
//! (`EmulatedGraphs`): a capture is then a `Program`, pins are buffers written in place
//! (`emulated::memory`).

#[cfg(feature = "flex")]
mod flex {
    use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor, IntTensorOps};
    use burn::tensor::{Distribution, Int, Tensor};
    use burn_backend::StreamId;
    use burn_backend::{FloatDType, Shape, TensorData};
    use burn_flex::{Flex, FlexTensor};

    use crate::backend::emulated::program::{self, Recording};
    use crate::backend::emulated::{EmulatedGraphs, Program, memory};
    use crate::backend::trace::TraceRecording;
    use crate::backend::{
        AnyTensor, BufferId, Captured, GraphBackend, GraphError, Holder, RoutedMatmul, StandIn,
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

    /// A Flex primitive, whatever its kind (Flex has one tensor type).
    fn flex(tensor: &AnyTensor<Flex>) -> &FlexTensor {
        let (AnyTensor::Float(t) | AnyTensor::Int(t) | AnyTensor::Bool(t)) = tensor;
        t
    }

    /// `tensor` as a primitive of `like`'s kind.
    fn of_kind(like: &AnyTensor<Flex>, tensor: FlexTensor) -> AnyTensor<Flex> {
        match like {
            AnyTensor::Float(_) => AnyTensor::Float(tensor),
            AnyTensor::Int(_) => AnyTensor::Int(tensor),
            AnyTensor::Bool(_) => AnyTensor::Bool(tensor),
        }
    }

    /// A step of the program recording now: `src`'s value, written into the pin `dst`
    /// when the program replays (nothing recorded runs before its launch).
    fn write_at_replay(op: &'static str, dst: FlexTensor, src: &FlexTensor) {
        let slot = program::input(op, src);
        if !program::produced(&slot) && !memory::is_pinned(src) {
            // A value made inside the capture by no recorded op would replay frozen.
            program::refuse(op);
            return;
        }
        program::push(
            op,
            Box::new(move |env| {
                let src: FlexTensor = env.take(&slot)?;
                memory::write(&dst, &src).map_err(|_| program::Missing {
                    op,
                    what: "pin lying as its value",
                })
            }),
        );
    }

    /// A stand-in is a pinned copy: a trace that stops matching writes what the op
    /// computes now into it.
    impl StandIn for FlexTensor {
        fn stand_in(&self) -> Option<Self> {
            EmulatedGraphs::active().then(|| memory::pin(self))
        }

        fn fill(&self, value: &Self) -> bool {
            memory::write(self, value).is_ok()
        }
    }

    /// The generator state `draws` draws on.
    fn advanced(state: &FlexTensor, draws: u32) -> FlexTensor {
        let next = words(state).advanced(draws);
        let data = next
            .to_data(state.dtype())
            .expect("a generator state is of an int type of 32 bits or more");
        Flex::int_from_data(data, &Flex::int_device(state))
    }

    impl GraphBackend for Flex {
        type Graph = Program;

        fn supports_hardware_graphs(_device: &Self::Device) -> bool {
            EmulatedGraphs::active()
        }

        fn capture<R>(_device: &Self::Device, step: impl FnOnce() -> R) -> Captured<R, Program> {
            if !EmulatedGraphs::active() {
                return Captured::Refused(GraphError::NoHardwareGraphs);
            }
            let Some(recording) = Recording::begin() else {
                return Captured::Refused(GraphError::NotEmulated {
                    op: "a capture inside a capture".into(),
                });
            };
            let output = step();
            match recording.finish() {
                Ok(graph) => Captured::Recorded { output, graph },
                Err(refused) => Captured::Broken {
                    output,
                    error: GraphError::NotEmulated {
                        op: refused.op.into(),
                    },
                },
            }
        }

        fn replay(graph: &Self::Graph) -> Result<(), GraphError> {
            graph
                .run()
                .map_err(|missing| GraphError::EmulatedReplay(missing.to_string()))
        }

        fn trace_recording(graph: &Self::Graph) -> Option<TraceRecording> {
            graph.traceable().map(TraceRecording)
        }

        /// Inside a capture, the step's output goes into a buffer of its own that each
        /// replay writes, as a device graph's output does.
        fn hand_over(tensor: AnyTensor<Self>, _caller: StreamId) -> AnyTensor<Self> {
            if !program::recording() {
                return tensor;
            }
            let pinned = memory::pin(flex(&tensor));
            write_at_replay("output", pinned.clone(), flex(&tensor));
            of_kind(&tensor, pinned)
        }

        fn pin(tensor: AnyTensor<Self>) -> Result<AnyTensor<Self>, GraphError> {
            if !EmulatedGraphs::active() {
                return Err(GraphError::NoArena);
            }
            Ok(of_kind(&tensor, memory::pin(flex(&tensor))))
        }

        /// Inside a capture the copy is a step of the program (checked now, written at
        /// replay); outside, the pin is written at once.
        fn copy_into(dst: &AnyTensor<Self>, src: &AnyTensor<Self>) -> Result<(), GraphError> {
            dst.check_copy_from(src)?;
            let (dst, src) = (flex(dst), flex(src));
            if !memory::is_pinned(dst) {
                return Err(GraphError::NoArena);
            }
            if !program::recording() {
                return memory::write(dst, src);
            }
            memory::lies_alike(dst, src)?;
            write_at_replay("copy_into", dst.clone(), src);
            Ok(())
        }

        /// Where graphs are emulated: their replays are traced.
        fn pins_constants() -> bool {
            EmulatedGraphs::active()
        }

        fn lies_alike(pin: &AnyTensor<Self>, tensor: &AnyTensor<Self>) -> bool {
            pin.check_copy_from(tensor).is_ok()
                && memory::lies_alike(flex(pin), flex(tensor)).is_ok()
        }

        /// The `Arc` a Flex tensor shares its bytes through: held elsewhere while any
        /// other handle has it (an emulated graph keeps only a weak one).
        fn holder(tensor: &AnyTensor<Self>) -> Option<Holder> {
            let data = flex(tensor).data_arc();
            Some(Holder::new(move || std::sync::Arc::strong_count(&data) > 1))
        }

        /// Flex tensors share their bytes through an `Arc`: its address.
        fn buffer_id(tensor: &AnyTensor<Self>) -> Option<BufferId> {
            Some(BufferId(
                std::sync::Arc::as_ptr(&flex(tensor).data_arc()) as usize as u64,
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

        /// Inside an emulated capture the advance is a step of the program, as the
        /// device's advance kernel is part of its graph.
        fn advance_random(state: IntTensor<Self>, draws: u32) -> IntTensor<Self> {
            let next = advanced(&state, draws);
            if program::recording() {
                let read = program::input("advance_random", &state);
                let slot = program::output("advance_random", &next);
                program::push(
                    "advance_random",
                    Box::new(move |env| {
                        let state: FlexTensor = env.take(&read)?;
                        env.bind(&slot, advanced(&state, draws));
                        Ok(())
                    }),
                );
            }
            next
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
