//! The trace DAG: an arena of nodes in topological order. Parameters are
//! runtime inputs (materialized buffers, user scalars); outputs are the values
//! someone still holds when the trace runs.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::infer::{infer, Meta};
use crate::{Error, Op, Result};

/// Index of a node in its trace.
pub type NodeId = usize;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    #[serde(flatten)]
    pub op: Op,
    #[serde(default, skip_serializing_if = "SmallVec::is_empty")]
    pub inputs: SmallVec<[NodeId; 3]>,
    pub meta: Meta,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub nodes: Vec<Node>,
    pub outputs: Vec<NodeId>,
}

impl Trace {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn meta(&self, id: NodeId) -> &Meta {
        &self.nodes[id].meta
    }

    /// Equal node for node with literals compared bit for bit, so a
    /// constant `-0.0` differs from `0.0` (as their signatures do) and a
    /// NaN constant equals itself: the equality of in-memory caches that
    /// hold exact traces.
    pub fn identical(&self, other: &Trace) -> bool {
        fn same_op(a: &Op, b: &Op) -> bool {
            match (a, b) {
                (
                    Op::Full { value: v, shape: s, dtype: d },
                    Op::Full { value: w, shape: t, dtype: e },
                ) => v.to_bits() == w.to_bits() && s == t && d == e,
                (
                    Op::Arange { start: a0, step: a1, len: n, dtype: d },
                    Op::Arange { start: b0, step: b1, len: m, dtype: e },
                ) => {
                    a0.to_bits() == b0.to_bits() && a1.to_bits() == b1.to_bits() && n == m && d == e
                }
                _ => a == b,
            }
        }
        self.outputs == other.outputs
            && self.nodes.len() == other.nodes.len()
            && self
                .nodes
                .iter()
                .zip(&other.nodes)
                .all(|(a, b)| a.inputs == b.inputs && a.meta == b.meta && same_op(&a.op, &b.op))
    }

    /// The trace of one op on fresh parameters, its result the one output:
    /// what Strict and Debug compile for each op.
    pub fn single_op(op: &Op, inputs: &[Meta]) -> Result<Trace> {
        let mut trace = Trace::new();
        let params: Vec<_> = inputs.iter().map(|m| trace.push_parameter(m.clone())).collect();
        let out = trace.push(op.clone(), &params)?;
        trace.outputs.push(out);
        Ok(trace)
    }

    /// Appends an op after checking it against its inputs.
    pub fn push(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId> {
        self.check_inputs(&op, inputs)?;
        let metas: SmallVec<[&Meta; 3]> = inputs.iter().map(|&i| &self.nodes[i].meta).collect();
        let meta = infer(&op, &metas)?;
        drop(metas);
        self.nodes.push(Node { op, inputs: inputs.into(), meta });
        Ok(self.nodes.len() - 1)
    }

    /// [`Self::push`] for a caller that has already inferred `meta`, the
    /// output of `op` on these inputs' metas (the engine infers it at the op
    /// call, to raise shape errors there): the trace does not infer it again.
    pub fn push_inferred(&mut self, op: Op, inputs: &[NodeId], meta: Meta) -> Result<NodeId> {
        self.check_inputs(&op, inputs)?;
        debug_assert_eq!(
            infer(&op, &inputs.iter().map(|&i| &self.nodes[i].meta).collect::<Vec<_>>()).ok(),
            Some(meta.clone())
        );
        self.nodes.push(Node { op, inputs: inputs.into(), meta });
        Ok(self.nodes.len() - 1)
    }

    /// Every input of `op` is a node of this trace.
    fn check_inputs(&self, op: &Op, inputs: &[NodeId]) -> Result<()> {
        match inputs.iter().find(|&&i| i >= self.nodes.len()) {
            Some(&bad) => {
                Err(Error::InvalidTrace(format!("{}: input node {bad} does not exist", op.name())))
            }
            None => Ok(()),
        }
    }

    /// Appends the next runtime input (parameter). Parameters are numbered
    /// in the order they are pushed, so its number is one more than the last
    /// one's, found from the end: recording a trace op by op reads each node
    /// once here in all, where counting the parameters walked every node for
    /// each new one.
    pub fn push_parameter(&mut self, meta: Meta) -> NodeId {
        let index = self
            .nodes
            .iter()
            .rev()
            .find_map(|n| match n.op {
                Op::Parameter { index, .. } => Some(index + 1),
                _ => None,
            })
            .unwrap_or(0);
        self.nodes.push(Node {
            op: Op::Parameter { index, shape: meta.shape.clone(), dtype: meta.dtype },
            inputs: SmallVec::new(),
            meta,
        });
        self.nodes.len() - 1
    }

    pub fn num_parameters(&self) -> usize {
        self.nodes.iter().filter(|n| matches!(n.op, Op::Parameter { .. })).count()
    }

    /// Parameter nodes, ordered by parameter index.
    pub fn parameters(&self) -> Vec<NodeId> {
        let mut params: Vec<(usize, NodeId)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(id, n)| match n.op {
                Op::Parameter { index, .. } => Some((index, id)),
                _ => None,
            })
            .collect();
        params.sort_unstable();
        params.into_iter().map(|(_, id)| id).collect()
    }

    /// How many times each node is read, by other nodes and as an output.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut uses = vec![0; self.nodes.len()];
        for n in &self.nodes {
            for &i in &n.inputs {
                uses[i] += 1;
            }
        }
        for &o in &self.outputs {
            uses[o] += 1;
        }
        uses
    }

    /// Keeps only what the outputs need, renumbering nodes and parameters in
    /// order of first appearance. Returns the new trace and, for each of its
    /// parameters, the index the parameter had before.
    pub fn pruned(&self) -> (Trace, Vec<usize>) {
        self.pruned_to(&self.live())
    }

    /// The nodes `live` marks, renumbered as [`Trace::pruned`] does.
    fn pruned_to(&self, live: &[bool]) -> (Trace, Vec<usize>) {
        let mut remap = vec![usize::MAX; self.nodes.len()];
        let mut out = Trace::new();
        let mut old_params = Vec::new();
        for (id, node) in self.nodes.iter().enumerate().filter(|(id, _)| live[*id]) {
            let mut node = node.clone();
            if let Op::Parameter { index, .. } = &mut node.op {
                old_params.push(*index);
                *index = old_params.len() - 1;
            }
            for i in node.inputs.iter_mut() {
                *i = remap[*i];
            }
            remap[id] = out.nodes.len();
            out.nodes.push(node);
        }
        out.outputs = self.outputs.iter().map(|&o| remap[o]).collect();
        (out, old_params)
    }

    /// [`Trace::pruned`], without copying a trace that it would leave as it
    /// is: every node live and the parameters numbered in order, as a
    /// trace recorded op by op whose results are all used (a Strict op
    /// group, most flushes) has them.
    pub fn into_pruned(self) -> (Trace, Vec<usize>) {
        let mut params = 0;
        let in_order = self.nodes.iter().all(|n| match n.op {
            Op::Parameter { index, .. } => {
                params += 1;
                index == params - 1
            }
            _ => true,
        });
        let live = self.live();
        if in_order && live.iter().all(|&l| l) {
            return (self, (0..params).collect());
        }
        self.pruned_to(&live)
    }

    /// Which nodes an output depends on (outputs included).
    fn live(&self) -> Vec<bool> {
        let mut live = vec![false; self.nodes.len()];
        for &o in &self.outputs {
            live[o] = true;
        }
        for id in (0..self.nodes.len()).rev() {
            if live[id] {
                for &i in &self.nodes[id].inputs {
                    live[i] = true;
                }
            }
        }
        live
    }

    /// Checks every invariant a trace from an untrusted source might break:
    /// inputs point backwards, every node's meta is what inference says,
    /// parameter indices are exactly 0..n, outputs exist.
    pub fn validate(&self) -> Result<()> {
        let mut seen_params = Vec::new();
        for (id, node) in self.nodes.iter().enumerate() {
            if let Some(&bad) = node.inputs.iter().find(|&&i| i >= id) {
                return Err(Error::InvalidTrace(format!(
                    "node {id} ({}) reads node {bad}, which does not come before it",
                    node.op.name()
                )));
            }
            let metas: SmallVec<[&Meta; 3]> =
                node.inputs.iter().map(|&i| &self.nodes[i].meta).collect();
            let inferred = infer(&node.op, &metas)
                .map_err(|e| Error::InvalidTrace(format!("node {id}: {e}")))?;
            if inferred != node.meta {
                return Err(Error::InvalidTrace(format!(
                    "node {id} ({}) claims shape {:?} {} but its inputs give {:?} {}",
                    node.op.name(),
                    node.meta.shape.as_slice(),
                    node.meta.dtype,
                    inferred.shape.as_slice(),
                    inferred.dtype
                )));
            }
            if let Op::Parameter { index, .. } = node.op {
                seen_params.push(index);
            }
        }
        seen_params.sort_unstable();
        if seen_params.iter().enumerate().any(|(i, &p)| i != p) {
            return Err(Error::InvalidTrace(format!(
                "parameter indices {seen_params:?} are not 0..{}",
                seen_params.len()
            )));
        }
        if let Some(&bad) = self.outputs.iter().find(|&&o| o >= self.nodes.len()) {
            return Err(Error::InvalidTrace(format!(
                "output {bad} does not exist ({} nodes)",
                self.nodes.len()
            )));
        }
        Ok(())
    }
}
