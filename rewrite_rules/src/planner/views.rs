//! Views: reshapes, permutes, slices and expands over a realized buffer
//! are not computed, they are folded into how a kernel indexes the buffer.
//!
//! This is what lets a matrix product read a transposed weight in place and
//! a loop read a sliced or broadcast input without a copy. A chain that does
//! not fold into one strided window (a reshape that merges strided
//! dimensions, or a view of a value computed inline) tells the draft pass
//! which node to realize instead (`ShapeChange`, or `MatMulBoundary` for a
//! product's operand).

use trace_ir::{NodeId, Op};

use super::classify::Class;
use super::{Planner, Violations};
use crate::program::{fold_layout, row_major, CutReason, View};

/// A realized buffer, the view that reads it, and the view nodes folded.
pub(super) type Folded = (NodeId, View, Vec<NodeId>);

impl Planner<'_> {
    /// The views of a product's operands over realized buffers.
    pub(super) fn matmul_operands(
        &self,
        mm: NodeId,
    ) -> std::result::Result<[Folded; 2], Violations> {
        let ins = &self.t.nodes[mm].inputs;
        let a = self.compose(ins[0], CutReason::MatMulBoundary);
        let b = self.compose(ins[1], CutReason::MatMulBoundary);
        match (a, b) {
            (Ok(a), Ok(b)) => Ok([a, b]),
            (a, b) => Err(a.err().into_iter().chain(b.err()).collect()),
        }
    }

    /// Folds the chain of unrealized views above a realized buffer into one
    /// strided view: `(base, view, folded view nodes)`.
    pub(super) fn compose(
        &self,
        u: NodeId,
        reason: CutReason,
    ) -> std::result::Result<Folded, (NodeId, CutReason)> {
        let mut chain = Vec::new();
        let mut cur = u;
        while !self.is_realized(cur) && matches!(self.class[cur], Class::View | Class::Expand) {
            chain.push(cur);
            cur = self.t.nodes[cur].inputs[0];
        }
        if !self.is_realized(cur) {
            let why = if chain.is_empty() { reason } else { CutReason::ShapeChange };
            return Err((cur, why));
        }
        let base = cur;
        let base_shape = self.shape(base).clone();
        let steps: Vec<Op> = chain.iter().rev().map(|&v| self.t.nodes[v].op.clone()).collect();
        let (shape, strides, offset) = fold_layout(&base_shape, &steps).map_err(|i| {
            // A reshape that does not fold cuts below itself; any other step at itself.
            let at = chain.len() - 1 - i;
            let below = if i == 0 { base } else { chain[at + 1] };
            (
                if matches!(steps[i], Op::Reshape { .. }) { below } else { chain[at] },
                CutReason::ShapeChange,
            )
        })?;
        let view = if chain.is_empty()
            || (shape == base_shape && offset == 0 && strides == row_major(&shape))
        {
            View::Direct
        } else if shape.len() >= 2 && shape.len() == base_shape.len() && offset == 0 && {
            let r = shape.len();
            let mut sw = base_shape.clone();
            sw.swap(r - 2, r - 1);
            let mut st = row_major(&base_shape);
            st.swap(r - 2, r - 1);
            sw == shape && st == strides
        } {
            View::Transposed
        } else {
            View::Strided { shape, strides, offset, source: base_shape, steps }
        };
        Ok((base, view, chain))
    }
}
