//! Reading memory handles on any thread, without a trip to the server's thread.
//!
//! CubeCL numbers a memory handle once, when it is made, and never changes that id. But
//! the handle shows it only through its `Debug` form, which also reads where the
//! handle lies (pool, page, slice): a `Cell` that the server moves on its own thread, so
//! a read on another thread could race with a move. Sending every read to the server's
//! thread is safe but costs a round trip of thread wake-ups per tensor, which a trace
//! pays for every input of every op of a step. Instead, the server holds its device's
//! lock through every entry point (each `ComputeServer` method and each task run with
//! `with_server`), and [`memory_at_rest`] runs a read under the same lock: no read
//! overlaps a move, at the cost of an uncontended lock.
//!
//! The server lets the lock go while it waits for the device ([`waiting_unlocked`]):
//! it moves no memory then, and a reader must not wait for the device's queue to drain
//! (a trace runs while the step before it replays). Holds nest, because entry points
//! call one another on the server's thread: the lock is taken at a thread's first hold
//! and let go at its last.

use std::cell::RefCell;
use std::marker::PhantomData;

use parking_lot::RawMutex;
use parking_lot::lock_api::RawMutex as _;

/// Device indices a process may lock: far more GPUs than one host holds.
const MAX_DEVICES: usize = 256;

/// One lock per device index, for the process: found without a lock of its own, since
/// a trace reads an id under one for every input of every op.
static LOCKS: [RawMutex; MAX_DEVICES] = [const { RawMutex::INIT }; MAX_DEVICES];

thread_local! {
    /// This thread's holds on each device's lock, by device index.
    static HOLDS: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// The lock of device `index`: one per device, never shared between two (a server
/// blocked in a collective must not hold another device's readers).
fn lock_of(index: usize) -> &'static RawMutex {
    LOCKS.get(index).unwrap_or_else(|| {
        panic!("device index {index}: this runtime locks devices below {MAX_DEVICES} only")
    })
}

/// A hold on a device's memory lock, for one entry point or one read; the lock stays
/// taken while this thread has any hold on it.
#[must_use = "the lock is held only while the hold lives"]
pub(crate) struct MemoryHold {
    index: usize,
    /// The device's lock, looked up once.
    lock: &'static RawMutex,
    /// Let go on the thread that took it.
    _thread_bound: PhantomData<*const ()>,
}

/// Holds device `index`'s memory lock until the hold is dropped.
pub(crate) fn hold(index: usize) -> MemoryHold {
    let first = HOLDS.with(|holds| {
        let mut holds = holds.borrow_mut();
        if holds.len() <= index {
            holds.resize(index + 1, 0);
        }
        holds[index] += 1;
        holds[index] == 1
    });
    let lock = lock_of(index);
    if first {
        lock.lock();
    }
    MemoryHold {
        index,
        lock,
        _thread_bound: PhantomData,
    }
}

impl Drop for MemoryHold {
    fn drop(&mut self) {
        let last = HOLDS.with(|holds| {
            let mut holds = holds.borrow_mut();
            holds[self.index] -= 1;
            holds[self.index] == 0
        });
        if last {
            // SAFETY: this thread took the lock at its first hold, which is still
            // counted until now, and has not let it go since (`waiting_unlocked` takes
            // it back before returning).
            unsafe { self.lock.unlock() };
        }
    }
}

/// Runs `wait` (a wait for the device) with every memory lock this thread holds let go,
/// and takes them back after it: readers do not wait for the device through the server.
/// `wait` must not touch memory handles.
pub(crate) fn waiting_unlocked<R>(wait: impl FnOnce() -> R) -> R {
    let held: Vec<&'static RawMutex> = HOLDS.with(|holds| {
        let holds = holds.borrow();
        (0..holds.len())
            .filter(|&index| holds[index] > 0)
            .map(lock_of)
            .collect()
    });
    for lock in &held {
        // SAFETY: this thread holds the lock (its count is above zero); `Retake` takes
        // it back before any hold can be dropped, also if `wait` unwinds.
        unsafe { lock.unlock() };
    }
    let _retake = Retake(held);
    wait()
}

/// Takes back the locks [`waiting_unlocked`] let go, when the wait ends or unwinds.
struct Retake(Vec<&'static RawMutex>);

impl Drop for Retake {
    fn drop(&mut self) {
        for lock in &self.0 {
            lock.lock();
        }
    }
}

/// Runs `read` while the server of device `index` moves no memory: a read of a memory
/// handle's `Debug` form (its id) on any thread.
pub fn memory_at_rest<R>(index: usize, read: impl FnOnce() -> R) -> R {
    let _hold = hold(index);
    read()
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    use super::*;

    /// Long enough for a reader to get in on a loaded machine.
    const LET_IN: Duration = Duration::from_secs(10);
    /// Long enough to see a reader kept out.
    const KEPT_OUT: Duration = Duration::from_millis(50);

    /// Whether a reader on another thread gets device `index`'s lock within `within`.
    fn reader_gets_in(index: usize, within: Duration) -> (bool, thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let reader = thread::spawn(move || {
            // The receiver is gone where the reader was kept out.
            memory_at_rest(index, || {
                let _ = tx.send(());
            })
        });
        let got_in = rx.recv_timeout(within).is_ok();
        (got_in, reader)
    }

    #[test]
    fn readers_wait_for_the_holder_and_devices_do_not_share_a_lock() {
        assert!(!std::ptr::eq(lock_of(0), lock_of(1)));
        assert!(std::ptr::eq(lock_of(3), lock_of(3)));
        let outer = hold(5);
        // Nested holds on the holder's thread do not block, and the lock stays taken
        // until the last one goes.
        assert_eq!(memory_at_rest(5, || 7), 7);
        let (got_in, reader) = reader_gets_in(5, KEPT_OUT);
        assert!(!got_in, "a reader ran while the server held the lock");
        drop(outer);
        reader.join().unwrap();
        // Another device's readers do not wait.
        let _other = hold(6);
        let (got_in, reader) = reader_gets_in(7, LET_IN);
        assert!(got_in);
        reader.join().unwrap();
    }

    #[test]
    fn a_wait_that_unwinds_takes_the_lock_back() {
        let outer = hold(11);
        let unwound = std::panic::catch_unwind(|| waiting_unlocked(|| panic!("in the wait")));
        assert!(unwound.is_err());
        let (got_in, reader) = reader_gets_in(11, KEPT_OUT);
        assert!(
            !got_in,
            "the lock was not taken back after the wait unwound"
        );
        drop(outer);
        reader.join().unwrap();
    }

    #[test]
    fn a_wait_for_the_device_lets_readers_in_and_takes_the_lock_back() {
        let outer = hold(9);
        let inner = hold(9);
        let (got_in, reader) = waiting_unlocked(|| reader_gets_in(9, LET_IN));
        assert!(
            got_in,
            "a reader waited on the server's wait for the device"
        );
        reader.join().unwrap();
        // Taken back: readers wait again until the last hold goes.
        drop(inner);
        let (got_in, reader) = reader_gets_in(9, KEPT_OUT);
        assert!(!got_in, "the lock was not taken back after the wait");
        drop(outer);
        reader.join().unwrap();
    }
}
