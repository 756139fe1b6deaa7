//! Pass 2, draft: one tentative kernel per realized node, repeated until
//! every draft is valid.
//!
//! A draft rooted at a realized node holds everything reachable from it
//! through unrealized nodes. Drafting discovers the cuts the rules in the
//! module docs require (a view of a computed value, a second matrix product,
//! reductions that disagree on the row space, ...) as *violations*: nodes to
//! realize. Realizing them and drafting again is a fixpoint that ends,
//! because every round realizes at least one more node. The recompute and
//! split passes take part in each round, since what they realize changes
//! what the next round drafts.

use std::collections::{BTreeMap, BTreeSet};

use trace_ir::shape::numel;
use trace_ir::{Error, NodeId, Op, Result, Shape};

use super::classify::Class;
use super::{Planner, Violations};
use crate::program::{CutReason, Frame};

/// A tentative kernel.
#[derive(Debug, Clone)]
pub(super) enum Draft {
    Single(NodeId),
    /// A matrix product without epilogue.
    MatMul(NodeId),
    Loop(LoopDraft),
}

/// A tentative fused loop (or matrix product with an epilogue).
#[derive(Debug, Clone)]
pub(super) struct LoopDraft {
    pub(super) roots: Vec<NodeId>,
    /// Nodes computed inline (literals and expands included), ascending.
    pub(super) members: BTreeSet<NodeId>,
    /// View nodes folded into loads.
    pub(super) folded: BTreeSet<NodeId>,
    /// Realized values read.
    pub(super) reads: BTreeSet<NodeId>,
    pub(super) mm: Option<NodeId>,
    pub(super) shape: Shape,
    pub(super) row_dims: usize,
    pub(super) frames: BTreeMap<NodeId, Frame>,
}

impl Draft {
    pub(super) fn roots(&self) -> Vec<NodeId> {
        match self {
            Draft::Single(n) | Draft::MatMul(n) => vec![*n],
            Draft::Loop(l) => l.roots.clone(),
        }
    }
}

/// What a loop rooted at some nodes reaches, before its shape is checked.
struct Body {
    members: BTreeSet<NodeId>,
    folded: BTreeSet<NodeId>,
    reads: BTreeSet<NodeId>,
    mm: Option<NodeId>,
}

impl Planner<'_> {
    /// Drafts, realizes what they violate, and drafts again until every
    /// draft is valid.
    pub(super) fn draft_all(&mut self) -> Result<Vec<Draft>> {
        loop {
            let round = self.drafts().and_then(|d| self.check_shared(&d).map(|()| d));
            match round {
                Ok(d) => return Ok(d),
                Err(v) => {
                    let before = self.realized.iter().filter(|r| r.is_some()).count();
                    for (n, r) in v {
                        self.realize(n, r);
                    }
                    let after = self.realized.iter().filter(|r| r.is_some()).count();
                    if after == before {
                        return Err(Error::internal("planner", "planning made no progress"));
                    }
                }
            }
        }
    }

    /// Kernels rooted at every realized node, or the nodes to realize first.
    fn drafts(&self) -> std::result::Result<Vec<Draft>, Violations> {
        let mut drafts = Vec::new();
        let mut violations = Violations::new();
        for id in 0..self.t.len() {
            if !self.live[id] || !self.is_realized(id) || self.class[id] == Class::Param {
                continue;
            }
            match self.draft_for(&[id]) {
                Ok(d) => drafts.push(d),
                Err(v) => violations.extend(v),
            }
        }
        if violations.is_empty() {
            Ok(drafts)
        } else {
            Err(violations)
        }
    }

    fn draft_for(&self, roots: &[NodeId]) -> std::result::Result<Draft, Violations> {
        let id = roots[0];
        let node = &self.t.nodes[id];
        if roots.len() == 1 {
            match self.class[id] {
                Class::Single | Class::View | Class::Literal => {
                    let missing: Violations = node
                        .inputs
                        .iter()
                        .filter(|&&i| !self.is_realized(i))
                        .map(|&i| (i, CutReason::NotFusible { op: node.op.name().into() }))
                        .collect();
                    return if missing.is_empty() { Ok(Draft::Single(id)) } else { Err(missing) };
                }
                Class::MatMul => {
                    self.matmul_operands(id)?;
                    return Ok(Draft::MatMul(id));
                }
                _ => {}
            }
        }
        self.loop_draft(roots).map(Draft::Loop)
    }

    /// The loop that computes `roots` (one root, or the roots of merged
    /// loops): its members, iteration space and frames, or the cuts it needs.
    pub(super) fn loop_draft(
        &self,
        roots: &[NodeId],
    ) -> std::result::Result<LoopDraft, Violations> {
        let body = self.gather(roots)?;
        let (shape, row_dims, reds) = self.iteration_space(roots, &body)?;
        let frames = self.frames(roots, &body.members, &shape, row_dims, &reds)?;
        if self.cfg.split {
            self.split(roots, &body.members)?;
        }
        Ok(LoopDraft {
            roots: roots.to_vec(),
            members: body.members,
            folded: body.folded,
            reads: body.reads,
            mm: body.mm,
            shape,
            row_dims,
            frames,
        })
    }

    /// Everything reachable from `roots` through unrealized fusible nodes;
    /// realized values and views of them become reads.
    fn gather(&self, roots: &[NodeId]) -> std::result::Result<Body, Violations> {
        let t = self.t;
        let mut members = BTreeSet::new();
        let mut folded = BTreeSet::new();
        let mut reads = BTreeSet::new();
        let mut mm: Option<NodeId> = None;
        let mut v = Violations::new();
        let mut stack: Vec<NodeId> = roots.to_vec();
        while let Some(n) = stack.pop() {
            if !members.insert(n) {
                continue;
            }
            if self.class[n] == Class::MatMul {
                match self.matmul_operands(n) {
                    Ok(ops) => {
                        for (base, _, chain) in ops {
                            reads.insert(base);
                            folded.extend(chain);
                        }
                    }
                    Err(e) => v.extend(e),
                }
                continue;
            }
            for &u in &t.nodes[n].inputs {
                // A root read by another member is computed inline (merged loops).
                if roots.contains(&u) {
                    continue;
                }
                if self.is_realized(u) {
                    reads.insert(u);
                    continue;
                }
                match self.class[u] {
                    Class::Literal | Class::Elem | Class::Expand | Class::Reduce | Class::RowOp => {
                        stack.push(u)
                    }
                    Class::View => match self.compose(u, CutReason::ShapeChange) {
                        Ok((base, _, chain)) => {
                            reads.insert(base);
                            folded.extend(chain);
                        }
                        Err(e) => v.push(e),
                    },
                    Class::MatMul => {
                        if mm.is_some_and(|m| m != u) {
                            v.push((u, CutReason::MatMulBoundary));
                        } else {
                            mm = Some(u);
                            stack.push(u);
                        }
                    }
                    Class::Param | Class::Single => {
                        v.push((u, CutReason::NotFusible { op: t.nodes[n].op.name().into() }))
                    }
                }
            }
        }
        if !v.is_empty() {
            return Err(v);
        }
        // A loop cannot read (through a view) a value it computes itself;
        // only a merge of two loops gets here.
        if let Some(&r) = roots.iter().find(|r| reads.contains(r)) {
            // (Direct reads of roots were skipped above, so this is a view.)
            return Err(vec![(r, CutReason::ShapeChange)]);
        }
        Ok(Body { members, folded, reads, mm })
    }

    /// The iteration shape and row dimensions: set by the reduction nearest
    /// the outputs, else by the product, else by the largest root. Also the
    /// loop's reductions, nearest the outputs first.
    fn iteration_space(
        &self,
        roots: &[NodeId],
        body: &Body,
    ) -> std::result::Result<(Shape, usize, Vec<NodeId>), Violations> {
        let t = self.t;
        let reds: Vec<NodeId> = body
            .members
            .iter()
            .rev()
            .copied()
            .filter(|&m| matches!(self.class[m], Class::Reduce | Class::RowOp))
            .collect();
        let red_axes = |m: NodeId| -> usize {
            match &t.nodes[m].op {
                Op::Reduce { axes, .. } | Op::LayerNorm { axes } | Op::RmsNorm { axes } => {
                    axes.len()
                }
                _ => 1,
            }
        };
        if let Some(&r0) = reds.first() {
            // A product's epilogue is elementwise over the product's shape.
            if let Some(m) = body.mm {
                return Err(vec![(m, CutReason::MatMulBoundary)]);
            }
            let s = self.shape(t.nodes[r0].inputs[0]).clone();
            let k = red_axes(r0);
            let v: Violations = reds[1..]
                .iter()
                .filter(|&&r| *self.shape(t.nodes[r].inputs[0]) != s || red_axes(r) != k)
                .map(|&r| (r, CutReason::ReductionBoundary))
                .collect();
            if !v.is_empty() {
                return Err(v);
            }
            Ok((s, k, reds))
        } else if let Some(m) = body.mm {
            Ok((self.shape(m).clone(), 0, reds))
        } else {
            let big = roots
                .iter()
                .copied()
                .max_by_key(|&r| (self.shape(r).len(), numel(self.shape(r))))
                .unwrap_or(roots[0]);
            Ok((self.shape(big).clone(), 0, reds))
        }
    }
}
