//! From a trace to an e-graph: one e-class per distinct value.

use egg::Id;
use smallvec::SmallVec;
use trace_ir::{Error, Result, Trace};

use crate::{NodeKind, TensorGraph, TensorNode};

/// Adds every node of `trace` to a new e-graph, returning the e-graph and the
/// class of each node. Identical nodes share a class (common subexpressions
/// merge here, before any rule runs).
pub fn to_egraph(trace: &Trace) -> Result<(TensorGraph, Vec<Id>)> {
    let mut egraph = TensorGraph::default();
    let mut classes = Vec::with_capacity(trace.nodes.len());
    for (i, node) in trace.nodes.iter().enumerate() {
        let (kind, attrs) = NodeKind::from_op(&node.op);
        let mut children: SmallVec<[Id; 4]> =
            node.inputs.iter().map(|&input| classes[input]).collect();
        children.extend(attrs.into_iter().map(|a| egraph.add(TensorNode::attr(a))));
        let id = egraph.add(TensorNode { kind, children });
        if egraph[id].data.meta.as_ref() != Some(&node.meta) {
            return Err(Error::InvalidTrace(format!(
                "node {i} ({}) does not infer its recorded shape and dtype in the e-graph",
                node.op.name()
            )));
        }
        classes.push(id);
    }
    egraph.rebuild();
    let classes = classes.into_iter().map(|c| egraph.find(c)).collect();
    Ok((egraph, classes))
}
