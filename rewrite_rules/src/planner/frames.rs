//! Frames: which of a loop's two index spaces each member lives in.
//!
//! A row loop iterates over a shape whose trailing `row_dims` dimensions are
//! reduced. A value either varies over the whole shape (`Elem`) or holds one
//! value per row (`Row`: a reduction without `keepdim`, and what is computed
//! from such values alone). Mixing the two in one op, or a member that does
//! not broadcast into the space of its frame, cannot be one loop: the pass
//! names the node to realize (`ShapeChange`, or `ReductionBoundary` in a
//! row loop). Literals and loads take whatever frame their readers need.

use std::collections::{BTreeMap, BTreeSet};

use trace_ir::shape::numel;
use trace_ir::{NodeId, Op, Shape};

use super::classify::Class;
use super::{Planner, Violations};
use crate::program::{CutReason, Frame};

/// Right-aligns `shape` into rank `r` (None when it has more dimensions).
fn align(shape: &[usize], r: usize) -> Option<Shape> {
    if shape.len() > r {
        return None;
    }
    let mut s: Shape = smallvec::SmallVec::from_elem(1, r - shape.len());
    s.extend_from_slice(shape);
    Some(s)
}

/// Whether `shape` in `frame` broadcasts into the iteration space.
fn fits(shape: &[usize], frame: Frame, s: &[usize], k: usize) -> bool {
    let space = match frame {
        Frame::Elem => s,
        Frame::Row => &s[..s.len() - k],
    };
    match align(shape, space.len()) {
        Some(a) => a.iter().zip(space).all(|(&x, &y)| x == y || x == 1),
        None => false,
    }
}

/// The aligned (rank of `s`) shape of a value in `frame`.
fn aligned(shape: &[usize], frame: Frame, s: &[usize], k: usize) -> Option<Shape> {
    match frame {
        Frame::Elem => align(shape, s.len()),
        Frame::Row => {
            let mut a = align(shape, s.len() - k)?;
            a.extend(std::iter::repeat_n(1, k));
            Some(a)
        }
    }
}

impl Planner<'_> {
    /// The frame of every member of a loop over `shape` with `k` row
    /// dimensions whose reductions are `reds`, or the nodes to realize.
    pub(super) fn frames(
        &self,
        roots: &[NodeId],
        members: &BTreeSet<NodeId>,
        shape: &Shape,
        k: usize,
        reds: &[NodeId],
    ) -> std::result::Result<BTreeMap<NodeId, Frame>, Violations> {
        let t = self.t;
        let mut v = Violations::new();
        // Frames, bottom-up; `None` is free (only loads and literals below).
        let mut frames: BTreeMap<NodeId, Option<Frame>> = BTreeMap::new();
        for &m in members {
            let node = &t.nodes[m];
            let f = match self.class[m] {
                Class::Literal => None,
                Class::MatMul => Some(Frame::Elem),
                Class::Reduce | Class::RowOp => {
                    let x = node.inputs[0];
                    if members.contains(&x) && frames[&x] == Some(Frame::Row) {
                        v.push((x, CutReason::ShapeChange));
                    }
                    match node.op {
                        Op::Reduce { keepdim: false, .. } => Some(Frame::Row),
                        _ => Some(Frame::Elem),
                    }
                }
                _ => {
                    let fs: BTreeSet<Frame> = node
                        .inputs
                        .iter()
                        .filter(|&&i| members.contains(&i) && numel(self.shape(i)) != 1)
                        .filter_map(|i| frames[i])
                        .collect();
                    if fs.len() > 1 {
                        for &i in &node.inputs {
                            if members.contains(&i) && frames[&i] == Some(Frame::Row) {
                                v.push((i, CutReason::ShapeChange));
                            }
                        }
                    }
                    fs.into_iter().next()
                }
            };
            frames.insert(m, f);
        }
        // Free nodes take the frame their readers need.
        let mut resolved: BTreeMap<NodeId, Frame> = BTreeMap::new();
        for &m in members.iter().rev() {
            let f = frames[&m].unwrap_or_else(|| {
                let readers: Vec<Frame> = self.users[m]
                    .iter()
                    .filter(|u| members.contains(u))
                    .map(|u| match self.class[*u] {
                        Class::Reduce | Class::RowOp | Class::MatMul => Frame::Elem,
                        _ => resolved.get(u).copied().unwrap_or(Frame::Elem),
                    })
                    .collect();
                if !roots.contains(&m)
                    && !readers.is_empty()
                    && readers.iter().all(|&f| f == Frame::Row)
                {
                    Frame::Row
                } else {
                    Frame::Elem
                }
            });
            resolved.insert(m, f);
        }
        // Every node must fit the iteration space in its frame.
        for &m in members {
            if self.class[m] == Class::Literal {
                continue;
            }
            if !fits(self.shape(m), resolved[&m], shape, k) {
                let inner: Vec<NodeId> =
                    t.nodes[m].inputs.iter().copied().filter(|i| members.contains(i)).collect();
                let why = if reds.is_empty() {
                    CutReason::ShapeChange
                } else {
                    CutReason::ReductionBoundary
                };
                if inner.is_empty() {
                    v.push((m, why));
                } else {
                    v.extend(inner.into_iter().map(|i| (i, why.clone())));
                }
            }
        }
        // Operands' frames must match their readers' (scalars fit anywhere).
        for &m in members {
            if matches!(self.class[m], Class::Elem | Class::Expand) {
                for &i in &t.nodes[m].inputs {
                    if members.contains(&i)
                        && numel(self.shape(i)) != 1
                        && resolved[&i] != resolved[&m]
                    {
                        v.push((i, CutReason::ShapeChange));
                    }
                }
            }
        }
        if !v.is_empty() {
            return Err(v);
        }
        // Roots are stored over the whole space or one value per row.
        let mut outer = shape.clone();
        for d in outer.iter_mut().skip(shape.len() - k) {
            *d = 1;
        }
        for &r in roots {
            let a = aligned(self.shape(r), resolved[&r], shape, k);
            if a.as_ref() != Some(shape) && a.as_ref() != Some(&outer) {
                if reds.is_empty() {
                    // Only a merge of unlike loops gets here.
                    return Err(vec![(r, CutReason::ShapeChange)]);
                }
                return Err(reds.iter().map(|&x| (x, CutReason::ReductionBoundary)).collect());
            }
        }
        Ok(resolved)
    }
}
