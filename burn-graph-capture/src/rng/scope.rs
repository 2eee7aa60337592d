//! The generator that a trainer's step draws from, on the thread that runs the step.
//!
//! Burn's random ops take no generator: `Dropout` calls `float_random` with a shape and
//! a distribution only. While a trainer runs a step it opens a [`DrawScope`] with its
//! generator's device state, and the decorator's `float_random` draws from that state:
//! the `j`-th draw of the step at offset `offset + j`. Like capture sessions, a scope
//! is thread-local, since Burn runs a step's ops on the calling thread.

use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;

thread_local! {
    static ACTIVE: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// An open scope's state.
struct Active {
    /// The generator's device state (an int primitive of the inner backend).
    state: Box<dyn Any>,
    /// Draws served so far in this step.
    draws: u32,
    /// What each draw was, for the report.
    served: Vec<String>,
}

/// What a step drew from its generator.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Draws {
    /// How many draws, so how far the offset advances.
    pub(crate) count: u32,
    /// Each draw's op, distribution and shape, in order.
    pub(crate) served: Vec<String>,
}

/// Serves random ops of this thread from a generator state until finished or dropped.
/// Scopes do not nest: a scope opened inside another (a trainer stepping inside
/// another's step closure) hides the outer one until it ends.
#[must_use = "a scope serves draws until it is finished or dropped"]
pub(crate) struct DrawScope {
    outer: Option<Active>,
    _thread_bound: PhantomData<*const ()>,
}

impl DrawScope {
    /// Opens a scope drawing from `state`.
    pub(crate) fn begin<T: 'static>(state: T) -> Self {
        let active = Active {
            state: Box::new(state),
            draws: 0,
            served: Vec::new(),
        };
        let outer = ACTIVE.with(|a| a.borrow_mut().replace(active));
        Self {
            outer,
            _thread_bound: PhantomData,
        }
    }

    /// Closes the scope: what it drew.
    pub(crate) fn finish(mut self) -> Draws {
        let active = ACTIVE.with(|a| std::mem::replace(&mut *a.borrow_mut(), self.outer.take()));
        std::mem::forget(self);
        active.map_or_else(Draws::default, |a| Draws {
            count: a.draws,
            served: a.served,
        })
    }
}

impl Drop for DrawScope {
    fn drop(&mut self) {
        let outer = self.outer.take();
        ACTIVE.with(|a| *a.borrow_mut() = outer);
    }
}

/// The state of this thread's open scope, if it is a `T`.
pub(crate) fn state<T: Clone + 'static>() -> Option<T> {
    ACTIVE.with(|a| {
        a.borrow()
            .as_ref()
            .and_then(|active| active.state.downcast_ref::<T>().cloned())
    })
}

/// Takes the next draw of the open scope: its index in the step. `what` describes it
/// for the report.
pub(crate) fn next_draw(what: impl FnOnce() -> String) -> Option<u32> {
    ACTIVE.with(|a| {
        let mut active = a.borrow_mut();
        let active = active.as_mut()?;
        let index = active.draws;
        active.draws = index.checked_add(1)?;
        active.served.push(what());
        Some(index)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_counts_its_draws_and_hides_an_outer_one() {
        assert_eq!(state::<u8>(), None);
        assert_eq!(next_draw(String::new), None);
        let outer = DrawScope::begin(1_u8);
        assert_eq!(next_draw(|| "a".into()), Some(0));
        {
            let inner = DrawScope::begin(2_u8);
            assert_eq!(state::<u8>(), Some(2));
            assert_eq!(next_draw(|| "b".into()), Some(0));
            assert_eq!(inner.finish().count, 1);
        }
        assert_eq!(state::<u8>(), Some(1));
        // Another type of state is not served.
        assert_eq!(state::<u16>(), None);
        assert_eq!(next_draw(|| "c".into()), Some(1));
        let draws = outer.finish();
        assert_eq!(draws.count, 2);
        assert_eq!(draws.served, ["a", "c"]);
        assert_eq!(state::<u8>(), None);
    }

    #[test]
    fn a_dropped_scope_leaves_nothing_open() {
        let scope = DrawScope::begin(3_u8);
        drop(scope);
        assert_eq!(state::<u8>(), None);
        let panicked = std::panic::catch_unwind(|| {
            let _scope = DrawScope::begin(4_u8);
            panic!("step failed");
        });
        assert!(panicked.is_err());
        assert_eq!(state::<u8>(), None);
    }
}
