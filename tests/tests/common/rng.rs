//! The lock on the process's generators, which every test of the `integration` binary
//! holds for its whole body.
//!
//! The generators are process-wide: Flex keeps one generator for the process (`seed`
//! replaces it; every random op, parameter initialisation included, draws from it), and
//! burn-graph-capture keeps each device's seed and hands every new trainer the next
//! stream of it (a trainer also follows a later `seed`). While the tests were a binary
//! per file, each file serialised its own seeded tests; as modules of one binary they run
//! on threads of one process, so any test that builds a model or a trainer moves the
//! numbers a seeded test elsewhere expects.
//!
//! So: a test that seeds a generator or depends on the numbers a seeded one gives holds
//! the lock [`exclusive`]ly; every other test holds it [`shared`]. The first statement of
//! every test takes one (`main.rs` checks it). Helpers never take it: a thread holding it
//! shared that asks for it exclusively would wait for itself.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static GENERATORS: RwLock<()> = RwLock::new(());

/// For a test that seeds, or draws numbers it expects from a seed: no other test runs
/// while it holds this.
pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
    GENERATORS.write().unwrap_or_else(PoisonError::into_inner)
}

/// For every other test: it may draw and build trainers alongside any test but an
/// exclusive one.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    GENERATORS.read().unwrap_or_else(PoisonError::into_inner)
}
