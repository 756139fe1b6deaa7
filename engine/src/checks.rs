//! Bounds checks of indexing ops, computed with the op and read later, as
//! CUDA's device-side asserts are.
//!
//! The engine computes lookups as masked sums, which give 0 for an index out
//! of range instead of failing. Checking an index on the host would need its
//! value, and so a flush or a wait, at every indexing op. Instead the check is
//! a few more ops on the index (its first offending position, one
//! reduction), a tiny tensor the context holds. In DeferAndFuse a held tensor is an output
//! of the pending trace, so the check runs in the flush that the next read
//! does anyway; in Strict it is queued on the stream like any op. Every read
//! of a value (and `sync`) then looks at the checks whose value is there and
//! fails with the first one that found a bad index. Debug evaluates the check
//! at once and fails the op itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use trace_ir::{DType, Error, IndexErrorClass, IndexOutOfBounds, Result};

use crate::config::Mode;
use crate::context::{Context, Shared};
use crate::element::Element;
use crate::tensor::{Cell, Tensor};

/// Which of PyTorch's errors an out-of-range index raises, and so which
/// indices are valid: PyTorch's kernels disagree on both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoundsMessage {
    /// `IndexError: index 7 is out of bounds for dimension 0 with size 5`;
    /// `-size..size` is valid (advanced indexing, `index_put_`, `index_fill`).
    OutOfBounds,
    /// The same words as a `RuntimeError`; `0..size` is valid (`gather`, the
    /// `scatter` family, `index_add` where it runs as `scatter_add`).
    GatherOutOfBounds,
    /// `IndexError: index_copy_(): index 5 is out of bounds for dimension 0
    /// with size 5`; `0..size` is valid.
    IndexCopy,
    /// `IndexError: index out of range in self`; `0..size` is valid
    /// (`index_select`, `embedding`, `index_add`, `index_reduce`).
    OutOfRangeInSelf,
    /// `RuntimeError: INDICES element is out of DATA bounds, id=5
    /// axis_dim=5`; `0..size` is valid (`index_select` along dimension 1).
    IndicesOutOfData,
    /// `IndexError: out of range: tried to access index 7 on a tensor of 5
    /// elements.`; `-size..size` is valid (`take`, `put_`).
    Take,
    /// `RuntimeError: Index 0 of input takes value 6 which is not in the
    /// valid range [0, 5)`; `0..size` is valid (`embedding_bag` summing or
    /// averaging without a padding index).
    EmbeddingBag,
    /// `RuntimeError: embedding_bag: Expected idx >= 0 && idx < num_embeddings
    /// but found idx to be 6`; `0..size` is valid (`embedding_bag`'s other
    /// paths: max, or a padding index).
    EmbeddingBagIdx,
    /// `IndexError: Target 7 is out of bounds.`; `0..size` is valid (the
    /// targets of `nll_loss`).
    Target,
}

impl BoundsMessage {
    /// Whether PyTorch counts negative indices from the end here.
    pub fn allows_negative(self) -> bool {
        matches!(self, BoundsMessage::OutOfBounds | BoundsMessage::Take)
    }

    pub fn class(self) -> IndexErrorClass {
        use BoundsMessage::*;
        match self {
            OutOfBounds | IndexCopy | OutOfRangeInSelf | Take | Target => {
                IndexErrorClass::IndexError
            }
            GatherOutOfBounds | IndicesOutOfData | EmbeddingBag | EmbeddingBagIdx => {
                IndexErrorClass::RuntimeError
            }
        }
    }

    /// PyTorch's message for `value`, found at flat `position` of the index,
    /// for dimension `dim` of size `size`.
    pub fn message(self, value: i64, position: usize, dim: usize, size: usize) -> String {
        use BoundsMessage::*;
        match self {
            OutOfBounds | GatherOutOfBounds => {
                format!("index {value} is out of bounds for dimension {dim} with size {size}")
            }
            IndexCopy => format!(
                "index_copy_(): index {value} is out of bounds for dimension {dim} with size {size}"
            ),
            OutOfRangeInSelf => "index out of range in self".into(),
            IndicesOutOfData => {
                format!("INDICES element is out of DATA bounds, id={value} axis_dim={size}")
            }
            Take => {
                format!("out of range: tried to access index {value} on a tensor of {size} elements.")
            }
            EmbeddingBag => format!(
                "Index {position} of input takes value {value} which is not in the valid range [0, {size})"
            ),
            EmbeddingBagIdx => format!(
                "embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {value}"
            ),
            Target => format!("Target {value} is out of bounds."),
        }
    }

    /// The family named as the binding passes it (the variant in snake case).
    pub fn from_name(name: &str) -> Option<BoundsMessage> {
        use BoundsMessage::*;
        Some(match name {
            "out_of_bounds" => OutOfBounds,
            "gather_out_of_bounds" => GatherOutOfBounds,
            "index_copy" => IndexCopy,
            "out_of_range_in_self" => OutOfRangeInSelf,
            "indices_out_of_data" => IndicesOutOfData,
            "take" => Take,
            "embedding_bag" => EmbeddingBag,
            "embedding_bag_idx" => EmbeddingBagIdx,
            "target" => Target,
            _ => return None,
        })
    }
}

/// One index tensor of a check, with the size and the number of the
/// dimension it indexes (the number is only used in the message).
#[derive(Debug, Clone, Copy)]
pub struct IndexBound<'a> {
    pub index: &'a Tensor,
    pub size: usize,
    pub dim: usize,
}

/// One index tensor of a check not read yet: `first` holds the first flat
/// position of an index out of range (`numel` when none is). The index
/// itself is kept to read the offending value, which only a failed check
/// does.
struct Part {
    first: Tensor,
    index: Tensor,
    size: usize,
    dim: usize,
}

struct Check {
    parts: Vec<Part>,
    numel: usize,
    op: String,
    message: BoundsMessage,
    site: String,
}

/// The checks of one context that nobody has read yet.
#[derive(Default)]
pub(crate) struct Outstanding {
    checks: Mutex<Vec<Check>>,
    /// False when `checks` is empty, so a read without checks outstanding
    /// takes no lock.
    any: AtomicBool,
}

impl Outstanding {
    fn push(&self, check: Check) {
        let mut checks = self.checks.lock().unwrap();
        checks.push(check);
        self.any.store(true, Ordering::Release);
    }

    /// Takes the checks whose flag can be read without running anything
    /// more: all of them in Strict (waiting for the stream is what a read
    /// does), those already computed in DeferAndFuse (a flush only for the
    /// checks would split the trace the next read runs anyway).
    fn take_settled(&self, mode: Mode) -> Vec<Check> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut checks = self.checks.lock().unwrap();
        let (settled, waiting): (Vec<Check>, Vec<Check>) =
            std::mem::take(&mut *checks).into_iter().partition(|c| {
                mode != Mode::DeferAndFuse
                    || c.parts
                        .iter()
                        .all(|p| !matches!(*p.first.0.cell.lock().unwrap(), Cell::Deferred { .. }))
            });
        *checks = waiting;
        self.any.store(!checks.is_empty(), Ordering::Release);
        settled
    }
}

impl Shared {
    /// Fails with the first outstanding check that found an index out of
    /// range; every check read here is dropped, failed or not, so the error
    /// is raised once. Called after every read of a value and by `sync`.
    pub(crate) fn raise_failed_checks(&self) -> Result<()> {
        let settled = self.checks.take_settled(self.config.mode);
        let mut first = Ok(());
        for check in settled {
            let verdict = check.verdict(|t| {
                let buffer = t.0.wait_buffer()?;
                Ok(i64::from_host(self.backend.download(&buffer)?))
            });
            if first.is_ok() {
                first = verdict;
            }
        }
        first
    }
}

impl Check {
    /// The error this check found, if any, reading its tensors with `read`.
    /// Of several index tensors read together (advanced indexing), PyTorch
    /// names the first element that is out of range in any of them, and of
    /// those the first tensor.
    fn verdict(&self, read: impl Fn(&Tensor) -> Result<Vec<i64>>) -> Result<()> {
        let mut worst: Option<(usize, &Part)> = None;
        for part in &self.parts {
            // A flag that failed to compute belongs to a flush or a stream
            // job that failed; that error reaches the user through the
            // value they read.
            let first = match read(&part.first) {
                Ok(first) => first,
                Err(Error::Poisoned { .. }) => return Ok(()),
                Err(e) => return Err(e),
            };
            let at = first.first().map_or(self.numel, |&p| p as usize);
            if at < self.numel && worst.is_none_or(|(w, _)| at < w) {
                worst = Some((at, part));
            }
        }
        let Some((at, part)) = worst else { return Ok(()) };
        let value = read(&part.index)?.get(at).copied().unwrap_or_default();
        Err(Error::IndexOutOfBounds(Box::new(IndexOutOfBounds {
            op: self.op.clone(),
            message: self.message.message(value, at, part.dim, part.size),
            class: self.message.class(),
            site: self.site.clone(),
        })))
    }
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
            if !Arc::ptr_eq(&b.index.0.ctx, &self.shared) {
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
            parts.push(Part { first, index, size: b.size, dim: b.dim });
        }
        let check = Check { parts, numel, op: op.into(), message, site: site.into() };
        if self.mode() == Mode::Debug {
            return check.verdict(|t| t.to_vec::<i64>());
        }
        self.shared.checks.push(check);
        Ok(())
    }
}
