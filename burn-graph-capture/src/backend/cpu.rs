//! `GraphBackend` for CPU backends: no graphs, no arena, real buffer identities.

#[cfg(feature = "flex")]
mod flex {
    use burn_flex::Flex;

    use crate::backend::{AnyTensor, BufferId, GraphBackend, GraphError, NoGraph};

    impl GraphBackend for Flex {
        type Graph = NoGraph;

        fn supports_hardware_graphs(_device: &Self::Device) -> bool {
            false
        }

        fn capture<R>(
            _device: &Self::Device,
            _step: impl FnOnce() -> R,
        ) -> Result<(R, Result<Self::Graph, GraphError>), GraphError> {
            Err(GraphError::NoHardwareGraphs)
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
}
