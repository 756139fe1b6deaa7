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

use trace_ir::{Error, IndexErrorClass, IndexOutOfBounds, Result};

use runtime::Backend;

use crate::config::Mode;
use crate::element::Element;
use crate::value::{Cell, Value};

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
    /// `RuntimeError: ZeroDivisionError`: integer division by a tensor
    /// holding a zero. The checked index is the divisor's zero flag (1 for
    /// a zero) against a size of 1, so only `0` is valid.
    ZeroDivision,
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
            GatherOutOfBounds | IndicesOutOfData | EmbeddingBag | EmbeddingBagIdx
            | ZeroDivision => IndexErrorClass::RuntimeError,
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
            ZeroDivision => "ZeroDivisionError".into(),
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
            "zero_division" => ZeroDivision,
            _ => return None,
        })
    }
}

/// One index tensor of a check not read yet: `first` holds the first flat
/// position of an index out of range (`numel` when none is). The index
/// itself is kept to read the offending value, which only a failed check
/// does.
pub(crate) struct Part {
    pub first: Arc<Value>,
    pub index: Arc<Value>,
    pub size: usize,
    pub dim: usize,
}

pub(crate) struct Check {
    pub parts: Vec<Part>,
    pub numel: usize,
    pub op: String,
    pub message: BoundsMessage,
    pub site: String,
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
    pub fn push(&self, check: Check) {
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
                        .all(|p| !matches!(*p.first.cell.lock().unwrap(), Cell::Deferred { .. }))
            });
        *checks = waiting;
        self.any.store(!checks.is_empty(), Ordering::Release);
        settled
    }

    /// Fails with the first outstanding check that found an index out of
    /// range, reading the flags from `backend`; every check read here is
    /// dropped, failed or not, so the error is raised once. Called after
    /// every read of a value and by `sync`.
    pub(crate) fn raise_failed(&self, mode: Mode, backend: &dyn Backend) -> Result<()> {
        let settled = self.take_settled(mode);
        let mut first = Ok(());
        for check in settled {
            let verdict = check.verdict(|v| read_i64(backend, v));
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
    pub fn verdict(&self, read: impl Fn(&Value) -> Result<Vec<i64>>) -> Result<()> {
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

/// The elements of a computed integer value, as `i64`.
pub(crate) fn read_i64(backend: &dyn Backend, value: &Value) -> Result<Vec<i64>> {
    let buffer = value.wait_buffer()?;
    Ok(i64::from_host(backend.download(&buffer)?))
}
