//! The pending trace of DeferAndFuse: ops recorded since the last flush, the
//! buffers they read, and a weak handle to the tensor of each node, so a flush
//! knows which values someone still holds.

use std::panic::Location;
use std::sync::{Arc, Weak};

use ahash::AHashMap;
use runtime::Buffer;
use trace_ir::{Error, NodeId, Op, Result, Trace};

use crate::repeats::RepeatDetector;
use crate::value::{Cell, Value};

pub(crate) struct PendingTrace {
    pub epoch: u64,
    pub trace: Trace,
    /// The buffer of each parameter, by parameter index.
    pub params: Vec<Arc<Buffer>>,
    /// Parameter node of each buffer already read, keyed by address, so a
    /// tensor read twice is one parameter.
    param_nodes: AHashMap<usize, NodeId>,
    /// The tensor of each node (none for parameters).
    pub owners: Vec<Weak<Value>>,
    /// Where each op was recorded, kept only while fusion dumps are on.
    call_sites: Vec<(NodeId, &'static Location<'static>)>,
    /// Watches the ops recorded since the last flush for a repetition; a new
    /// pending trace starts with a fresh one, so every flush resets it.
    pub repeats: RepeatDetector,
}

/// What a flush has to run: the pruned trace, its inputs, and the tensors its
/// outputs belong to.
pub(crate) struct FlushPlan {
    pub trace: Trace,
    pub inputs: Vec<Arc<Buffer>>,
    pub holders: Vec<Arc<Value>>,
    /// The call site of each node of `trace`, when fusion dumps recorded them.
    pub call_sites: Vec<Option<&'static Location<'static>>>,
}

impl PendingTrace {
    pub fn new(epoch: u64) -> Self {
        PendingTrace {
            epoch,
            trace: Trace::new(),
            params: Vec::new(),
            param_nodes: AHashMap::new(),
            owners: Vec::new(),
            call_sites: Vec::new(),
            repeats: RepeatDetector::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.trace.len()
    }

    /// The node that stands for `tensor` in this trace, adding a parameter
    /// when the tensor is already materialized.
    pub fn node_of(&mut self, tensor: &Value) -> Result<NodeId> {
        match &*tensor.cell.lock().unwrap() {
            Cell::Deferred { node, epoch } if *epoch == self.epoch => Ok(*node),
            Cell::Ready(buffer) => {
                let key = Arc::as_ptr(buffer) as usize;
                if let Some(&node) = self.param_nodes.get(&key) {
                    return Ok(node);
                }
                let node = self.trace.push_parameter(buffer.meta().clone());
                self.params.push(buffer.clone());
                self.owners.push(Weak::new());
                self.param_nodes.insert(key, node);
                Ok(node)
            }
            Cell::Failed { error, op } => Err(Error::poisoned_by(op.as_str(), error.clone())),
            Cell::Deferred { .. } | Cell::Queued => Err(Error::internal(
                "engine",
                "tensor from another flush or mode used in DeferAndFuse",
            )),
        }
    }

    /// Appends an op whose inputs are nodes of this trace.
    pub fn push(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId> {
        self.trace.push(op, inputs)
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
    pub fn take(&mut self) -> Option<FlushPlan> {
        let taken = std::mem::replace(self, PendingTrace::new(self.epoch + 1));
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
        let (pruned, old_params) = trace.pruned();
        // `taken.params` is dropped on return, so the program holds the only
        // reference the trace had and can free or reuse each input early.
        let inputs = old_params.iter().map(|&i| taken.params[i].clone()).collect();
        Some(FlushPlan { trace: pruned, inputs, holders, call_sites })
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
