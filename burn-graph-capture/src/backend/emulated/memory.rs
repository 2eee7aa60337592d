//! Pinned buffers for Flex, written in place as device memory is.
//!
//! A device graph reads and writes fixed addresses: every handle on a pinned buffer sees
//! what the last replay wrote. Flex shares a tensor's bytes through an `Arc` and never
//! writes bytes that another handle holds, so an emulated pin is a Flex tensor whose
//! bytes live in a buffer this module can write: `Bytes` over an allocation controller
//! of its own, whose memory sits in an `UnsafeCell`.
//!
//! Writes happen only where a device would write the pin: a copy into it outside a
//! capture, or a replay's write-back, on the thread that steps the trainer and between
//! ops, never while a Flex op reads the pin. The trainer never lends a pinned tensor out
//! (`step::views` lends copies), so no other thread reads one while it is written.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, Weak};

use burn_flex::{FlexTensor, Layout};
use cubecl_common::bytes::{AllocationController, AllocationProperty, Bytes};

use crate::backend::GraphError;

/// The alignment of a pinned buffer: that of every element type Flex reads.
const ALIGN: usize = 16;

/// The bytes of one pinned buffer.
struct Buffer {
    /// 16-byte words, so that Flex may view the bytes as any element type.
    words: UnsafeCell<Box<[MaybeUninit<u128>]>>,
    len: usize,
}

// SAFETY: the buffer is written only as the module docs say: on the stepping thread,
// while no reference to its bytes is alive.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(bytes: &[u8]) -> Arc<Self> {
        let words = bytes.len().div_ceil(ALIGN);
        let buffer = Arc::new(Self {
            words: UnsafeCell::new(vec![MaybeUninit::new(0u128); words].into_boxed_slice()),
            len: bytes.len(),
        });
        buffer.write(0, bytes);
        buffer
    }

    fn start(&self) -> *mut u8 {
        // SAFETY: a pointer to the words, not a reference to them.
        unsafe { (*self.words.get()).as_mut_ptr().cast() }
    }

    /// Writes `bytes` at `offset` (bounds checked by the caller).
    fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(
            offset + bytes.len() <= self.len,
            "a pin write within its buffer"
        );
        // SAFETY: in bounds (above); no reference to these bytes is alive (module docs).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.start().add(offset), bytes.len())
        };
    }
}

/// Flex's view of a pinned buffer.
struct Controller(Arc<Buffer>);

impl AllocationController for Controller {
    fn alloc_align(&self) -> usize {
        ALIGN
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::Other
    }

    unsafe fn memory_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        // SAFETY: `&mut self` means this `Bytes` is Flex's only handle, so nothing else
        // reads the buffer now; the bytes are initialized (zeroed, then written).
        unsafe { std::slice::from_raw_parts_mut(self.0.start().cast(), self.0.len) }
    }

    fn memory(&self) -> &[MaybeUninit<u8>] {
        // SAFETY: initialized bytes; not written while this reference lives (module docs).
        unsafe { std::slice::from_raw_parts(self.0.start().cast(), self.0.len) }
    }
}

/// Pinned buffers by the address of their bytes, to find a pin from its tensor.
static PINS: Mutex<Option<HashMap<usize, Weak<Buffer>>>> = Mutex::new(None);

fn pins() -> std::sync::MutexGuard<'static, Option<HashMap<usize, Weak<Buffer>>>> {
    PINS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A pinned copy of `tensor`: its bytes, its layout.
pub(crate) fn pin(tensor: &FlexTensor) -> FlexTensor {
    let buffer = Buffer::new(tensor.bytes());
    let address = buffer.start() as usize;
    {
        let mut pins = pins();
        let pins = pins.get_or_insert_with(HashMap::new);
        pins.retain(|_, pin| pin.strong_count() > 0);
        pins.insert(address, Arc::downgrade(&buffer));
    }
    let len = buffer.len;
    // SAFETY: the controller's memory holds `len` initialized bytes.
    let bytes = unsafe { Bytes::from_controller(Box::new(Controller(buffer)), len) };
    FlexTensor::new(bytes, tensor.layout().clone(), tensor.dtype())
}

/// The pinned buffer `tensor` lies in, if it is a pin.
fn buffer_of(tensor: &FlexTensor) -> Option<Arc<Buffer>> {
    let address = tensor.bytes().as_ptr() as usize;
    let pins = pins();
    let buffer = pins.as_ref()?.get(&address)?.upgrade()?;
    (buffer.start() as usize == address).then_some(buffer)
}

/// Whether `tensor` lies in a pinned buffer.
pub(crate) fn is_pinned(tensor: &FlexTensor) -> bool {
    buffer_of(tensor).is_some()
}

/// The lowest and highest element offsets a layout reaches, from its start.
fn reach(layout: &Layout) -> (isize, isize) {
    layout
        .shape()
        .iter()
        .zip(layout.strides())
        .fold((0, 0), |(low, high), (&size, &stride)| {
            let span = stride * (size.max(1) as isize - 1);
            (low + span.min(0), high + span.max(0))
        })
}

/// Whether `src` lies as the pin `dst` does (same shape, dtype and strides), so that
/// kernels reading the pin read the values as they read `src`.
pub(crate) fn lies_alike(dst: &FlexTensor, src: &FlexTensor) -> Result<(), GraphError> {
    let (pinned, given) = (dst.layout(), src.layout());
    if dst.dtype() == src.dtype()
        && pinned.shape() == given.shape()
        && pinned.strides() == given.strides()
    {
        return Ok(());
    }
    let strides = |layout: &Layout| layout.strides().iter().map(|s| s.unsigned_abs()).collect();
    Err(GraphError::LayoutDiffers {
        shape: given.shape().to_vec(),
        pinned: strides(pinned),
        given: strides(given),
    })
}

/// Copies `src`'s values into the pin `dst`, which must lie as `src` does.
pub(crate) fn write(dst: &FlexTensor, src: &FlexTensor) -> Result<(), GraphError> {
    let buffer = buffer_of(dst).ok_or(GraphError::NoArena)?;
    lies_alike(dst, src)?;
    let (pinned, given) = (dst.layout(), src.layout());
    if given.num_elements() == 0 {
        return Ok(());
    }
    let size = src.dtype().size();
    let (low, high) = reach(given);
    let span = (high - low + 1) as usize * size;
    let from = (given.start_offset() as isize + low) as usize * size;
    let to = (pinned.start_offset() as isize + low) as usize * size;
    // Taken out first: `src` may be the pin itself (a parameter no step changed).
    let values = src.bytes()[from..from + span].to_vec();
    buffer.write(to, &values);
    Ok(())
}

#[cfg(test)]
mod tests {
    use burn_backend::{Shape, TensorData};

    use super::*;

    fn tensor(values: &[f32], shape: [usize; 2]) -> FlexTensor {
        FlexTensor::from_data(TensorData::new(values.to_vec(), Shape::new(shape)))
    }

    #[test]
    fn a_write_is_seen_by_every_handle_on_the_pin() {
        let pin = pin(&tensor(&[1.0, 2.0, 3.0, 4.0], [2, 2]));
        let held = pin.clone();
        write(&pin, &tensor(&[5.0, 6.0, 7.0, 8.0], [2, 2])).unwrap();
        assert_eq!(held.storage::<f32>(), &[5.0, 6.0, 7.0, 8.0]);
        assert!(is_pinned(&held));
        assert!(!is_pinned(&tensor(&[0.0; 4], [2, 2])));
    }

    #[test]
    fn a_pin_keeps_the_layout_it_copied_and_refuses_another() {
        let transposed = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]).transpose(0, 1);
        let pin = pin(&transposed);
        assert_eq!(pin.layout(), transposed.layout());
        let next = tensor(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], [2, 3]).transpose(0, 1);
        write(&pin, &next).unwrap();
        assert_eq!(
            pin.to_contiguous().storage::<f32>(),
            [7.0, 10.0, 8.0, 11.0, 9.0, 12.0]
        );
        let contiguous = tensor(&[0.0; 6], [3, 2]);
        assert!(matches!(
            write(&pin, &contiguous),
            Err(GraphError::LayoutDiffers { .. })
        ));
        assert_eq!(write(&contiguous, &contiguous), Err(GraphError::NoArena));
    }
}
