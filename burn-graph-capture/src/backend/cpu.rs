//! `GraphBackend` for CPU backends: no graphs, no arena, real buffer identities.

#[cfg(feature = "flex")]
mod flex {
    use burn_backend::tensor::FloatTensor;
    use burn_flex::Flex;

    use crate::backend::{BufferId, GraphBackend, GraphError, NoGraph};

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

        fn pin(_tensor: FloatTensor<Self>) -> Result<FloatTensor<Self>, GraphError> {
            Err(GraphError::NoArena)
        }

        fn copy_into(_dst: &FloatTensor<Self>, _src: &FloatTensor<Self>) -> Result<(), GraphError> {
            Err(GraphError::NoArena)
        }

        /// Flex tensors share their bytes through an `Arc`; its address is the identity.
        fn buffer_id(tensor: &FloatTensor<Self>) -> Option<BufferId> {
            let storage = tensor.data_arc();
            Some(BufferId(std::sync::Arc::as_ptr(&storage) as usize as u64))
        }
    }
}
