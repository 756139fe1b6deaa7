//! The one rule every rewrite obeys: it may only add an e-node that infers
//! exactly the meta of the e-class it joins.
//!
//! Binary ops broadcast implicitly, so `x * 1` may be larger than `x`, and
//! `cast(x, f32)` is only `x` when `x` already is f32. Instead of a special
//! condition per rule, every right-hand side goes through [`SameMeta`] (or
//! [`union_op`] for appliers that compute their result), which infers the
//! shape and dtype of what it would add, with `trace_ir::infer`, before
//! adding anything. A rule whose right-hand side would not type-check, or
//! would change the meta, simply does not fire.
//!
//! Meta equality is necessary, not sufficient: `permute([1,0])` of a square
//! matrix keeps its meta, so rules still state their own conditions.

use egg::{Applier, ENodeOrVar, Id, Pattern, PatternAst, Subst, Symbol, Var};
use smallvec::SmallVec;
use trace_ir::{infer, Meta, Op};

use crate::analysis::infer_node;
use crate::{Attr, NodeKind, TensorAnalysis, TensorGraph, TensorNode};

/// The rewrite type of this crate.
pub type TensorRewrite = egg::Rewrite<TensorNode, TensorAnalysis>;

/// Parses a pattern written in this crate's rule tables.
pub(crate) fn pattern(text: &str) -> Pattern<TensorNode> {
    // The rule tables are constants, covered by tests: a bad one is a bug
    // found on the first test run, never a runtime input.
    text.parse().unwrap_or_else(|e| panic!("bad pattern {text:?}: {e:?}"))
}

pub(crate) fn var(name: &str) -> Var {
    name.parse().unwrap_or_else(|e| panic!("bad variable {name:?}: {e:?}"))
}

/// An applier that instantiates a pattern only when the result keeps the
/// matched class's meta.
#[derive(Debug)]
pub struct SameMeta {
    rhs: Pattern<TensorNode>,
}

/// The right-hand side `rhs`, guarded by [`SameMeta`].
pub fn checked(rhs: &str) -> SameMeta {
    SameMeta { rhs: pattern(rhs) }
}

/// The meta the instantiation of `ast` under `subst` would have, without adding it.
fn instantiated_meta(
    egraph: &TensorGraph,
    ast: &PatternAst<TensorNode>,
    subst: &Subst,
) -> Option<Meta> {
    // Per pattern node: its attribute, or its meta.
    let mut infos: Vec<(Option<Attr>, Option<Meta>)> = Vec::with_capacity(ast.as_ref().len());
    for node in ast.as_ref() {
        let info = match node {
            ENodeOrVar::Var(v) => {
                let data = &egraph[*subst.get(*v)?].data;
                (data.attr.clone(), data.meta.clone())
            }
            ENodeOrVar::ENode(n) => match n.as_attr() {
                Some(a) => (Some(a.clone()), None),
                None => {
                    let meta = infer_node(
                        n,
                        |c| infos[usize::from(c)].0.clone(),
                        |c| infos[usize::from(c)].1.clone(),
                    );
                    (None, Some(meta?))
                }
            },
        };
        infos.push(info);
    }
    infos.pop()?.1
}

impl Applier<TensorNode, TensorAnalysis> for SameMeta {
    fn apply_one(
        &self,
        egraph: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        searcher_ast: Option<&PatternAst<TensorNode>>,
        rule_name: Symbol,
    ) -> Vec<Id> {
        let want = egraph[eclass].data.meta.as_ref();
        if want.is_none() || instantiated_meta(egraph, &self.rhs.ast, subst).as_ref() != want {
            return vec![];
        }
        self.rhs.apply_one(egraph, eclass, subst, searcher_ast, rule_name)
    }

    fn vars(&self) -> Vec<Var> {
        self.rhs.vars()
    }
}

/// Adds `op` over the classes `inputs` and merges it into `eclass`, if it
/// infers `eclass`'s meta; for appliers that compute attributes (a composed
/// permutation, a folded value). Returns the class when something changed.
pub fn union_op(
    egraph: &mut TensorGraph,
    eclass: Id,
    op: &Op,
    inputs: &[Id],
    rule_name: Symbol,
) -> Vec<Id> {
    let metas: Option<SmallVec<[&Meta; 3]>> =
        inputs.iter().map(|&i| egraph[i].data.meta.as_ref()).collect();
    let fits = match (metas, &egraph[eclass].data.meta) {
        (Some(metas), Some(want)) => infer(op, &metas).ok().as_ref() == Some(want),
        _ => false,
    };
    if !fits {
        return vec![];
    }
    let (kind, attrs) = NodeKind::from_op(op);
    let mut children: SmallVec<[Id; 4]> = inputs.iter().copied().collect();
    children.extend(attrs.into_iter().map(|a| egraph.add(TensorNode::attr(a))));
    let id = egraph.add(TensorNode { kind, children });
    if egraph.union_trusted(eclass, id, rule_name) {
        vec![eclass]
    } else {
        vec![]
    }
}
