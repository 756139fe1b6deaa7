//! One tensor's value: ready, queued on the Strict stream, deferred in the
//! pending trace, or failed, and the waiting for it. The stream, the pending
//! trace and the context all hold values; this module knows none of them.

use std::fmt::Display;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use runtime::Buffer;
use trace_ir::{Error, Meta, NodeId, Result};

/// Where a value is.
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

pub(crate) struct Value {
    pub meta: Meta,
    pub cell: Mutex<Cell>,
    ready: Condvar,
    /// Threads waiting on `ready`, changed only under `cell`'s lock: most
    /// values are never waited for, and a notification without waiters
    /// still costs a system call (one per op on the Strict stream).
    waiters: AtomicU32,
    /// The fork generation this value was made in ([`runtime::fork`]): a
    /// value queued before a fork waits for a stream thread that the child
    /// does not have.
    generation: u64,
}

impl Value {
    pub fn new(meta: Meta, cell: Cell) -> Arc<Value> {
        Arc::new(Value {
            meta,
            cell: Mutex::new(cell),
            ready: Condvar::new(),
            waiters: AtomicU32::new(0),
            generation: runtime::fork::generation(),
        })
    }

    /// Stores the outcome of the computation and wakes readers; `op` names
    /// what computed the value (`the exp op`, `a DeferAndFuse flush`).
    pub fn resolve(&self, result: Result<Arc<Buffer>>, op: &dyn Display) {
        let mut cell = self.cell.lock().unwrap();
        *cell = match result {
            Ok(b) => Cell::Ready(b),
            Err(error) => Cell::Failed { error, op: op.to_string() },
        };
        if self.waiters.load(Ordering::Relaxed) > 0 {
            self.ready.notify_all();
        }
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
                Cell::Queued if runtime::fork::generation() != self.generation => {
                    return Err(forked_error())
                }
                Cell::Queued => {
                    self.waiters.fetch_add(1, Ordering::Relaxed);
                    cell = self.ready.wait(cell).unwrap();
                    self.waiters.fetch_sub(1, Ordering::Relaxed);
                }
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

/// What computed a DeferAndFuse value, in the errors of values that need it.
pub(crate) const FLUSH: &str = "a DeferAndFuse flush";

/// Binds the buffers a program computed to the values that wait for them,
/// in order, or its error to all of them; `op` names what computed them.
pub(crate) fn resolve_all(
    values: &[Arc<Value>],
    result: Result<Vec<Arc<Buffer>>>,
    op: &dyn Display,
) -> Result<()> {
    match result {
        Ok(buffers) => {
            for (value, buffer) in values.iter().zip(buffers) {
                value.resolve(Ok(buffer), op);
            }
            Ok(())
        }
        Err(e) => {
            values.iter().for_each(|v| v.resolve(Err(e.clone()), op));
            Err(e)
        }
    }
}

/// The error of a Strict stream, or a value queued on it, used in a forked
/// child.
pub(crate) fn forked_error() -> Error {
    Error::backend(
        "stream",
        "this Strict context was created before the process forked, and its stream thread \
         does not exist in the child; create a new context in the child (the PyTorch binding \
         does this by itself), or use the `spawn` start method",
    )
}
