//! Op groups: in Strict, the primitives of one user-level op (a layer norm,
//! a softmax, one aten op of the PyTorch binding) are recorded into a small
//! pending trace of their own and run on the stream as one program, so the
//! op costs one fused kernel, as in PyTorch, not one per primitive.
//!
//! A group is open on one thread for one context between `begin` and `end`;
//! nested groups join the outermost. Reading a value of an open group (a
//! composite that needs a count on the host) cuts the group there.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use trace_ir::{Error, Meta, Op, Result};

use crate::pending::{FlushPlan, PendingTrace};
use crate::repeats::RepeatDetector;
use crate::value::{Cell, Value};

/// The epochs of group traces: apart from each other, so a value of one
/// group is never taken for a node of another.
static EPOCHS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static OPEN: RefCell<Vec<Open>> = const { RefCell::new(Vec::new()) };
    /// The repeat detector of the last group that ended, kept for the next:
    /// its history is a few KB, and Strict opens a group for every op.
    static SPARE: RefCell<Option<RepeatDetector>> = const { RefCell::new(None) };
}

struct Open {
    /// The context's engine state, by address.
    owner: usize,
    /// The user-level op, for the errors of values it computes.
    name: String,
    depth: u32,
    trace: PendingTrace<Arc<Value>>,
}

/// A group's trace, ready to run: the primitives of `name`.
pub(crate) struct Ready {
    pub name: String,
    pub plan: FlushPlan<Arc<Value>>,
}

/// Groups watch for repeats, as DeferAndFuse does: a composite that is a
/// loop written out (a QR's reflectors, an SVD's sweeps) is cut into
/// programs that repeat, and so hit the cache, instead of one program too
/// large to plan quickly.
fn new_trace() -> PendingTrace<Arc<Value>> {
    let mut trace = PendingTrace::new(EPOCHS.fetch_add(1, Ordering::Relaxed), false);
    // `PendingTrace::take` restarted the spare detector.
    trace.repeats = Some(SPARE.take().unwrap_or_default());
    trace
}

/// Takes what `trace` recorded, keeping its repeat detector for the next
/// group of this thread.
fn take(mut trace: PendingTrace<Arc<Value>>) -> Option<FlushPlan<Arc<Value>>> {
    let plan = trace.take();
    SPARE.set(trace.repeats.take());
    plan
}

/// Opens a group for `owner` on this thread, or joins the one open.
pub(crate) fn begin(owner: usize, name: &str) {
    OPEN.with_borrow_mut(|open| match open.iter_mut().find(|g| g.owner == owner) {
        Some(g) => g.depth += 1,
        None => open.push(Open { owner, name: name.into(), depth: 1, trace: new_trace() }),
    })
}

/// Closes one level of `owner`'s group; at the outermost, what it recorded
/// that someone still holds (nothing when none was, or no group was open).
pub(crate) fn end(owner: usize) -> Option<Ready> {
    OPEN.with_borrow_mut(|open| {
        let at = open.iter().position(|g| g.owner == owner)?;
        open[at].depth -= 1;
        if open[at].depth > 0 {
            return None;
        }
        let g = open.swap_remove(at);
        take(g.trace).map(|plan| Ready { name: g.name, plan })
    })
}

/// What `owner`'s open group recorded so far, leaving the group open with an
/// empty trace: for a read inside the group.
pub(crate) fn cut(owner: usize) -> Option<Ready> {
    OPEN.with_borrow_mut(|open| {
        let g = open.iter_mut().find(|g| g.owner == owner)?;
        let trace = std::mem::replace(&mut g.trace, new_trace());
        take(trace).map(|plan| Ready { name: g.name.clone(), plan })
    })
}

/// Records `op` into `owner`'s open group ([`is_open`] says there is one).
/// Also says whether to cut the group after it: the ops started to repeat,
/// or the group holds `limit` nodes.
pub(crate) fn record(
    owner: usize,
    op: Op,
    inputs: &[&Arc<Value>],
    meta: Meta,
    limit: usize,
) -> Result<(Arc<Value>, bool)> {
    OPEN.with_borrow_mut(|open| {
        let g = open
            .iter_mut()
            .find(|g| g.owner == owner)
            .ok_or_else(|| Error::internal("engine", "no op group is open"))?;
        let nodes = inputs.iter().map(|v| g.trace.node_of(v)).collect::<Result<Vec<_>>>()?;
        let hash = crate::repeats::op_hash(&op, &meta);
        let repeated = g.trace.repeats.as_mut().is_some_and(|r| r.push(hash));
        let node = g.trace.push(op, &nodes, meta.clone())?;
        let value = Value::new(meta, Cell::Deferred { node, epoch: g.trace.epoch });
        g.trace.set_owner(node, Arc::downgrade(&value));
        Ok((value, repeated || g.trace.len() >= limit))
    })
}

/// Whether `owner` has a group open on this thread (cheap when none is).
pub(crate) fn is_open(owner: usize) -> bool {
    OPEN.with_borrow(|open| open.iter().any(|g| g.owner == owner))
}
