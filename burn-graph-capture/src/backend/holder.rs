//! Whether a tensor a graph reads as a constant is still held outside the graph.
//!
//! A replay does not call the step closure, so it cannot see the closure read another
//! tensor than the one captured (a target network replaced every N steps, a mask the
//! loop rebuilt). What it can see cheaply is that nothing outside the graph holds the
//! captured tensor any more: then whatever the closure reads now is something else, and
//! the graph is stale. A [`Holder`] keeps one handle on such an allocation (so that its
//! identity stays unique) and answers from its reference counts, on the host, with no
//! device work.

use std::fmt;

/// One handle on an allocation a graph reads as a constant.
pub struct Holder(Box<dyn Fn() -> bool + Send + Sync>);

impl Holder {
    /// A holder answering with `held_elsewhere`, which must say whether anything other
    /// than the holder (and the graphs, which retain bindings, not handles) still holds
    /// the allocation.
    pub fn new(held_elsewhere: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self(Box::new(held_elsewhere))
    }

    /// Whether a tensor outside the graph still holds the allocation.
    pub fn held_elsewhere(&self) -> bool {
        (self.0)()
    }
}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holder")
            .field("held_elsewhere", &self.held_elsewhere())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Holder;

    #[test]
    fn a_holder_answers_from_what_it_watches() {
        let watched = Arc::new(());
        let mine = Arc::clone(&watched);
        let holder = Holder::new(move || Arc::strong_count(&mine) > 1);
        assert!(holder.held_elsewhere());
        drop(watched);
        assert!(!holder.held_elsewhere());
    }
}
