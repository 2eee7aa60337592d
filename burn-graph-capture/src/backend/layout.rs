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

/// Elements from a layout's first index to its last: what a copy of its values as they
/// lie covers. Unlike [`span`], indices may share elements: a broadcast dimension
/// (stride 0) reaches nothing further.
pub(crate) fn reach(shape: &[usize], strides: &[usize]) -> usize {
    if shape.contains(&0) {
        return 0;
    }
    1 + shape
        .iter()
        .zip(strides)
        .map(|(size, stride)| (size - 1) * stride)
        .sum::<usize>()
}

/// Most bytes a replay copies for one batch tensor kept as it lies.
const MAX_INPUT_REACH_BYTES: usize = 16 << 20;

/// Whether a batch tensor's pin keeps its layout: also a view whose reach is mostly
/// other values (a target column sliced from a wide upload, an `expand`ed mask), as long
/// as copying that reach each replay stays small. Kernels then read the pin as eager
/// kernels read the view; a larger view is pinned packed, and each replay packs it.
pub(crate) fn input_pinnable_as_it_lies(shape: &[usize], strides: &[usize], elem: usize) -> bool {
    pinnable_as_it_lies(shape, strides) || reach(shape, strides) * elem <= MAX_INPUT_REACH_BYTES
}

/// Whether a layout is packed tight in row-major order (size-1 dimensions aside).
pub(crate) fn is_packed(shape: &[usize], strides: &[usize]) -> bool {
    let mut expected = 1;
    for (&size, &stride) in shape.iter().zip(strides).rev() {
        if size > 1 && stride != expected {
            return false;
        }
        expected *= size;
    }
    true
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
    fn the_reach_of_views_and_broadcasts() {
        assert_eq!(reach(&[2, 3], &[3, 1]), 6);
        // A [64, 1] column of a [64, 1024] upload reaches almost all of it.
        assert_eq!(reach(&[64, 1], &[1024, 1]), 63 * 1024 + 1);
        // An expanded [4, 8] mask of one row reaches that row.
        assert_eq!(reach(&[4, 8], &[0, 1]), 8);
        assert_eq!(reach(&[0, 8], &[8, 1]), 0);
        assert!(input_pinnable_as_it_lies(&[64, 1], &[1024, 1], 4));
        assert!(input_pinnable_as_it_lies(&[4, 8], &[0, 1], 4));
        assert!(!input_pinnable_as_it_lies(&[4096, 1], &[4096, 1], 4));
    }

    #[test]
    fn packed_layouts_are_row_major_and_dense() {
        assert!(is_packed(&[2, 3], &[3, 1]));
        assert!(is_packed(&[2, 1, 3], &[3, 7, 1]));
        assert!(!is_packed(&[2, 3], &[4, 1]));
        assert!(!is_packed(&[3, 2], &[1, 3]));
    }

    #[test]
    fn placement_ignores_the_strides_of_size_one_dimensions() {
        assert!(same_placement(&[1, 4, 3], &[12, 3, 1], &[3, 3, 1]));
        assert!(!same_placement(&[2, 3], &[4, 1], &[3, 1]));
    }
}
