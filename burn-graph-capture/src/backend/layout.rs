//! Where a tensor's values lie in its buffer, for pins that must keep that placement.
//!
//! CubeCL picks kernels (and autotune keys) by strides: a matmul over a pitched buffer
//! (rows padded to an aligned width, as the runtime lays out uploads and op outputs) is
//! not the matmul over the same values packed tight. A pinned parameter or static input
//! that changed its strides would make every step that reads it launch other kernels than
//! eager steps do, and round apart from them. So pins keep the layout of what they pin,
//! when its values fill their span of the buffer nearly densely.
//!
//! Pure functions of shapes and strides (in elements), so they are tested without a GPU.

/// Elements from a layout's first to its last, if no two indices share an element
/// (no broadcast, no overlap). An empty tensor spans nothing.
pub(crate) fn span(shape: &[usize], strides: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut dims: Vec<(usize, usize)> = shape
        .iter()
        .zip(strides)
        .filter(|(size, _)| **size > 1)
        .map(|(size, stride)| (*size, *stride))
        .collect();
    dims.sort_by_key(|&(_, stride)| stride);
    let mut last = 0;
    for (size, stride) in dims {
        if stride <= last {
            return None;
        }
        last += (size - 1) * stride;
    }
    Some(last + 1)
}

/// Whether a pin keeps this layout: its indices are distinct and its span holds at most
/// a few times its values (padded rows, a permutation), not a small view of a large
/// buffer, whose pin would copy mostly other tensors' bytes.
pub(crate) fn pinnable_as_it_lies(shape: &[usize], strides: &[usize]) -> bool {
    let values: usize = shape.iter().product();
    span(shape, strides).is_some_and(|span| span <= 4 * values + 64)
}

/// Whether two layouts of `shape` put every value at the same offset: equal strides
/// wherever a dimension has more than one index.
pub(crate) fn same_placement(shape: &[usize], a: &[usize], b: &[usize]) -> bool {
    shape
        .iter()
        .zip(a.iter().zip(b))
        .all(|(&size, (x, y))| size <= 1 || x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_covers_padding_but_not_overlap() {
        assert_eq!(span(&[2, 3], &[3, 1]), Some(6));
        // Rows of 3 padded to 4 (a pitched upload).
        assert_eq!(span(&[2, 3], &[4, 1]), Some(7));
        assert_eq!(span(&[4, 8, 3], &[32, 4, 1]), Some(127));
        // A transposed [2, 3] buffer.
        assert_eq!(span(&[3, 2], &[1, 3]), Some(6));
        // Size-1 dimensions carry any stride.
        assert_eq!(span(&[2, 1, 3], &[3, 99, 1]), Some(6));
        // Broadcasts and overlapping views share elements.
        assert_eq!(span(&[2, 3], &[0, 1]), None);
        assert_eq!(span(&[3, 3], &[1, 1]), None);
        assert_eq!(span(&[0, 3], &[3, 1]), Some(0));
    }

    #[test]
    fn pitched_and_permuted_layouts_are_pinned_as_they_lie() {
        assert!(pinnable_as_it_lies(&[8, 6], &[8, 1]));
        assert!(pinnable_as_it_lies(&[6, 8], &[1, 8]));
        assert!(pinnable_as_it_lies(&[16, 2], &[4, 1]));
        // One column of a wide buffer, a broadcast.
        assert!(!pinnable_as_it_lies(&[64, 1], &[1024, 1]));
        assert!(!pinnable_as_it_lies(&[4, 4], &[0, 1]));
    }

    #[test]
    fn placement_ignores_the_strides_of_size_one_dimensions() {
        assert!(same_placement(&[1, 4, 3], &[12, 3, 1], &[3, 3, 1]));
        assert!(!same_placement(&[2, 3], &[4, 1], &[3, 1]));
    }
}
