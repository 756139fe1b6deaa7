//! Shapes, broadcasting and strides.

use smallvec::SmallVec;

use crate::{Error, Result};

/// A tensor shape: row-major, outermost dimension first. Most tensors have few
/// dimensions, so they live inline.
pub type Shape = SmallVec<[usize; 6]>;

/// Builds a [`Shape`] from a slice.
pub fn shape(dims: &[usize]) -> Shape {
    Shape::from_slice(dims)
}

/// Number of elements of a shape (1 for a scalar); saturates instead of
/// overflowing, and [`checked_numel`] rejects such shapes where they enter.
pub fn numel(dims: &[usize]) -> usize {
    dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
}

/// The largest element count a tensor may have: every byte offset of an
/// 8-byte element must fit in an `isize`.
pub const MAX_NUMEL: usize = (isize::MAX as usize) / 8;

/// Number of elements, or `None` when the shape is too large to allocate.
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).filter(|&n| n <= MAX_NUMEL)
}

/// Row-major strides, in elements.
pub fn contiguous_strides(dims: &[usize]) -> SmallVec<[usize; 6]> {
    let mut strides: SmallVec<[usize; 6]> = SmallVec::from_elem(1, dims.len());
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

/// NumPy/PyTorch broadcasting of two shapes: dimensions are aligned on the
/// right and each pair must be equal or contain a 1.
pub fn broadcast_shapes(op: &str, a: &[usize], b: &[usize]) -> Result<Shape> {
    if a == b {
        // Most binary ops meet operands of one shape: no per-dimension walk.
        return Ok(Shape::from_slice(a));
    }
    let rank = a.len().max(b.len());
    let mut out = Shape::from_elem(1, rank);
    for i in 0..rank {
        let da = if i < rank - a.len() { 1 } else { a[i - (rank - a.len())] };
        let db = if i < rank - b.len() { 1 } else { b[i - (rank - b.len())] };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::shape(
                    op,
                    format!("cannot broadcast dimension {i} ({da} vs {db})"),
                    &[&shape(a), &shape(b)],
                ))
            }
        };
    }
    Ok(out)
}

/// Strides (in elements) for reading a tensor of shape `from` as if it had the
/// broadcast shape `to`: broadcast dimensions get stride 0.
pub fn broadcast_strides(from: &[usize], to: &[usize]) -> SmallVec<[usize; 6]> {
    let own = contiguous_strides(from);
    let offset = to.len() - from.len();
    (0..to.len())
        .map(|i| if i < offset || from[i - offset] == 1 { 0 } else { own[i - offset] })
        .collect()
}

/// Turns a possibly negative axis into an index below `rank`.
pub fn normalize_axis(op: &str, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) || (rank == 0 && a != 0) {
        return Err(Error::attr(
            op,
            format!("axis {axis} is out of range for a tensor of rank {rank}"),
        ));
    }
    Ok(a as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes("t", &[3, 1, 5], &[4, 1]).unwrap().as_slice(), &[3, 4, 5]);
        assert_eq!(broadcast_shapes("t", &[], &[2]).unwrap().as_slice(), &[2]);
        let err = broadcast_shapes("add", &[3], &[4]).unwrap_err().to_string();
        assert!(err.contains("add") && err.contains("[3]") && err.contains("[4]"), "{err}");
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]).as_slice(), &[0, 1, 0]);
        assert_eq!(contiguous_strides(&[2, 3, 4]).as_slice(), &[12, 4, 1]);
    }
}
