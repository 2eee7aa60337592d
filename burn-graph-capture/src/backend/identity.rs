//! Which allocation a tensor primitive reads: the identity the unlisted-input guard
//! compares across steps.
//!
//! Addresses cannot serve: pools hand a freed address to the next allocation, so a
//! tensor made afresh every step can sit at the same address every step and pass for a
//! constant. Each backend therefore gives an identity that it never reuses: Fusion's
//! tensor ids and CubeCL's memory ids come from process-wide counters; Flex has none, so
//! its identity is the address of the tensor's shared storage, kept unique by holding a
//! weak reference to it for as long as the identity lives.

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The allocation behind a tensor primitive. Two ids are equal only when they name the
/// same allocation (views of one buffer share it); an id is never given to another
/// allocation while this value lives.
#[derive(Clone)]
pub struct AllocationId {
    value: u64,
    /// Keeps `value` unique where it is an address (see the module docs).
    _keep: Option<Arc<dyn Any + Send + Sync>>,
}

impl AllocationId {
    /// An id from a counter that its backend never reuses.
    pub fn unique(value: u64) -> Self {
        Self { value, _keep: None }
    }

    /// An id that is an address, unique while `keep` (which must keep that address from
    /// being reused, such as a weak reference to the storage) lives.
    pub fn address(value: u64, keep: Arc<dyn Any + Send + Sync>) -> Self {
        Self {
            value,
            _keep: Some(keep),
        }
    }
}

impl PartialEq for AllocationId {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl Eq for AllocationId {}

impl Hash for AllocationId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}

impl fmt::Debug for AllocationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AllocationId({})", self.value)
    }
}

/// A tensor primitive whose allocation can be named.
pub trait Allocated {
    /// The allocation this tensor reads, or `None` where the backend cannot tell (the
    /// guard then treats every read of it as unaccounted for).
    fn allocation_id(&self) -> Option<AllocationId>;

    /// Where in its allocation the tensor's values lie (offset, strides), hashed: two
    /// views of one allocation with one shape differ here. An emulated graph
    /// (`backend::emulated`) tells its values apart by it; 0 where graphs are not
    /// emulated.
    fn view_hash(&self) -> u64 {
        0
    }
}

/// Reads the number that follows `marker` in `text`: the counter value inside a derived
/// `Debug` form, for ids whose field is private (Fusion's `TensorId`, CubeCL's memory id).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn counter_in_debug(text: &str, marker: &str) -> Option<u64> {
    let start = text.find(marker)? + marker.len();
    let digits: String = text[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(feature = "flex")]
mod flex {
    use std::sync::Arc;

    use burn_flex::{FlexQTensor, FlexTensor};

    use super::{Allocated, AllocationId};

    /// Flex shares a tensor's bytes through an `Arc`: its address, held by a weak
    /// reference so that no later allocation can take it.
    impl Allocated for FlexTensor {
        fn allocation_id(&self) -> Option<AllocationId> {
            let storage = self.data_arc();
            let address = Arc::as_ptr(&storage) as usize as u64;
            Some(AllocationId::address(
                address,
                Arc::new(Arc::downgrade(&storage)),
            ))
        }

        fn view_hash(&self) -> u64 {
            use std::hash::{DefaultHasher, Hash, Hasher};
            let mut hasher = DefaultHasher::new();
            self.layout().strides().hash(&mut hasher);
            self.layout().start_offset().hash(&mut hasher);
            hasher.finish()
        }
    }

    impl crate::backend::StandIn for FlexQTensor {}

    /// Quantized Flex tensors keep their storage private.
    impl Allocated for FlexQTensor {
        fn allocation_id(&self) -> Option<AllocationId> {
            None
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use burn_cubecl::tensor::CubeTensor;
    use burn_fusion::{FusionRuntime, FusionTensor};

    use super::{Allocated, AllocationId, counter_in_debug};
    use crate::runtime::{CudaGraphRuntime, memory_at_rest};

    /// CubeCL numbers every memory handle from a process-wide counter when the tensor is
    /// created; views and in-place results keep their handle, hence its id. The handle's
    /// `Debug` form, which shows the id, also reads where the server keeps the handle,
    /// which the server moves on its thread: it is read while the server moves no memory
    /// (`runtime::memory_at_rest`).
    impl Allocated for CubeTensor<CudaGraphRuntime> {
        fn allocation_id(&self) -> Option<AllocationId> {
            let text = memory_at_rest(self.device.index, || format!("{:?}", self.handle.memory));
            counter_in_debug(&text, "ManagedMemoryId { value: ").map(AllocationId::unique)
        }
    }

    /// No stand-ins yet: replays on the fusion stack run untraced (a fused tensor's
    /// buffer is the fusion server's, and a kept handle would change what it fuses).
    impl<R: FusionRuntime> crate::backend::StandIn for FusionTensor<R> {}

    /// Fusion numbers every tensor it creates from a process-wide counter; a fused op's
    /// result is always a new id, even where its kernel wrote in place.
    impl<R: FusionRuntime> Allocated for FusionTensor<R> {
        fn allocation_id(&self) -> Option<AllocationId> {
            let text = format!("{:?}", self.id);
            counter_in_debug(&text, "value: ").map(AllocationId::unique)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_debug_forms() {
        assert_eq!(
            counter_in_debug("TensorId { value: 42 }", "value: "),
            Some(42)
        );
        assert_eq!(counter_in_debug("Other { x: 1 }", "value: "), None);
    }

    #[test]
    fn ids_compare_by_value_only() {
        let keep: Arc<dyn Any + Send + Sync> = Arc::new(());
        assert_eq!(AllocationId::unique(7), AllocationId::address(7, keep));
        assert_ne!(AllocationId::unique(7), AllocationId::unique(8));
    }

    #[cfg(feature = "flex")]
    #[test]
    fn a_flex_address_is_not_reused_while_its_id_lives() {
        use burn::backend::Flex;
        use burn::tensor::Tensor;

        let device = Default::default();
        let first = Tensor::<Flex, 1>::ones([1024], &device)
            .into_primitive()
            .tensor();
        let id = first.allocation_id().unwrap();
        drop(first);
        // Every later allocation of the same size misses the address the id holds.
        for _ in 0..16 {
            let next = Tensor::<Flex, 1>::ones([1024], &device)
                .into_primitive()
                .tensor();
            assert_ne!(next.allocation_id().unwrap(), id);
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn fusion_and_cube_ids_are_read_exactly() {
        use cubecl_runtime::memory_management::ManagedMemoryHandle;

        let id = burn_ir::TensorId::new(123_456);
        assert_eq!(
            counter_in_debug(&format!("{id:?}"), "value: "),
            Some(123_456)
        );
        let (a, b) = (ManagedMemoryHandle::new(), ManagedMemoryHandle::new());
        let read = |h: &ManagedMemoryHandle| {
            counter_in_debug(&format!("{h:?}"), "ManagedMemoryId { value: ").unwrap()
        };
        assert_eq!(read(&a), read(&a.clone()));
        assert!(read(&b) > read(&a));
    }
}
