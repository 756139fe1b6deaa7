//! The e-class analysis: what every e-class holds (its [`Meta`]), whether it
//! is a known constant, and, for attribute leaves, the attribute.
//!
//! Every e-node of a class must infer the same meta; the rules guarantee it
//! by checking before they add anything (see [`crate::guard`]), so merging
//! never has to pick between two metas.

use egg::{Analysis, DidMerge, EGraph, Id};
use smallvec::SmallVec;
use trace_ir::{infer, Meta, Op};

use crate::numeric::stored_value;
use crate::{Attr, NodeKind, TensorNode};

/// The e-graph this crate rewrites.
pub type TensorGraph = EGraph<TensorNode, TensorAnalysis>;

/// The analysis of [`TensorGraph`]; see [`Data`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TensorAnalysis;

/// What is known about an e-class.
#[derive(Debug, Clone, Default)]
pub struct Data {
    /// Shape and dtype of the tensor; `None` for attribute leaves.
    pub meta: Option<Meta>,
    /// The one value every element has, as the kernels store it, when the
    /// class holds a `full` literal. Parameters are runtime values and never
    /// constants.
    pub constant: Option<f64>,
    /// The attribute, for an attribute leaf.
    pub attr: Option<Attr>,
}

impl Data {
    fn same_as(&self, other: &Data) -> bool {
        // Compare constants by bits: NaN must equal itself here, or a merge
        // would report a change forever.
        self.meta == other.meta
            && self.constant.map(f64::to_bits) == other.constant.map(f64::to_bits)
            && self.attr == other.attr
    }
}

/// The trace op an e-node stands for, reading attribute children from `attr`.
pub fn op_of(node: &TensorNode, attr: impl Fn(Id) -> Option<Attr>) -> Option<Op> {
    let attrs: Option<Vec<Attr>> = node.attr_children().iter().map(|&c| attr(c)).collect();
    let attrs = attrs?;
    let refs: Vec<&Attr> = attrs.iter().collect();
    node.kind.to_op(&refs)
}

/// The meta an e-node would have, given its children's attributes and metas;
/// `None` when the op does not accept them.
pub fn infer_node(
    node: &TensorNode,
    attr: impl Fn(Id) -> Option<Attr>,
    meta: impl Fn(Id) -> Option<Meta>,
) -> Option<Meta> {
    let op = op_of(node, attr)?;
    let metas: Option<Vec<Meta>> = node.inputs().iter().map(|&c| meta(c)).collect();
    let metas = metas?;
    let refs: SmallVec<[&Meta; 3]> = metas.iter().collect();
    infer(&op, &refs).ok()
}

/// The meta an e-node whose children are classes of `egraph` would have.
pub fn node_meta(egraph: &TensorGraph, node: &TensorNode) -> Option<Meta> {
    infer_node(node, |c| egraph[c].data.attr.clone(), |c| egraph[c].data.meta.clone())
}

impl Analysis<TensorNode> for TensorAnalysis {
    type Data = Data;

    fn make(egraph: &mut TensorGraph, enode: &TensorNode) -> Data {
        if let Some(attr) = enode.as_attr() {
            return Data { attr: Some(attr.clone()), ..Data::default() };
        }
        let meta = node_meta(egraph, enode);
        let constant = match (&enode.kind, &meta) {
            (NodeKind::Full, Some(m)) => match op_of(enode, |c| egraph[c].data.attr.clone()) {
                Some(Op::Full { value, .. }) => Some(stored_value(m.dtype, value)),
                _ => None,
            },
            _ => None,
        };
        Data { meta, constant, attr: None }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        let before = a.clone();
        // Fill what `a` does not know from `b`. Two metas never differ (the
        // rules check before adding); two constants of one class are equal.
        if a.meta.is_none() {
            a.meta = b.meta.clone();
        }
        if a.constant.is_none() {
            a.constant = b.constant;
        }
        if a.attr.is_none() {
            a.attr = b.attr.clone();
        }
        DidMerge(!a.same_as(&before), !a.same_as(&b))
    }
}
