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

/// The ops a row form (softmax, a norm) counts as: the primitives it expands to.
const ROW_FORM_OPS: usize = 7;

impl Planner<'_> {
    /// The ops one member runs.
    fn ops_of(&self, m: NodeId) -> usize {
        match self.class[m] {
            Class::Elem | Class::Reduce | Class::MatMul => 1,
            Class::RowOp => ROW_FORM_OPS,
            _ => 0,
        }
    }

    /// The ops a loop with these members runs.
    fn loop_ops(&self, members: &BTreeSet<NodeId>) -> usize {
        members.iter().map(|&m| self.ops_of(m)).sum()
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
        // Split near the middle: realize the node whose closure runs closest
        // to half the loop's ops.
        let half = ops / 2;
        let pick = self
            .closure_ops(members)
            .into_iter()
            .filter(|&(m, _)| {
                !roots.contains(&m)
                    && matches!(self.class[m], Class::Elem | Class::Reduce | Class::RowOp)
            })
            .min_by_key(|&(_, closure)| closure.abs_diff(half));
        match pick {
            Some((p, _)) => Err(vec![(p, CutReason::Limit)]),
            // Nothing to cut at (every op is a root): kept over the limit.
            None => Ok(()),
        }
    }

    /// Each member with the ops of its inline closure within the loop (the
    /// member and the members it reads, transitively), all at once: one
    /// bitset of members per member, built in the trace's topological order,
    /// so a long chain costs M^2/64 word operations where a walk per member
    /// cost M^2 set lookups (a 3,000-op chain split again and again on
    /// every tier-1 miss).
    fn closure_ops(&self, members: &BTreeSet<NodeId>) -> Vec<(NodeId, usize)> {
        // Members in ascending id order, which is topological in a trace.
        let order: Vec<NodeId> = members.iter().copied().collect();
        let words = order.len().div_ceil(64);
        let slot = |n: NodeId| order.binary_search(&n).ok();
        let mut sets = vec![0u64; order.len() * words];
        // Members by their ops, to weigh a closure with popcounts.
        let (mut unit, mut row) = (vec![0u64; words], vec![0u64; words]);
        for (i, &m) in order.iter().enumerate() {
            let bit = (i / 64, 1u64 << (i % 64));
            match self.ops_of(m) {
                1 => unit[bit.0] |= bit.1,
                ROW_FORM_OPS => row[bit.0] |= bit.1,
                _ => {}
            }
            let (done, rest) = sets.split_at_mut(i * words);
            let set = &mut rest[..words];
            set[bit.0] |= bit.1;
            for j in self.t.nodes[m].inputs.iter().filter_map(|&x| slot(x)) {
                for (w, &v) in set.iter_mut().zip(&done[j * words..(j + 1) * words]) {
                    *w |= v;
                }
            }
        }
        let weigh = |set: &[u64]| -> usize {
            set.iter()
                .zip(unit.iter().zip(&row))
                .map(|(&s, (&u, &r))| {
                    (s & u).count_ones() as usize + ROW_FORM_OPS * (s & r).count_ones() as usize
                })
                .sum()
        };
        order
            .iter()
            .enumerate()
            .map(|(i, &m)| (m, weigh(&sets[i * words..(i + 1) * words])))
            .collect()
    }
}
