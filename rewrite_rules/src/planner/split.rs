//! Pass 4, split: a loop larger than [`super::PlanConfig::max_kernel_ops`]
//! is cut in two.
//!
//! Very long loop bodies compile slowly and spill registers, so a draft
//! over the limit realizes one of its inner nodes (`Limit`), the one whose
//! inline closure is nearest half the loop, and the draft pass tries again:
//! repeated, this cuts a long chain into pieces under the limit. Row forms
//! (softmax, layer norm, ...) count as the 7 ops they expand to.
//!
//! With [`super::PlanConfig::split`] off, loops of any size are kept whole.

use std::collections::BTreeSet;

use trace_ir::NodeId;

use super::classify::Class;
use super::{Planner, Violations};
use crate::program::CutReason;

impl Planner<'_> {
    /// The ops a loop with these members runs.
    fn loop_ops(&self, members: &BTreeSet<NodeId>) -> usize {
        members
            .iter()
            .map(|&m| match self.class[m] {
                Class::Elem | Class::Reduce | Class::MatMul => 1,
                Class::RowOp => 7,
                _ => 0,
            })
            .sum()
    }

    /// Ok when the loop fits the limit; else the node to realize to split it.
    pub(super) fn split(
        &self,
        roots: &[NodeId],
        members: &BTreeSet<NodeId>,
    ) -> std::result::Result<(), Violations> {
        let ops = self.loop_ops(members);
        if ops <= self.cfg.max_kernel_ops.max(1) {
            return Ok(());
        }
        // Split near the middle: realize the node whose closure is closest to half.
        let half = ops / 2;
        let pick = members
            .iter()
            .copied()
            .filter(|m| {
                !roots.contains(m)
                    && matches!(self.class[*m], Class::Elem | Class::Reduce | Class::RowOp)
            })
            .min_by_key(|&m| self.closure_ops(m, members).abs_diff(half));
        match pick {
            Some(p) => Err(vec![(p, CutReason::Limit)]),
            // Nothing to cut at (every op is a root): kept over the limit.
            None => Ok(()),
        }
    }

    /// How many members `n`'s inline closure within the loop holds.
    fn closure_ops(&self, n: NodeId, members: &BTreeSet<NodeId>) -> usize {
        let mut seen = BTreeSet::new();
        let mut stack = vec![n];
        while let Some(m) = stack.pop() {
            if seen.insert(m) {
                stack
                    .extend(self.t.nodes[m].inputs.iter().copied().filter(|i| members.contains(i)));
            }
        }
        seen.len()
    }
}
