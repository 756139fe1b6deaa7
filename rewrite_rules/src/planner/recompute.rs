//! Pass 3, recompute: what happens to a node that several kernels need.
//!
//! After drafting, a node may be a member of several loops: each would
//! compute it inline. That saves a buffer write and read when the node is a
//! few elementwise ops, and costs a second pass over the input when it holds
//! a reduction or a product, so those are realized instead
//! (`SecondConsumer`): reductions and products never run twice.
//!
//! With [`super::PlanConfig::recompute`] off, every shared elementwise node
//! is realized, so each value is computed exactly once (literals and
//! broadcasts, which compute nothing, are still read by each loop). A
//! value recomputed in f32 by a second kernel and the same value stored and
//! loaded in a half-precision dtype differ by that rounding, which is what
//! turning this off isolates.

use std::collections::{BTreeMap, BTreeSet};

use trace_ir::NodeId;

use super::classify::Class;
use super::draft::Draft;
use super::{Planner, Violations, RECOMPUTE_MAX_OPS};
use crate::program::CutReason;

impl Planner<'_> {
    /// The nodes computed by several of `drafts` that must be realized instead.
    pub(super) fn check_shared(&self, drafts: &[Draft]) -> std::result::Result<(), Violations> {
        let mut count: BTreeMap<NodeId, usize> = BTreeMap::new();
        for d in drafts {
            if let Draft::Loop(l) = d {
                for &m in &l.members {
                    *count.entry(m).or_default() += 1;
                }
            }
        }
        let violations: Violations = count
            .iter()
            .filter(|&(&n, &c)| c > 1 && !self.may_recompute(n))
            .map(|(&n, _)| (n, CutReason::SecondConsumer))
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(violations)
        }
    }

    /// Whether several kernels may each compute `n`.
    fn may_recompute(&self, n: NodeId) -> bool {
        if self.cfg.recompute {
            self.cheap_to_recompute(n)
        } else {
            matches!(self.class[n], Class::Literal | Class::Expand)
        }
    }

    /// Whether `n`'s inline closure is at most [`RECOMPUTE_MAX_OPS`]
    /// elementwise ops and holds no reduction or product.
    fn cheap_to_recompute(&self, n: NodeId) -> bool {
        let mut seen = BTreeSet::new();
        let mut stack = vec![n];
        let mut ops = 0;
        while let Some(m) = stack.pop() {
            if !seen.insert(m) {
                continue;
            }
            match self.class[m] {
                Class::Reduce | Class::RowOp | Class::MatMul => return false,
                Class::Elem => ops += 1,
                _ => {}
            }
            if ops > RECOMPUTE_MAX_OPS {
                return false;
            }
            for &i in &self.t.nodes[m].inputs {
                if !self.is_realized(i)
                    && matches!(
                        self.class[i],
                        Class::Elem
                            | Class::Expand
                            | Class::Literal
                            | Class::Reduce
                            | Class::RowOp
                            | Class::MatMul
                    )
                {
                    stack.push(i);
                }
            }
        }
        true
    }
}
