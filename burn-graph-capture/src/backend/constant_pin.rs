//! Pins for the tensors a traced graph reads as constants.
//!
//! A graph reads each tensor from outside the step at the address it had at capture. A
//! constant the loop replaces (a target network after a soft update, a mask rebuilt, a
//! tensor the batch does not list) would be a difference at every trace, and its shape
//! would warm up and capture again. Instead the capture reads each constant through a
//! pin of its own: the k-th constant the step reads is swapped for a pin made from the
//! k-th constant the rehearsal (the last warmup step) read, where both lie alike, and
//! the pin takes the captured tensor's values once the window closed. A trace that meets
//! another tensor of the same shape, dtype and layout at a pin's place copies it into the
//! pin before the launch. A pin keeps a handle on the tensor whose values it holds, so
//! that this tensor cannot change in place (or its id be reused) while it is the source.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use burn_backend::TensorMetadata;
use rustc_hash::FxHashMap;

use super::emulated::program::{AsValue, Key, Value, key_of};
use super::error::GraphError;
use super::identity::{Allocated, AllocationId};

/// A pin of one backend, type-erased: sessions and traces are shared by every backend.
pub(crate) trait PinSlot: Send + Sync {
    /// The pin, as an op's argument (the inner backend's primitive).
    fn pin(&self) -> Value;
    /// Whether `tensor` (a primitive) lies as the pin does, so that ops read either alike.
    fn alike(&self, tensor: &dyn Any) -> bool;
    /// Copies `tensor` into the pin, on the stream, ahead of the next launch.
    fn fill(&self, tensor: &dyn Any) -> Result<(), GraphError>;
}

/// A pin a graph reads in place of a constant, with the tensor whose values it holds.
pub(crate) struct ConstantPin {
    slot: Box<dyn PinSlot>,
    /// The pin's key, as the graph's recording names the value.
    key: Key,
    /// The key of the tensor whose values the pin holds, and a handle on that tensor.
    source: Mutex<(Key, Value)>,
}

impl std::fmt::Debug for ConstantPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstantPin")
            .field("key", &self.key)
            .finish()
    }
}

impl ConstantPin {
    /// The pin's key in the recording.
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }

    /// The tensor whose values the pin holds: its key and a handle on it. (Nothing
    /// panics while it is locked; a poisoned lock's value is whole.)
    fn held(&self) -> MutexGuard<'_, (Key, Value)> {
        self.source.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The allocation of the tensor whose values the pin holds.
    pub(crate) fn source_allocation(&self) -> AllocationId {
        self.held().0.0.clone()
    }

    /// The tensor whose values the pin holds (a primitive).
    pub(crate) fn source(&self) -> Value {
        Arc::clone(&self.held().1)
    }

    /// Copies the tensor it stands for into the pin: after the capture's window, before
    /// its first launch.
    pub(crate) fn fill_from_source(&self) -> Result<(), GraphError> {
        let source = self.source();
        self.slot.fill(&*source)
    }

    /// The pin alone, for a graph whose replays are not traced: it keeps the values the
    /// capture filled it with, and no handle on their tensor.
    pub(crate) fn into_slot(self) -> Box<dyn PinSlot> {
        self.slot
    }

    /// Whether the pin holds the values of `tensor` (of key `key`) for the next launch:
    /// it already does, or `tensor` lies alike and was copied in now.
    pub(crate) fn take(&self, key: &Key, tensor: &dyn AsValue) -> bool {
        let mut source = self.held();
        if source.0 == *key {
            return true;
        }
        let value = tensor.as_value();
        if !self.slot.alike(&*value) || self.slot.fill(&*value).is_err() {
            return false;
        }
        *source = (key.clone(), value);
        true
    }
}

/// One pin a capture may read, and what it read in its place.
struct Entry {
    slot: Option<Box<dyn PinSlot>>,
    /// The constant the capture read here: its key and a handle on it.
    source: Option<(Key, Value)>,
    /// The pin's own key, once swapped in.
    key: Option<Key>,
}

/// The pins a capture reads in place of its constants.
struct Swaps {
    entries: Vec<Entry>,
    /// The entry of each constant's allocation, in the order the step first read them.
    by_allocation: FxHashMap<AllocationId, usize>,
}

thread_local! {
    static SWAPS: RefCell<Option<Swaps>> = const { RefCell::new(None) };
    static SWAPPING: Cell<bool> = const { Cell::new(false) };
}

/// Constants read through pins on this thread until [`finish`](Self::finish).
#[must_use = "constants are swapped only while the guard lives"]
pub(crate) struct Swapping {
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl Swapping {
    /// Swaps the constants a capture reads for `pins`, by the order of first reads.
    pub(crate) fn begin(pins: Vec<Option<Box<dyn PinSlot>>>) -> Self {
        let entries = pins
            .into_iter()
            .map(|slot| Entry {
                slot,
                source: None,
                key: None,
            })
            .collect();
        SWAPS.with(|swaps| {
            *swaps.borrow_mut() = Some(Swaps {
                entries,
                by_allocation: FxHashMap::default(),
            })
        });
        SWAPPING.with(|swapping| swapping.set(true));
        Self {
            _thread_bound: std::marker::PhantomData,
        }
    }

    /// The pins the capture read, each holding (once the caller fills it) the constant it
    /// stood for.
    pub(crate) fn finish(self) -> Vec<ConstantPin> {
        let swaps = SWAPS.with(|swaps| swaps.borrow_mut().take());
        drop(self);
        let Some(swaps) = swaps else {
            return Vec::new();
        };
        swaps
            .entries
            .into_iter()
            .filter_map(|entry| {
                Some(ConstantPin {
                    key: entry.key?,
                    source: Mutex::new(entry.source?),
                    slot: entry.slot?,
                })
            })
            .collect()
    }
}

impl Drop for Swapping {
    fn drop(&mut self) {
        SWAPPING.with(|swapping| swapping.set(false));
        SWAPS.with(|swaps| swaps.borrow_mut().take());
    }
}

/// `tensor`, or the pin the capture reads in its place where it is a constant (a first
/// read, from outside the step, of an allocation the trainer does not account for) that
/// lies as its pin does. Another view of an allocation already swapped is read as it is.
pub(crate) fn swap<T>(tensor: T) -> T
where
    T: TensorMetadata + Allocated + Clone + Send + Sync + 'static,
{
    if !SWAPPING.with(Cell::get) {
        return tensor;
    }
    SWAPS.with(|swaps| match swaps.borrow_mut().as_mut() {
        Some(swaps) => swaps.swap(tensor),
        None => tensor,
    })
}

impl Swaps {
    fn swap<T>(&mut self, tensor: T) -> T
    where
        T: TensorMetadata + Allocated + Clone + Send + Sync + 'static,
    {
        let Some(allocation) = tensor.allocation_id() else {
            return tensor;
        };
        let index = match self.by_allocation.get(&allocation) {
            Some(&index) => index,
            None if super::session::wanted(&allocation) => {
                let index = self.by_allocation.len();
                self.by_allocation.insert(allocation, index);
                index
            }
            None => return tensor,
        };
        let Some(entry) = self.entries.get_mut(index) else {
            return tensor;
        };
        let Some(slot) = &entry.slot else {
            return tensor;
        };
        let Some(key) = key_of(&tensor) else {
            return tensor;
        };
        let pin = slot.pin();
        let Some(pin) = pin.downcast_ref::<T>().cloned() else {
            return tensor;
        };
        match &entry.source {
            Some((source, _)) if *source != key => return tensor,
            Some(_) => {}
            None if slot.alike(&tensor) => {
                let Some(pin_key) = key_of(&pin) else {
                    return tensor;
                };
                entry.key = Some(pin_key);
                entry.source = Some((key, tensor.as_value()));
            }
            None => return tensor,
        }
        pin
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use burn_backend::TensorMetadata;
    use burn_backend::{DType, Shape};

    use super::*;
    use crate::backend::session::CaptureSession;

    /// A tensor: its allocation and its length (what "lies alike" compares here).
    #[derive(Clone, Debug, PartialEq)]
    struct Fake {
        allocation: u64,
        len: usize,
    }

    impl Allocated for Fake {
        fn allocation_id(&self) -> Option<AllocationId> {
            Some(AllocationId::unique(self.allocation))
        }
    }

    impl TensorMetadata for Fake {
        fn dtype(&self) -> DType {
            DType::F32
        }
        fn shape(&self) -> Shape {
            Shape::new([self.len])
        }
        fn rank(&self) -> usize {
            1
        }
    }

    fn fake(allocation: u64, len: usize) -> Fake {
        Fake { allocation, len }
    }

    /// A pin that counts what was copied into it.
    struct FakePin {
        pin: Fake,
        fills: Arc<AtomicUsize>,
    }

    impl PinSlot for FakePin {
        fn pin(&self) -> Value {
            Arc::new(self.pin.clone())
        }
        fn alike(&self, tensor: &dyn Any) -> bool {
            tensor
                .downcast_ref::<Fake>()
                .is_some_and(|t| t.len == self.pin.len)
        }
        fn fill(&self, _tensor: &dyn Any) -> Result<(), GraphError> {
            self.fills.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn pin(allocation: u64, len: usize, fills: &Arc<AtomicUsize>) -> Option<Box<dyn PinSlot>> {
        Some(Box::new(FakePin {
            pin: fake(allocation, len),
            fills: Arc::clone(fills),
        }))
    }

    #[test]
    fn a_capture_reads_its_constants_through_pins_that_lie_alike() {
        let fills = Arc::new(AtomicUsize::new(0));
        // Allocation 1 is the trainer's own (skipped): never a constant.
        let session = CaptureSession::begin_keeping(HashSet::from([AllocationId::unique(1)]));
        let swapping = Swapping::begin(vec![pin(100, 4, &fills), pin(101, 4, &fills)]);
        assert_eq!(
            swap(fake(1, 4)),
            fake(1, 4),
            "an accounted tensor is read as it is"
        );
        assert_eq!(
            swap(fake(7, 4)),
            fake(100, 4),
            "the first constant, its pin"
        );
        assert_eq!(swap(fake(7, 4)), fake(100, 4), "read again: the same pin");
        assert_eq!(swap(fake(8, 2)), fake(8, 2), "lies otherwise than its pin");
        let pins = swapping.finish();
        drop(session);
        assert_eq!(
            swap(fake(9, 4)),
            fake(9, 4),
            "nothing is swapped after the capture"
        );
        assert_eq!(pins.len(), 1, "only the pin the capture read is kept");
        let pin = &pins[0];
        assert_eq!(pin.key(), &key_of(&fake(100, 4)).unwrap());
        assert_eq!(pin.source_allocation(), AllocationId::unique(7));
        assert_eq!(
            fills.load(Ordering::SeqCst),
            0,
            "filled by the caller, after the window"
        );
        pin.fill_from_source().unwrap();
        assert_eq!(fills.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_trace_copies_another_constant_alike_into_the_pin_once() {
        let fills = Arc::new(AtomicUsize::new(0));
        let session = CaptureSession::begin_keeping(HashSet::new());
        let swapping = Swapping::begin(vec![pin(100, 4, &fills)]);
        swap(fake(7, 4));
        let pins = swapping.finish();
        drop(session);
        let pin = &pins[0];
        let same = fake(7, 4);
        assert!(
            pin.take(&key_of(&same).unwrap(), &same),
            "the tensor it holds"
        );
        assert_eq!(fills.load(Ordering::SeqCst), 0, "nothing to copy");
        let other = fake(8, 4);
        assert!(
            pin.take(&key_of(&other).unwrap(), &other),
            "another alike: copied in"
        );
        assert_eq!(fills.load(Ordering::SeqCst), 1);
        assert_eq!(pin.source_allocation(), AllocationId::unique(8));
        assert!(pin.take(&key_of(&other).unwrap(), &other), "held now");
        assert_eq!(fills.load(Ordering::SeqCst), 1);
        let unlike = fake(9, 2);
        assert!(
            !pin.take(&key_of(&unlike).unwrap(), &unlike),
            "lies otherwise"
        );
        assert_eq!(
            pin.source_allocation(),
            AllocationId::unique(8),
            "still holds the last"
        );
    }
}
