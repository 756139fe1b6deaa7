//! The `fold` rule set: cheap elementwise ops whose inputs are all literal
//! constants (`full` nodes, or results folded before) become one `full`.
//!
//! The value is computed in f64 and rounded as the kernel would round it
//! ([`crate::numeric`]), so folding never changes a result. Only ops whose
//! f64 result rounds to the kernel's result are folded: `add`, `sub`, `mul`,
//! `div`, `maximum`, `minimum`, `neg`, `abs`, `sqrt`, `reciprocal`, `floor`
//! and `cast`, one rule each (`fold-add`, ...). Transcendentals (`exp`,
//! `tanh`, ...) are left alone: the kernel's f32 result may differ from a
//! rounded f64 one in the last bit. Parameters are runtime values and are
//! never folded.

use egg::{rewrite, Applier, Id, PatternAst, Subst, Symbol, Var};
use trace_ir::{BinaryOp, Op, UnaryOp};

use crate::conditions::meta_of;
use crate::guard::{pattern, union_op, var, TensorRewrite};
use crate::numeric::{cast_value, kernel_result};
use crate::{TensorAnalysis, TensorGraph, TensorNode};

/// What a fold computes from its constant inputs.
#[derive(Debug, Clone, Copy)]
enum Fold {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Cast,
}

/// NaN-propagating maximum and minimum, as `torch.maximum` and the kernels.
fn extremum(a: f64, b: f64, max: bool) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if (b > a) == max {
        b
    } else {
        a
    }
}

impl Fold {
    /// The exact result, before the kernel's rounding.
    fn eval(self, args: &[f64]) -> Option<f64> {
        Some(match (self, args) {
            (Fold::Unary(k), &[a]) => match k {
                UnaryOp::Neg => -a,
                UnaryOp::Abs => a.abs(),
                UnaryOp::Sqrt => a.sqrt(),
                UnaryOp::Reciprocal => 1.0 / a,
                UnaryOp::Floor => a.floor(),
                _ => return None,
            },
            (Fold::Binary(k), &[a, b]) => match k {
                BinaryOp::Add => a + b,
                BinaryOp::Sub => a - b,
                BinaryOp::Mul => a * b,
                BinaryOp::Div => a / b,
                BinaryOp::Maximum => extremum(a, b, true),
                BinaryOp::Minimum => extremum(a, b, false),
                _ => return None,
            },
            _ => return None,
        })
    }
}

/// Replaces a matched op over constants by a `full` of its value.
#[derive(Debug)]
struct FoldConstant {
    fold: Fold,
    args: Vec<Var>,
}

impl Applier<TensorNode, TensorAnalysis> for FoldConstant {
    fn apply_one(
        &self,
        egraph: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<TensorNode>>,
        rule_name: Symbol,
    ) -> Vec<Id> {
        if egraph[eclass].data.constant.is_some() {
            return vec![]; // already folded
        }
        let Some(out) = egraph[eclass].data.meta.clone() else { return vec![] };
        let args: Option<Vec<f64>> =
            self.args.iter().map(|&v| egraph[subst[v]].data.constant).collect();
        let Some(args) = args else { return vec![] };
        let value = match self.fold {
            Fold::Cast => {
                let from = meta_of(egraph, subst, self.args[0]).map(|m| m.dtype);
                from.and_then(|from| cast_value(args[0], from, out.dtype))
            }
            f => f.eval(&args).and_then(|v| kernel_result(out.dtype, v)),
        };
        match value {
            Some(value) => {
                let full = Op::Full { value, shape: out.shape, dtype: out.dtype };
                union_op(egraph, eclass, &full, &[], rule_name)
            }
            None => vec![],
        }
    }

    fn vars(&self) -> Vec<Var> {
        self.args.clone()
    }
}

/// The rules of the set, each named `fold-<op>`.
pub fn rules() -> Vec<TensorRewrite> {
    use BinaryOp::*;
    use UnaryOp::*;
    let unary = [Neg, Abs, Sqrt, Reciprocal, Floor].map(|k| (k.name(), Fold::Unary(k), "(_ ?a)"));
    let binary =
        [Add, Sub, Mul, Div, Maximum, Minimum].map(|k| (k.name(), Fold::Binary(k), "(_ ?a ?b)"));
    let cast = [("cast", Fold::Cast, "(_ ?a ?to)")];
    let all = unary.into_iter().chain(binary).chain(cast);
    all.map(|(name, fold, shape)| {
        let args = if shape.contains("?b") { vec![var("?a"), var("?b")] } else { vec![var("?a")] };
        let lhs = pattern(&shape.replacen('_', name, 1));
        rewrite!(format!("fold-{name}"); { lhs } => { FoldConstant { fold, args } })
    })
    .collect()
}
