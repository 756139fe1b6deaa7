//! A pending trace: ops recorded but not run yet, the inputs they read, and
//! a weak handle to the value of each node, so a flush knows which values
//! someone still holds. DeferAndFuse records everything since its last
//! flush into one, reading buffers; Strict records the primitives of one
//! user-level op into one (an op group), reading values that may still be
//! queued on its stream.

use std::panic::Location;
use std::sync::{Arc, Weak};

use ahash::AHashMap;
use runtime::Buffer;
use smallvec::SmallVec;
use trace_ir::{Error, Meta, NodeId, Op, Result, Trace};

use crate::dump::FlushReason;
use crate::read_ahead::ReadAhead;
use crate::repeats::RepeatDetector;
use crate::value::{Cell, Value};

/// What a pending trace's parameters hold.
pub(crate) trait Input: Clone {
    /// The parameter an operand in `cell` becomes, if it can be one.
    fn from_cell(value: &Arc<Value>, cell: &Cell) -> Option<Self>;
    /// The same input read twice is one parameter.
    fn key(&self) -> usize;
    fn meta(&self) -> &Meta;
}

/// DeferAndFuse reads computed buffers.
impl Input for Arc<Buffer> {
    fn from_cell(_: &Arc<Value>, cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Ready(buffer) => Some(buffer.clone()),
            _ => None,
        }
    }
    fn key(&self) -> usize {
        Arc::as_ptr(self) as usize
    }
    fn meta(&self) -> &Meta {
        Buffer::meta(self)
    }
}

/// A Strict op group reads values, computed or still queued on the stream,
/// which waits for them.
impl Input for Arc<Value> {
    fn from_cell(value: &Arc<Value>, cell: &Cell) -> Option<Self> {
        matches!(cell, Cell::Ready(_) | Cell::Queued).then(|| value.clone())
    }
    fn key(&self) -> usize {
        Arc::as_ptr(self) as usize
    }
    fn meta(&self) -> &Meta {
        &self.meta
    }
}

/// The parameter node of each input key: a Strict op group reads a few
/// inputs, found by a search in place (a hash map would allocate for every
/// op); a DeferAndFuse trace reads thousands, hashed.
#[derive(Default)]
struct ParamNodes {
    few: SmallVec<[(usize, NodeId); 8]>,
    many: AHashMap<usize, NodeId>,
}

impl ParamNodes {
    fn get(&self, key: usize) -> Option<NodeId> {
        match self.many.is_empty() {
            true => self.few.iter().find(|(k, _)| *k == key).map(|&(_, node)| node),
            false => self.many.get(&key).copied(),
        }
    }

    fn insert(&mut self, key: usize, node: NodeId) {
        if self.many.is_empty() && self.few.len() < self.few.inline_size() {
            self.few.push((key, node));
            return;
        }
        self.many.extend(self.few.drain(..));
        self.many.insert(key, node);
    }
}

pub(crate) struct PendingTrace<I> {
    pub epoch: u64,
    pub trace: Trace,
    /// The input of each parameter, by parameter index.
    pub params: Vec<I>,
    /// Parameter node of each input already read, so a value read twice is
    /// one parameter.
    param_nodes: ParamNodes,
    /// The tensor of each node (none for parameters).
    pub owners: Vec<Weak<Value>>,
    /// Where each op was recorded, kept only while fusion dumps are on.
    call_sites: Vec<(NodeId, &'static Location<'static>)>,
    /// DeferAndFuse watches the ops recorded since the last flush for a
    /// repetition; a new pending trace starts with a fresh detector, so
    /// every flush resets it.
    pub repeats: Option<RepeatDetector>,
    /// DeferAndFuse runs read values ahead of their reads (`read_ahead.rs`);
    /// the points it learned carry over from trace to trace.
    pub read_ahead: Option<ReadAhead>,
}

/// What a flush has to run: the pruned trace, its inputs, and the tensors its
/// outputs belong to.
pub(crate) struct FlushPlan<I> {
    pub trace: Trace,
    pub inputs: Vec<I>,
    pub holders: Vec<Arc<Value>>,
    /// The call site of each node of `trace`, when fusion dumps recorded them.
    pub call_sites: Vec<Option<&'static Location<'static>>>,
}

impl<I: Input> PendingTrace<I> {
    /// An empty trace of `epoch`, with a repeat detector if `watch_repeats`.
    pub fn new(epoch: u64, watch_repeats: bool) -> Self {
        PendingTrace {
            epoch,
            trace: Trace::new(),
            params: Vec::new(),
            param_nodes: ParamNodes::default(),
            owners: Vec::new(),
            call_sites: Vec::new(),
            repeats: watch_repeats.then(RepeatDetector::default),
            read_ahead: None,
        }
    }

    pub fn len(&self) -> usize {
        self.trace.len()
    }

    /// The node that stands for `value` in this trace: its own node, or a
    /// parameter reading it.
    pub fn node_of(&mut self, value: &Arc<Value>) -> Result<NodeId> {
        let cell = value.cell.lock().unwrap();
        let input = match &*cell {
            Cell::Deferred { node, epoch } if *epoch == self.epoch => return Ok(*node),
            Cell::Failed { error, op } => {
                return Err(Error::poisoned_by(op.as_str(), error.clone()))
            }
            cell => I::from_cell(value, cell).ok_or_else(|| {
                Error::internal("engine", "a value of another pending trace used as an input")
            })?,
        };
        drop(cell);
        if let Some(node) = self.param_nodes.get(input.key()) {
            return Ok(node);
        }
        let node = self.trace.push_parameter(input.meta().clone());
        self.param_nodes.insert(input.key(), node);
        self.params.push(input);
        self.owners.push(Weak::new());
        Ok(node)
    }

    /// Appends an op whose inputs are nodes of this trace; `meta` is its
    /// output's, as the caller inferred it.
    pub fn push(&mut self, op: Op, inputs: &[NodeId], meta: Meta) -> Result<NodeId> {
        let node = self.trace.push_inferred(op, inputs, meta)?;
        if let Some(r) = self.read_ahead.as_mut() {
            r.recorded(node);
        }
        Ok(node)
    }

    /// A unit (an op group, or an op outside one) ended with `hash`: why
    /// the trace should be flushed after it, if it should.
    pub fn end_unit(&mut self, hash: u64) -> Option<FlushReason> {
        let ahead = self.read_ahead.as_mut().is_some_and(|r| r.end_unit(hash));
        let repeated = self.repeats.as_mut().is_some_and(|r| r.push(hash));
        match (ahead, repeated) {
            (true, _) => Some(FlushReason::ReadAhead),
            (false, true) => Some(FlushReason::Repeat),
            (false, false) => None,
        }
    }

    /// Remembers where the user recorded `node`, for fusion dumps.
    pub fn set_call_site(&mut self, node: NodeId, site: &'static Location<'static>) {
        self.call_sites.push((node, site));
    }

    pub fn set_owner(&mut self, node: NodeId, owner: Weak<Value>) {
        debug_assert_eq!(node, self.owners.len());
        self.owners.push(owner);
    }

    /// Takes everything recorded so far, leaving an empty trace of the next
    /// epoch. Only nodes whose tensor is still held become outputs; the rest
    /// are pruned or stay internal to the program.
    pub fn take(&mut self) -> Option<FlushPlan<I>> {
        let mut next = PendingTrace::new(self.epoch + 1, false);
        // The detector starts over with the new trace, keeping its buffers.
        next.repeats = self.repeats.take().map(RepeatDetector::restarted);
        next.read_ahead = self.read_ahead.take().map(ReadAhead::restarted);
        let taken = std::mem::replace(self, next);
        let mut trace = taken.trace;
        let mut holders = Vec::new();
        for (node, owner) in taken.owners.iter().enumerate() {
            if let Some(t) = owner.upgrade() {
                trace.outputs.push(node);
                holders.push(t);
            }
        }
        if holders.is_empty() {
            return None;
        }
        let call_sites = pruned_call_sites(&trace, &taken.call_sites);
        let (pruned, old_params) = trace.into_pruned();
        // `taken.params` is dropped on return, so the program holds the only
        // reference the trace had and can free or reuse each input early.
        let inputs = old_params.iter().map(|&i| taken.params[i].clone()).collect();
        Some(FlushPlan { trace: pruned, inputs, holders, call_sites })
    }
}

impl FlushPlan<Arc<Value>> {
    /// Splits off what `needed` (one of the holders) depends on, when that
    /// is not everything: the first plan computes it (and the values the
    /// rest reads from it), the second the rest, reading those values as
    /// parameters. A read then waits only for its own part, and the rest
    /// (a training step's backward and optimizer update, after a read of
    /// the loss) can run while the caller goes on. Not for plans with call
    /// sites (fusion dumps describe one program per flush).
    pub fn split_for(self, needed: &Value) -> (Self, Option<Self>) {
        let trace = &self.trace;
        let at = self.holders.iter().position(|h| std::ptr::eq(Arc::as_ptr(h), needed));
        let Some(root) = at.map(|i| trace.outputs[i]).filter(|_| self.call_sites.is_empty()) else {
            return (self, None);
        };
        let mut part = vec![false; trace.len()];
        part[root] = true;
        for id in (0..=root).rev() {
            if part[id] {
                for &i in &trace.nodes[id].inputs {
                    part[i] = true;
                }
            }
        }
        let computes = |id: usize| !matches!(trace.nodes[id].op, Op::Parameter { .. });
        if (0..trace.len()).all(|id| part[id] || !computes(id)) {
            return (self, None);
        }
        // Nodes of the part that the rest reads: outputs of the first plan,
        // parameters of the second.
        let mut is_bridge = vec![false; trace.len()];
        for (node, _) in trace.nodes.iter().zip(&part).filter(|(_, &p)| !p) {
            for &i in &node.inputs {
                is_bridge[i] |= part[i] && computes(i);
            }
        }
        let bridges: Vec<usize> = (0..trace.len()).filter(|&id| is_bridge[id]).collect();
        let mut holder = vec![None; trace.len()];
        for (i, &o) in trace.outputs.iter().enumerate() {
            holder[o] = Some(i);
        }
        let holder_of = |node: usize| holder[node];
        let bridge_values: Vec<Arc<Value>> = bridges
            .iter()
            .map(|&b| match holder_of(b) {
                Some(i) => self.holders[i].clone(),
                None => Value::new(trace.nodes[b].meta.clone(), Cell::Queued),
            })
            .collect();
        // The first plan: the part's held outputs, then the bridges nobody holds.
        let mut first = trace.clone();
        let mut first_holders = Vec::new();
        first.outputs.clear();
        for (i, &o) in trace.outputs.iter().enumerate().filter(|(_, &o)| part[o]) {
            first.outputs.push(o);
            first_holders.push(self.holders[i].clone());
        }
        for (&b, v) in bridges.iter().zip(&bridge_values).filter(|(&b, _)| holder_of(b).is_none()) {
            first.outputs.push(b);
            first_holders.push(v.clone());
        }
        let (first, params) = first.pruned();
        let first_inputs = params.iter().map(|&p| self.inputs[p].clone()).collect();
        // The second plan: the rest, each bridge a new parameter.
        let n = self.inputs.len();
        let mut second = trace.clone();
        for (j, &b) in bridges.iter().enumerate() {
            let meta = second.nodes[b].meta.clone();
            second.nodes[b].op =
                Op::Parameter { index: n + j, shape: meta.shape.clone(), dtype: meta.dtype };
            second.nodes[b].inputs.clear();
        }
        second.outputs.clear();
        let mut second_holders = Vec::new();
        for (i, &o) in trace.outputs.iter().enumerate().filter(|(_, &o)| !part[o]) {
            second.outputs.push(o);
            second_holders.push(self.holders[i].clone());
        }
        let (second, params) = second.pruned();
        let second_inputs = params
            .iter()
            .map(|&p| if p < n { self.inputs[p].clone() } else { bridge_values[p - n].clone() })
            .collect();
        let plan =
            |trace, inputs, holders| FlushPlan { trace, inputs, holders, call_sites: Vec::new() };
        (
            plan(first, first_inputs, first_holders),
            Some(plan(second, second_inputs, second_holders)),
        )
    }
}

/// The call sites renumbered as [`Trace::pruned`] renumbers nodes (live nodes
/// keep their order).
fn pruned_call_sites(
    trace: &Trace,
    sites: &[(NodeId, &'static Location<'static>)],
) -> Vec<Option<&'static Location<'static>>> {
    if sites.is_empty() {
        return Vec::new();
    }
    let mut by_node = vec![None; trace.len()];
    for &(node, site) in sites {
        by_node[node] = Some(site);
    }
    let mut live = vec![false; trace.len()];
    for &o in &trace.outputs {
        live[o] = true;
    }
    for id in (0..trace.len()).rev() {
        if live[id] {
            for &i in &trace.nodes[id].inputs {
                live[i] = true;
            }
        }
    }
    by_node.into_iter().zip(live).filter(|(_, l)| *l).map(|(s, _)| s).collect()
}
