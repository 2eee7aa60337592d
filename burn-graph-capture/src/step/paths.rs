//! The paths a shape's step takes while it warms up.
//!
//! A host branch (a coin picking a head, LayerDrop picking layers) gives one batch shape
//! several paths of the step closure, taken in any order. Warmup counts each path's
//! steps, so that a path that recurs gets its graph however the others interleave,
//! while a step that never repeats (a host value changed at every step) never does.

use super::cache::Observation;

/// Most paths a shape remembers while it warms up; beyond it, the least recently taken
/// one is forgotten.
const MAX_PATHS: usize = 8;

/// Paths seen in a shape's warmup, besides the one it counts now: each with its steps,
/// the most recently taken first.
#[derive(Debug, Default)]
pub(crate) struct Paths(Vec<(Observation, usize)>);

impl Paths {
    /// Takes out the remembered path `step` took: how many steps took it before.
    pub(crate) fn take(&mut self, step: &Observation) -> Option<usize> {
        let index = self.position(step)?;
        Some(self.0.remove(index).1)
    }

    /// Remembers `path`, taken by `steps` steps.
    pub(crate) fn remember(&mut self, path: Observation, steps: usize) {
        self.0.insert(0, (path, steps));
        self.0.truncate(MAX_PATHS);
    }

    /// Whether `step` took a remembered path that it makes at least `steps` steps long.
    pub(crate) fn recurs(&self, step: &Observation, steps: usize) -> bool {
        self.position(step)
            .is_some_and(|index| self.0[index].1 + 1 >= steps)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    fn position(&self, step: &Observation) -> Option<usize> {
        self.0
            .iter()
            .position(|(path, _)| step.verdict(Some(path)).is_none())
    }
}
