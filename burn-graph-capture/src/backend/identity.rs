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
use std::hash::{DefaultHasher, Hash, Hasher};
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

    /// Feeds where in its allocation the tensor's values lie (offset, strides) into
    /// `state`: two views of one allocation with one shape differ here, and traces and
    /// emulated graphs (`backend::emulated`) tell values apart by it. Nothing where every
    /// tensor has an allocation of its own (Fusion's ids) or graphs are not traced.
    fn hash_view(&self, state: &mut DefaultHasher) {
        let _ = state;
    }
}

/// A view (`Allocated::hash_view`): where it starts in its allocation, in the backend's
/// unit, and its strides.
#[cfg_attr(not(any(feature = "flex", feature = "cuda")), allow(dead_code))]
fn hash_view<S: Hash>(state: &mut DefaultHasher, offset: u64, strides: &[S]) {
    offset.hash(state);
    strides.hash(state);
}

/// Reads the number that follows `prefix` at the start of `value`'s `Debug` form: the
/// counter inside an id whose field is private (Fusion's `TensorId`, CubeCL's memory id).
/// `None` where the form starts otherwise (a changed `Debug` form: the tests of this
/// module read real ids at the pinned versions) or no number follows.
///
/// The form is streamed, never collected: nothing is allocated, each piece the
/// formatter writes is compared with the prefix at once, and formatting stops at the
/// first character after the number, so fields printed after it (a memory handle's
/// location) are never formatted. A trace reads an id for every input of every op.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn counter_after<T: fmt::Debug + ?Sized>(value: &T, prefix: &str) -> Option<u64> {
    let mut reader = CounterReader {
        prefix: prefix.as_bytes(),
        read: 0,
        state: ReadState::Prefix,
    };
    // The reader stops the formatting with an error once it has the number (or knows
    // there is none); the error carries no other meaning.
    let _ = fmt::write(&mut reader, format_args!("{value:?}"));
    match reader.state {
        ReadState::Digits { value, count } if count > 0 => Some(value),
        ReadState::Done(value) => Some(value),
        _ => None,
    }
}

/// A `fmt::Write` that checks the prefix piece by piece, then reads the digits after it.
struct CounterReader<'p> {
    prefix: &'p [u8],
    /// Bytes of the prefix read so far.
    read: usize,
    state: ReadState,
}

#[derive(Clone, Copy)]
enum ReadState {
    Prefix,
    Digits {
        value: u64,
        count: u32,
    },
    Done(u64),
    /// The form started otherwise, no number followed, or the number overflowed.
    Invalid,
}

impl CounterReader<'_> {
    /// Takes `bytes` after the prefix; `false` once reading is over.
    fn digits(&mut self, bytes: &[u8]) -> bool {
        for &byte in bytes {
            self.state = match self.state {
                ReadState::Digits { value, count } if byte.is_ascii_digit() => value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u64::from(byte - b'0')))
                    .map_or(ReadState::Invalid, |value| ReadState::Digits {
                        value,
                        count: count + 1,
                    }),
                ReadState::Digits { value, count } if count > 0 => ReadState::Done(value),
                _ => ReadState::Invalid,
            };
            if !matches!(self.state, ReadState::Digits { .. }) {
                return false;
            }
        }
        true
    }
}

impl fmt::Write for CounterReader<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut bytes = text.as_bytes();
        if let ReadState::Prefix = self.state {
            let expected = &self.prefix[self.read..];
            let compared = expected.len().min(bytes.len());
            if bytes[..compared] != expected[..compared] {
                self.state = ReadState::Invalid;
                return Err(fmt::Error);
            }
            self.read += compared;
            bytes = &bytes[compared..];
            if self.read < self.prefix.len() {
                return Ok(());
            }
            self.state = ReadState::Digits { value: 0, count: 0 };
        }
        // Once read (or found missing), the value stays, whatever else is written.
        let reading = matches!(self.state, ReadState::Digits { .. });
        if reading && self.digits(bytes) {
            Ok(())
        } else {
            Err(fmt::Error)
        }
    }
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

        fn hash_view(&self, state: &mut std::hash::DefaultHasher) {
            let layout = self.layout();
            super::hash_view(state, layout.start_offset() as u64, layout.strides())
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

    use super::{Allocated, AllocationId, counter_after};
    use crate::runtime::{CudaGraphRuntime, memory_at_rest};

    /// How a CubeCL memory handle's `Debug` form starts, up to its id; the handle's
    /// location comes after it, so the read stops before the location is formatted.
    pub(super) const CUBE_MEMORY_ID: &str =
        "ManagedMemoryHandle { descriptor: ManagedMemoryDescriptor { id: ManagedMemoryId { value: ";
    /// How a Fusion `TensorId`'s `Debug` form starts, up to its counter.
    pub(super) const FUSION_TENSOR_ID: &str = "TensorId { value: ";

    /// CubeCL numbers every memory handle from a process-wide counter when the tensor is
    /// created; views and in-place results keep their handle, hence its id. The handle's
    /// `Debug` form, which shows the id, also reads (though the reader never formats it)
    /// where the server keeps the handle, a `Cell` the server moves on its thread: it is
    /// read while the server moves no memory (`runtime::memory_at_rest`).
    impl Allocated for CubeTensor<CudaGraphRuntime> {
        fn allocation_id(&self) -> Option<AllocationId> {
            memory_at_rest(self.device.index, || {
                counter_after(&self.handle.memory, CUBE_MEMORY_ID)
            })
            .map(AllocationId::unique)
        }

        /// A slice or a transposed view keeps its tensor's handle, hence its id: the
        /// handle's offset and the strides tell such views of one shape apart (the two
        /// halves of a batch; a square matrix and its transpose).
        fn hash_view(&self, state: &mut std::hash::DefaultHasher) {
            super::hash_view(
                state,
                self.handle.offset_start.unwrap_or(0),
                self.meta.strides(),
            )
        }
    }

    /// Fusion numbers every tensor it creates from a process-wide counter; a fused op's
    /// result is always a new id, even where its kernel wrote in place.
    impl<R: FusionRuntime> Allocated for FusionTensor<R> {
        fn allocation_id(&self) -> Option<AllocationId> {
            counter_after(&self.id, FUSION_TENSOR_ID).map(AllocationId::unique)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Debug` form written in pieces, as derived forms are.
    struct Pieces(&'static [&'static str]);

    impl fmt::Debug for Pieces {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.iter().try_for_each(|piece| f.write_str(piece))
        }
    }

    #[test]
    fn counters_are_read_after_the_prefix_of_debug_forms() {
        #[derive(Debug)]
        #[allow(dead_code, reason = "read through its Debug form only")]
        struct TensorId {
            value: u64,
        }
        let prefix = "TensorId { value: ";
        assert_eq!(counter_after(&TensorId { value: 42 }, prefix), Some(42));
        // A form that starts otherwise, even one holding the prefix later, is no id.
        assert_eq!(counter_after("Other { x: 1 }", prefix), None);
        assert_eq!(
            counter_after(&Pieces(&["X", "TensorId { value: 3 }"]), prefix),
            None
        );
        // The prefix and the digits may arrive split across writes, anywhere.
        let split = Pieces(&["Tensor", "Id { val", "ue: 12", "34 }"]);
        assert_eq!(counter_after(&split, prefix), Some(1234));
        let whole = Pieces(&["TensorId { value: 56 }"]);
        assert_eq!(counter_after(&whole, prefix), Some(56));
        // No digits after the prefix, or too many, is no id.
        assert_eq!(
            counter_after(&Pieces(&["TensorId { value: x"]), prefix),
            None
        );
        assert_eq!(
            counter_after(
                &Pieces(&["TensorId { value: 99999999999999999999999 }"]),
                prefix
            ),
            None
        );
        // A form that ends with the number still names it.
        assert_eq!(
            counter_after(&Pieces(&["TensorId { value: 7"]), prefix),
            Some(7)
        );
    }

    #[test]
    fn the_reader_stops_at_the_end_of_the_number() {
        /// Fails the test if its field is ever formatted.
        struct Untouchable;
        impl fmt::Debug for Untouchable {
            fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
                panic!("formatted a field after the id")
            }
        }
        #[derive(Debug)]
        #[allow(dead_code, reason = "read through its Debug form only")]
        struct Handle {
            id: u64,
            location: Untouchable,
        }
        let handle = Handle {
            id: 9,
            location: Untouchable,
        };
        assert_eq!(counter_after(&handle, "Handle { id: "), Some(9));
        // Debug forms that ignore write errors keep the value read.
        assert_eq!(
            counter_after(&Pieces(&["id: 5", " more id: 6"]), "id: "),
            Some(5)
        );
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

        use super::cuda::{CUBE_MEMORY_ID, FUSION_TENSOR_ID};

        let id = burn_ir::TensorId::new(123_456);
        assert_eq!(counter_after(&id, FUSION_TENSOR_ID), Some(123_456));
        let (a, b) = (ManagedMemoryHandle::new(), ManagedMemoryHandle::new());
        let read = |h: &ManagedMemoryHandle| counter_after(h, CUBE_MEMORY_ID).unwrap();
        assert_eq!(read(&a), read(&a.clone()));
        assert!(read(&b) > read(&a));
        // The id is printed before the location, so the reader never formats the latter.
        let form = format!("{a:?}");
        let (id_at, location_at) = (form.find(CUBE_MEMORY_ID), form.find("location"));
        assert!(
            matches!((id_at, location_at), (Some(i), Some(l)) if i < l),
            "the handle's Debug form changed: {form}"
        );
    }
}
