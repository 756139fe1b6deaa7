//! `Tensor`: a cheap, `Send + Sync` handle to a value that is ready, queued on
//! the Strict stream, or deferred in the pending trace.

use std::sync::{Arc, Condvar, Mutex};

use runtime::{Buffer, HostData};
use trace_ir::{DType, Error, Meta, NodeId, Result};

use crate::context::{Context, Shared};
use crate::element::Element;

/// Where a tensor's value is.
pub(crate) enum Cell {
    /// A node of the pending trace of the given epoch (DeferAndFuse).
    Deferred {
        node: NodeId,
        epoch: u64,
    },
    /// Submitted to the Strict stream, not run yet.
    Queued,
    Ready(Arc<Buffer>),
    /// The computation failed with `error`; `op` names what computed it, for
    /// the errors of values that depend on it.
    Failed {
        error: Error,
        op: String,
    },
}

pub(crate) struct TensorInner {
    pub ctx: Arc<Shared>,
    pub meta: Meta,
    pub cell: Mutex<Cell>,
    ready: Condvar,
}

impl TensorInner {
    pub fn new(ctx: Arc<Shared>, meta: Meta, cell: Cell) -> Arc<TensorInner> {
        Arc::new(TensorInner { ctx, meta, cell: Mutex::new(cell), ready: Condvar::new() })
    }

    /// Stores the outcome of the computation and wakes readers; `op` names
    /// what computed the value (`the exp op`, `a DeferAndFuse flush`).
    pub fn resolve(&self, result: Result<Arc<Buffer>>, op: &str) {
        let mut cell = self.cell.lock().unwrap();
        *cell = match result {
            Ok(b) => Cell::Ready(b),
            Err(error) => Cell::Failed { error, op: op.to_string() },
        };
        self.ready.notify_all();
    }

    /// The value for an op that reads it: a failure becomes the op's own
    /// failure, naming the op that failed first ([`Error::poisoned_by`]).
    pub fn wait_input(&self) -> Result<Arc<Buffer>> {
        self.wait_buffer().map_err(|e| match &*self.cell.lock().unwrap() {
            Cell::Failed { op, .. } => Error::poisoned_by(op.as_str(), e),
            _ => e,
        })
    }

    /// Blocks while the value is queued on the stream; for deferred values the
    /// caller flushes first. A failed value gives its own error: the one its
    /// op failed with, or, when an input failed, the first failure's.
    pub fn wait_buffer(&self) -> Result<Arc<Buffer>> {
        let mut cell = self.cell.lock().unwrap();
        loop {
            match &*cell {
                Cell::Ready(b) => return Ok(b.clone()),
                Cell::Failed { error, .. } => return Err(error.clone()),
                // Queued on the stream of a parent process: waiting would hang.
                Cell::Queued if self.ctx.stream.as_ref().is_some_and(|s| s.forked()) => {
                    return Err(crate::stream::forked_error())
                }
                Cell::Queued => cell = self.ready.wait(cell).unwrap(),
                Cell::Deferred { .. } => {
                    return Err(Error::internal(
                        "engine",
                        "a deferred value was read before its flush",
                    ))
                }
            }
        }
    }
}

/// A tensor of deferfuse. Cloning it is cheap (a reference count); it can be
/// sent to and shared between threads.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorInner>);

impl Tensor {
    pub fn shape(&self) -> &[usize] {
        &self.0.meta.shape
    }

    pub fn dtype(&self) -> DType {
        self.0.meta.dtype
    }

    pub fn rank(&self) -> usize {
        self.0.meta.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.0.meta.numel()
    }

    pub fn meta(&self) -> &Meta {
        &self.0.meta
    }

    /// The context this tensor belongs to.
    pub fn context(&self) -> Context {
        Context { shared: self.0.ctx.clone() }
    }

    /// Materializes the value (flushing or waiting as the mode requires) and
    /// copies it to the host. Fails instead when an indexing op of this
    /// context found an index out of range since the last read (see
    /// [`Tensor::check_index`]), whether or not this value depends on it.
    pub fn host_data(&self) -> Result<HostData> {
        let buffer = self.0.ctx.materialize(&self.0)?;
        let data = self.0.ctx.backend.download(&buffer)?;
        self.0.ctx.raise_failed_checks()?;
        Ok(data)
    }

    /// The elements in row-major order, converted to `T` as a cast would.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(T::from_host(self.host_data()?))
    }

    /// The single element of a one-element tensor.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "item",
                "needs a tensor with exactly one element",
                &[&self.0.meta.shape],
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// True when both handles refer to the same value.
    pub fn same_as(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor(shape={:?}, dtype={})", self.shape(), self.dtype())
    }
}
