//! Pass 1, classify: what each node can be inside a fused kernel, and which
//! nodes must be realized before any kernel is drafted.
//!
//! A node's class decides everything later passes may do with it: an
//! elementwise op can be computed inline by any loop, a view is folded into
//! the loads of whoever reads it, a reduction over trailing axes sets a
//! loop's row space, and a `Single` runs alone. Classes depend on the node
//! alone, so they are computed once. The seed realizations (parameters,
//! outputs, `Single` nodes and their inputs) are the fixed points every plan
//! has; the draft pass then adds only the cuts it discovers.

use smallvec::SmallVec;
use trace_ir::{DType, NodeId, Op, Trace};

use super::Planner;
use crate::program::{live_nodes, CutReason};

/// What a node can be inside a fused kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Param,
    /// A float or bool `full`: a literal inside loops.
    Literal,
    /// Elementwise on float/bool values (casts from integers included).
    Elem,
    /// Broadcast: an identity inside loops.
    Expand,
    /// Reshape, permute, slice of float/bool values: folded into loads.
    View,
    /// A float reduction over trailing axes.
    Reduce,
    /// A fused row form over trailing axes.
    RowOp,
    MatMul,
    Single,
}

/// Whether `axes` are the last `axes.len()` axes of a rank-`rank` value.
fn trailing(axes: &[usize], rank: usize) -> bool {
    let mut a: SmallVec<[usize; 6]> = axes.into();
    a.sort_unstable();
    !a.is_empty() && a.iter().enumerate().all(|(i, &x)| x == rank - a.len() + i)
}

/// Loops compute in f32 registers: float and bool values fit, integers do not.
fn float_or_bool(d: DType) -> bool {
    d.is_float() || d == DType::Bool
}

/// The class of node `id` of `t`.
pub(super) fn classify(t: &Trace, id: NodeId) -> Class {
    let n = &t.nodes[id];
    let dt = n.meta.dtype;
    let in_dt = |i: usize| t.nodes[n.inputs[i]].meta.dtype;
    let in_rank = |i: usize| t.nodes[n.inputs[i]].meta.shape.len();
    match &n.op {
        Op::Parameter { .. } => Class::Param,
        Op::Full { dtype, .. } if float_or_bool(*dtype) => Class::Literal,
        Op::Unary { .. } | Op::Where if float_or_bool(dt) => Class::Elem,
        Op::Binary { .. } if float_or_bool(in_dt(0)) => Class::Elem,
        Op::Cast { to } if float_or_bool(*to) => Class::Elem,
        Op::Expand { .. } if float_or_bool(dt) => Class::Expand,
        Op::Reshape { .. } | Op::Permute { .. } | Op::Slice { .. } if float_or_bool(dt) => {
            Class::View
        }
        Op::Reduce { axes, .. } if dt.is_float() && trailing(axes, in_rank(0)) => Class::Reduce,
        Op::Softmax { axis } | Op::LogSoftmax { axis } if trailing(&[*axis], in_rank(0)) => {
            Class::RowOp
        }
        Op::LayerNorm { axes } | Op::RmsNorm { axes } if trailing(axes, in_rank(0)) => Class::RowOp,
        Op::MatMul => Class::MatMul,
        _ => Class::Single,
    }
}

impl<'a> Planner<'a> {
    /// Liveness, users and classes of every node; nothing realized yet.
    pub(super) fn new(t: &'a Trace, cfg: &'a super::PlanConfig) -> Self {
        let live = live_nodes(t);
        let mut users = vec![Vec::new(); t.len()];
        for (id, n) in t.nodes.iter().enumerate() {
            if live[id] {
                for &i in &n.inputs {
                    if !users[i].contains(&id) {
                        users[i].push(id);
                    }
                }
            }
        }
        let class = (0..t.len()).map(|id| classify(t, id)).collect();
        Planner { t, cfg, live, users, class, realized: vec![None; t.len()], budgets: Vec::new() }
    }

    /// Realizes what every plan realizes: parameters, `Single` nodes and
    /// their inputs, outputs; and, with [`super::PlanConfig::epilogues`]
    /// off, every matrix product (so none takes an epilogue).
    pub(super) fn seed(&mut self) {
        let t = self.t;
        for (id, n) in t.nodes.iter().enumerate() {
            if !self.live[id] {
                continue;
            }
            match self.class[id] {
                Class::Param => self.realize(id, CutReason::Parameter),
                Class::Single => {
                    self.realize(id, CutReason::NotFusible { op: n.op.name().into() });
                    for &i in &n.inputs {
                        self.realize(i, CutReason::NotFusible { op: n.op.name().into() });
                    }
                }
                _ => {}
            }
        }
        for &o in &t.outputs {
            self.realize(o, CutReason::Output);
        }
        if !self.cfg.epilogues {
            // After the outputs, so a product that is an output keeps that reason.
            for id in 0..t.len() {
                if self.live[id] && self.class[id] == Class::MatMul {
                    self.realize(id, CutReason::MatMulBoundary);
                }
            }
        }
    }
}
