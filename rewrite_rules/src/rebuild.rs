//! From an extracted choice back to a trace.

use std::collections::{HashMap, HashSet};

use egg::Id;
use trace_ir::{Error, NodeId, Result, Trace};

use crate::analysis::op_of;
use crate::{TensorGraph, TensorNode};

fn internal(msg: String) -> Error {
    Error::backend("rewrite_rules", msg)
}

/// Builds the trace that computes `outputs` (classes, in order) with the
/// e-node `choose` picks for each class.
///
/// The original's parameters come first, all of them, with their indices and
/// metas, used or not, so the runtime's input list does not change. Nodes
/// are added with [`Trace::push`], which infers and checks each one again.
pub fn to_trace<'a>(
    egraph: &TensorGraph,
    original: &Trace,
    classes: &[Id],
    outputs: &[Id],
    choose: impl Fn(Id) -> Option<&'a TensorNode>,
) -> Result<Trace> {
    let mut out = Trace::new();
    let mut done: HashMap<Id, NodeId> = HashMap::new();
    for p in original.parameters() {
        let id = out.push(original.nodes[p].op.clone(), &[])?;
        done.entry(egraph.find(classes[p])).or_insert(id);
    }
    // Depth-first, without recursion: traces can be deep.
    let mut open: HashSet<Id> = HashSet::new();
    for &root in outputs {
        let mut stack = vec![(egraph.find(root), false)];
        while let Some((class, expanded)) = stack.pop() {
            if done.contains_key(&class) {
                continue;
            }
            let node =
                choose(class).ok_or_else(|| internal(format!("no choice for e-class {class}")))?;
            if !expanded {
                if !open.insert(class) {
                    return Err(internal(format!(
                        "the extracted choice has a cycle through e-class {class}"
                    )));
                }
                stack.push((class, true));
                stack.extend(node.inputs().iter().rev().map(|&i| (egraph.find(i), false)));
                continue;
            }
            let op = op_of(node, |c| egraph[c].data.attr.clone())
                .ok_or_else(|| internal(format!("e-node {node} has malformed attributes")))?;
            let built = |i: &Id| done.get(&egraph.find(*i)).copied();
            let inputs: Vec<NodeId> =
                node.inputs().iter().map(built).collect::<Option<_>>().ok_or_else(|| {
                    internal(format!("an input of e-class {class} was not built"))
                })?;
            let id = out.push(op, &inputs)?;
            open.remove(&class);
            done.insert(class, id);
        }
    }
    out.outputs = outputs.iter().map(|&o| done[&egraph.find(o)]).collect();
    Ok(out)
}
