//! Op groups: in Strict, the primitives of one user-level op (a layer norm,
//! a softmax, one aten op of the PyTorch binding) are recorded into a small
//! pending trace of their own and run on the stream as one program, so the
//! op costs one fused kernel, as in PyTorch, not one per primitive. A group
//! of one primitive (most aten ops) builds no trace: it runs as one op.
//!
//! A group is open on one thread for one context between `begin` and `end`;
//! nested groups join the outermost. Reading a value of an open group (a
//! composite that needs a count on the host) cuts the group there.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

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
    /// Apart from every other group's and trace's, so a value of this group
    /// is never taken for a node of another.
    epoch: u64,
    body: Body,
}

/// What an open group recorded. Most user-level ops are one primitive on
/// values from outside (an aten `mul`): such a group never builds a trace,
/// and runs as a one-op job. A second primitive moves both into a trace.
enum Body {
    Empty,
    Single { op: Op, inputs: Vec<Arc<Value>>, value: Weak<Value> },
    Trace(Box<PendingTrace<Arc<Value>>>),
}

/// A group's work, ready to run: the primitives of `name`.
pub(crate) enum Ready {
    Single { name: String, op: Op, inputs: Vec<Arc<Value>>, output: Arc<Value> },
    Program { name: String, plan: FlushPlan<Arc<Value>> },
}

/// Groups watch for repeats, as DeferAndFuse does: a composite that is a
/// loop written out (a QR's reflectors, an SVD's sweeps) is cut into
/// programs that repeat, and so hit the cache, instead of one program too
/// large to plan quickly.
fn new_trace(epoch: u64) -> PendingTrace<Arc<Value>> {
    let mut trace = PendingTrace::new(epoch, false);
    // `PendingTrace::take` restarted the spare detector.
    trace.repeats = Some(SPARE.take().unwrap_or_default());
    trace
}

impl Open {
    /// What the group recorded that someone still holds.
    fn into_ready(self) -> Option<Ready> {
        let name = self.name;
        match self.body {
            Body::Empty => None,
            Body::Single { op, inputs, value } => {
                let output = value.upgrade()?;
                Some(Ready::Single { name, op, inputs, output })
            }
            Body::Trace(mut trace) => {
                let plan = trace.take();
                SPARE.set(trace.repeats.take());
                plan.map(|plan| Ready::Program { name, plan })
            }
        }
    }

    /// The group's body as a trace, moving a single primitive into one
    /// (or dropping it, when nobody holds its value). On an error the body
    /// stays as it was.
    fn trace(&mut self) -> Result<&mut PendingTrace<Arc<Value>>> {
        if !matches!(self.body, Body::Trace(_)) {
            let mut trace = new_trace(self.epoch);
            if let Body::Single { op, inputs, value } = &self.body {
                if let Some(v) = value.upgrade() {
                    let nodes =
                        inputs.iter().map(|i| trace.node_of(i)).collect::<Result<Vec<_>>>()?;
                    if let Some(r) = trace.repeats.as_mut() {
                        r.push(crate::repeats::op_hash(op, &v.meta));
                    }
                    let node = trace.push(op.clone(), &nodes, v.meta.clone())?;
                    *v.cell.lock().unwrap() = Cell::Deferred { node, epoch: self.epoch };
                    trace.set_owner(node, value.clone());
                }
            }
            self.body = Body::Trace(Box::new(trace));
        }
        match &mut self.body {
            Body::Trace(trace) => Ok(trace),
            _ => unreachable!("the body was just made a trace"),
        }
    }
}

/// Opens a group for `owner` on this thread, or joins the one open.
pub(crate) fn begin(owner: usize, name: &str) {
    OPEN.with_borrow_mut(|open| match open.iter_mut().find(|g| g.owner == owner) {
        Some(g) => g.depth += 1,
        None => open.push(Open {
            owner,
            name: name.into(),
            depth: 1,
            epoch: EPOCHS.fetch_add(1, Ordering::Relaxed),
            body: Body::Empty,
        }),
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
        open.swap_remove(at).into_ready()
    })
}

/// What `owner`'s open group recorded so far, leaving the group open and
/// empty, in a new epoch (the values it gave out keep theirs): for a read
/// inside the group.
pub(crate) fn cut(owner: usize) -> Option<Ready> {
    OPEN.with_borrow_mut(|open| {
        let g = open.iter_mut().find(|g| g.owner == owner)?;
        let empty = Open {
            owner,
            name: g.name.clone(),
            depth: g.depth,
            epoch: EPOCHS.fetch_add(1, Ordering::Relaxed),
            body: Body::Empty,
        };
        std::mem::replace(g, empty).into_ready()
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
        if matches!(g.body, Body::Empty) && outside(inputs)? {
            // Its node is numbered if a second primitive moves it into a trace.
            let value = Value::new(meta, Cell::Deferred { node: usize::MAX, epoch: g.epoch });
            let inputs = inputs.iter().map(|v| Arc::clone(v)).collect();
            g.body = Body::Single { op, inputs, value: Arc::downgrade(&value) };
            return Ok((value, false));
        }
        let epoch = g.epoch;
        let trace = g.trace()?;
        let nodes = inputs.iter().map(|v| trace.node_of(v)).collect::<Result<Vec<_>>>()?;
        let hash = crate::repeats::op_hash(&op, &meta);
        let repeated = trace.repeats.as_mut().is_some_and(|r| r.push(hash));
        let node = trace.push(op, &nodes, meta.clone())?;
        let value = Value::new(meta, Cell::Deferred { node, epoch });
        trace.set_owner(node, Arc::downgrade(&value));
        Ok((value, repeated || trace.len() >= limit))
    })
}

/// Whether `inputs` can be read by a single primitive as they are: none
/// is deferred (a group's own values are; one deferred in another trace is
/// an error that [`PendingTrace::node_of`] raises). A failed one fails the
/// op here, as `node_of` would.
fn outside(inputs: &[&Arc<Value>]) -> Result<bool> {
    for v in inputs {
        match &*v.cell.lock().unwrap() {
            Cell::Deferred { .. } => return Ok(false),
            Cell::Failed { error, op } => {
                return Err(Error::poisoned_by(op.as_str(), error.clone()))
            }
            _ => {}
        }
    }
    Ok(true)
}

/// Whether `owner` has a group open on this thread (cheap when none is).
pub(crate) fn is_open(owner: usize) -> bool {
    OPEN.with_borrow(|open| open.iter().any(|g| g.owner == owner))
}
