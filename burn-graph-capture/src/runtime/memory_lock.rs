//! Reading memory handles on any thread, without a trip to the server's thread.
//!
//! CubeCL numbers a memory handle once, when it is made, and never changes that id. But
//! the handle shows it only through its `Debug` form, which also prints where the
//! handle lies (pool, page, slice): a `Cell` that the server moves on its own thread, so
//! a read on another thread could race with a move. Sending every read to the server's
//! thread is safe but costs a round trip of thread wake-ups per tensor, which a trace
//! pays for every input of every op of a step. Instead, the server holds its device's
//! lock through every entry point (each `ComputeServer` method and each task run with
//! `with_server`), and [`memory_at_rest`] runs a read under the same lock: no read
//! overlaps a move, at the cost of an uncontended lock.
//!
//! The lock is reentrant because entry points call one another on the server's thread.
//! It is never held while waiting on another thread's work except by the server itself
//! (a sync inside a profile), so a reader only ever waits for the server's current call.

use std::sync::{Mutex, PoisonError};

use parking_lot::ReentrantMutex;

/// One lock per device index, made on first use and kept for the process.
static LOCKS: Mutex<Vec<&'static ReentrantMutex<()>>> = Mutex::new(Vec::new());

/// The lock of device `index`, which its server holds through every entry point: one
/// per device, never shared between two (a server blocked in a collective must not hold
/// another device's readers).
pub(crate) fn lock_of(index: usize) -> &'static ReentrantMutex<()> {
    let mut locks = LOCKS.lock().unwrap_or_else(PoisonError::into_inner);
    while locks.len() <= index {
        locks.push(Box::leak(Box::new(ReentrantMutex::new(()))));
    }
    locks[index]
}

/// Runs `read` while the server of device `index` moves no memory: a read of a memory
/// handle's `Debug` form (its id) on any thread.
pub fn memory_at_rest<R>(index: usize, read: impl FnOnce() -> R) -> R {
    let _held = lock_of(index).lock();
    read()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_device_has_its_own_lock_and_readers_wait_for_the_holder() {
        assert!(!std::ptr::eq(lock_of(0), lock_of(1)));
        assert!(std::ptr::eq(lock_of(3), lock_of(3)));
        let guard = lock_of(5).lock();
        // Reentrant on the holder's thread.
        assert_eq!(memory_at_rest(5, || 7), 7);
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            memory_at_rest(5, || tx.send(()).unwrap());
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            rx.try_recv().is_err(),
            "a reader ran while the server held the lock"
        );
        drop(guard);
        reader.join().unwrap();
        assert!(rx.try_recv().is_ok());
        // Another device's readers do not wait.
        let _other = lock_of(6).lock();
        assert_eq!(
            std::thread::spawn(|| memory_at_rest(7, || 1))
                .join()
                .unwrap(),
            1
        );
    }
}
