//! The bounds checks' API: [`Tensor::check_index`] and
//! [`Context::check_indices`] record a check of an indexing op's indices,
//! which [`crate::checks`] holds until a read raises it.

use std::sync::Arc;

use trace_ir::{DType, Error, Result};

use crate::checks::{read_i64, BoundsMessage, Check, Part};
use crate::config::Mode;
use crate::context::Context;
use crate::tensor::Tensor;

/// One index tensor of a check, with the size and the number of the
/// dimension it indexes (the number is only used in the message).
#[derive(Debug, Clone, Copy)]
pub struct IndexBound<'a> {
    pub index: &'a Tensor,
    pub size: usize,
    pub dim: usize,
}

impl Tensor {
    /// Checks that every element of this integer index is in range for a
    /// dimension of `size` (the `dim`-th, as the message names it), as the
    /// PyTorch op `op` would. Debug checks now and fails here; Strict and
    /// DeferAndFuse fail at the next read of any value of this context, or
    /// at `sync`, without reading anything back for the check alone. The
    /// error names `op` and the caller's file and line.
    #[track_caller]
    pub fn check_index(
        &self,
        size: usize,
        op: &str,
        dim: usize,
        message: BoundsMessage,
    ) -> Result<()> {
        let site = std::panic::Location::caller();
        self.context().check_indices(
            &[IndexBound { index: self, size, dim }],
            op,
            message,
            &format!("{}:{}", site.file(), site.line()),
        )
    }
}

impl Context {
    /// [`Tensor::check_index`] for index tensors of one shape read together,
    /// element by element (advanced indexing), with the call site given:
    /// `site` is what the error prints after "at" (a binding passes its
    /// caller's `file:line`).
    pub fn check_indices(
        &self,
        indices: &[IndexBound<'_>],
        op: &str,
        message: BoundsMessage,
        site: &str,
    ) -> Result<()> {
        let Some(first) = indices.first() else { return Ok(()) };
        let numel = first.index.numel();
        for b in indices {
            if !b.index.dtype().is_int() {
                return Err(Error::dtype(op, "indices must be integers", &[b.index.dtype()]));
            }
            if b.index.shape() != first.index.shape() {
                return Err(Error::shape(
                    op,
                    "index tensors checked together must have one shape",
                    &[&first.index.meta().shape, &b.index.meta().shape],
                ));
            }
            if !Arc::ptr_eq(&b.index.ctx, &self.shared) {
                return Err(Error::attr(op, "index belongs to another context"));
            }
        }
        if numel == 0 {
            return Ok(());
        }
        let positions = self.arange(0.0, numel as f64, 1.0, DType::I64)?;
        let mut parts = Vec::with_capacity(indices.len());
        for b in indices {
            let index = b.index.reshape(&[numel])?.to_dtype(DType::I64)?;
            let n = b.size as i64;
            let low = if message.allows_negative() { -n } else { 0 };
            let bad = index.lt(low)?.logical_or(index.ge(n)?)?;
            // One reduction: the first offending position, numel when none is.
            let first = bad.where_cond(&positions, numel as i64)?.min(&[0], true)?;
            parts.push(Part { first: first.value, index: index.value, size: b.size, dim: b.dim });
        }
        let check = Check { parts, numel, op: op.into(), message, site: site.into() };
        if self.mode() == Mode::Debug {
            return check.verdict(|v| read_i64(&*self.shared.backend, v));
        }
        self.shared.checks.push(check);
        Ok(())
    }
}
