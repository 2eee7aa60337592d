//! The paths a shape's step takes while it warms up.
//!
//! A host branch (a coin picking a head, LayerDrop picking layers) gives one batch shape
//! several paths of the step closure, taken in any order. Warmup counts each path's
//! steps, so that a path that recurs gets its graph however the others interleave,
//! while a step that never repeats (a host value changed at every step) never does.

/// Most paths a shape remembers while it warms up; beyond it, the least recently taken
/// one is forgotten.
const MAX_PATHS: usize = 8;

/// Paths seen in a shape's warmup, besides the one it counts now: each (what its steps
/// did, `P`) with its steps, the most recently taken first. A step took a path where
/// `took` says so.
#[derive(Debug)]
pub(crate) struct Paths<P>(Vec<(P, usize)>);

impl<P> Default for Paths<P> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<P> Paths<P> {
    /// Takes out the remembered path a step took: how many steps took it before.
    pub(crate) fn take(&mut self, took: impl Fn(&P) -> bool) -> Option<usize> {
        let index = self.0.iter().position(|(path, _)| took(path))?;
        Some(self.0.remove(index).1)
    }

    /// Remembers `path`, taken by `steps` steps.
    pub(crate) fn remember(&mut self, path: P, steps: usize) {
        self.0.insert(0, (path, steps));
        self.0.truncate(MAX_PATHS);
    }

    /// Whether a step took a remembered path that it makes at least `steps` steps long.
    pub(crate) fn recurs(&self, took: impl Fn(&P) -> bool, steps: usize) -> bool {
        self.0
            .iter()
            .any(|(path, before)| before + 1 >= steps && took(path))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_counted_apart_and_the_oldest_is_forgotten() {
        let mut paths = Paths::default();
        for path in 0..=MAX_PATHS {
            paths.remember(path, path + 1);
        }
        assert_eq!(paths.take(|path| *path == 0), None, "forgotten");
        assert!(paths.recurs(|path| *path == 2, 4));
        assert!(!paths.recurs(|path| *path == 2, 5));
        assert_eq!(paths.take(|path| *path == 3), Some(4));
        assert_eq!(paths.take(|path| *path == 3), None, "taken out");
    }
}
