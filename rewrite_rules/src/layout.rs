//! The `layout` rule set: chains of layout ops collapse, and layout ops that
//! change nothing disappear. Each one moves every byte of its input in the
//! cost model, so fewer is cheaper, and all of these are exact (they only
//! move values).
//!
//! - `permute-identity`: `permute(x, [0, 1, ..])` is `x`.
//! - `permute-permute`: `permute(permute(x, p), q)` is `permute(x, r)` with
//!   `r[j] = p[q[j]]`; an identity `r` is then removed by `permute-identity`.
//! - `reshape-reshape`: row-major reshapes compose: only the last shape counts.
//! - `reshape-same`: a reshape to the shape the tensor already has.
//! - `expand-expand`: broadcasting is transitive, so `expand(expand(x, a), b)`
//!   is `expand(x, b)`.
//! - `expand-same`: an expand to the shape the tensor already has.

use egg::{rewrite, Applier, Id, PatternAst, Subst, Symbol, Var};
use trace_ir::{Axes, Op};

use crate::conditions::{attr_of, Check};
use crate::guard::{checked, union_op, var, TensorRewrite};
use crate::{Attr, TensorAnalysis, TensorGraph, TensorNode};

fn is_identity_perm(name: &str) -> Check {
    let p = var(name);
    Box::new(
        move |egraph, _, subst| matches!(attr_of(egraph, subst, p), Some(Attr::Dims(perm)) if perm.iter().enumerate().all(|(i, &a)| i == a)),
    )
}

/// Applies `permute-permute`: the composed permutation is computed, not matched.
#[derive(Debug)]
struct ComposePermutes {
    x: Var,
    inner: Var,
    outer: Var,
}

impl Applier<TensorNode, TensorAnalysis> for ComposePermutes {
    fn apply_one(
        &self,
        egraph: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<TensorNode>>,
        rule_name: Symbol,
    ) -> Vec<Id> {
        let (Some(Attr::Dims(p)), Some(Attr::Dims(q))) =
            (attr_of(egraph, subst, self.inner), attr_of(egraph, subst, self.outer))
        else {
            return vec![];
        };
        let composed: Option<Axes> = q.iter().map(|&j| p.get(j).copied()).collect();
        match composed {
            Some(perm) => {
                union_op(egraph, eclass, &Op::Permute { perm }, &[subst[self.x]], rule_name)
            }
            None => vec![],
        }
    }

    fn vars(&self) -> Vec<Var> {
        vec![self.x, self.inner, self.outer]
    }
}

/// The rules of the set, each named.
pub fn rules() -> Vec<TensorRewrite> {
    let compose = ComposePermutes { x: var("?x"), inner: var("?p"), outer: var("?q") };
    vec![
        rewrite!("permute-identity"; "(permute ?x ?p)" => { checked("?x") } if is_identity_perm("?p")),
        rewrite!("permute-permute"; "(permute (permute ?x ?p) ?q)" => { compose }),
        rewrite!("reshape-reshape"; "(reshape (reshape ?x ?a) ?b)" => { checked("(reshape ?x ?b)") }),
        rewrite!("reshape-same"; "(reshape ?x ?s)" => { checked("?x") }),
        rewrite!("expand-expand"; "(expand (expand ?x ?a) ?b)" => { checked("(expand ?x ?b)") }),
        rewrite!("expand-same"; "(expand ?x ?s)" => { checked("?x") }),
    ]
}
