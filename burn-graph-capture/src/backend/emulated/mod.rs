//! Graphs emulated on the host, so that tests without a GPU see replays.
//!
//! With [`EmulatedGraphs`] on, Flex captures a step as a [`Program`]: the ops it ran,
//! each with its host attributes and the slots it read and wrote. A replay runs that
//! recording again on the pinned buffers and never calls the step closure, exactly as a
//! device graph replays its kernels: whatever the closure read from the host is replayed
//! as it was at capture, and a constant the closure no longer reads is still read. The
//! trainer's graphs, guards and fallbacks then run on a CPU as they do on a GPU.

pub(crate) mod program;

#[cfg(feature = "flex")]
pub(crate) mod memory;

use std::cell::Cell;
use std::marker::PhantomData;

pub use program::Program;

thread_local! {
    /// Open [`EmulatedGraphs`] guards on this thread.
    static ON: Cell<usize> = const { Cell::new(0) };
}

/// Graphs emulated on the host for Flex on this thread, while this guard lives.
///
/// Turn it on before the trainers it is meant for are built: a trainer asks once whether
/// its device has graphs to pin its generator. Tests only: an emulated graph runs every
/// op of its step again on the CPU, so it is slower than the eager step it stands for.
#[must_use = "graphs are emulated only while the guard lives"]
pub struct EmulatedGraphs {
    _thread_bound: PhantomData<*const ()>,
}

impl EmulatedGraphs {
    /// Emulates graphs on this thread until the guard is dropped.
    pub fn on() -> Self {
        ON.with(|on| on.set(on.get() + 1));
        Self {
            _thread_bound: PhantomData,
        }
    }

    /// Whether graphs are emulated on this thread.
    pub fn active() -> bool {
        ON.with(Cell::get) != 0
    }
}

impl Drop for EmulatedGraphs {
    fn drop(&mut self) {
        ON.with(|on| on.set(on.get() - 1));
    }
}
