//! Pass 5, merge: loops over the same iteration space become one
//! multi-output loop.
//!
//! Two loops merge when one reads the other's output (vertical: the value
//! stays in a register) or when they read a common non-scalar input
//! (horizontal: the input is read once), provided no third kernel lies on a
//! path between them, which would make the pair wait on itself. A row loop
//! takes an elementwise loop over its space; a loop holding a product does
//! not take more work. A merge that would make a node computed twice is
//! refused. Adam's `p`, `m` and `v` updates come out of one pass this way.
//!
//! Each attempt costs a step of a budget (by default `4 × drafts + 16`,
//! [`super::PlanConfig::merge_budget`]), since every success rescans all
//! pairs; a plan whose budget ran out first records it in
//! [`crate::program::Program::budgets_exhausted`]. With
//! [`super::PlanConfig::merge`] off, every draft is its own kernel.

use std::collections::BTreeSet;

use trace_ir::shape::numel;
use trace_ir::NodeId;

use super::draft::Draft;
use super::Planner;
use crate::program::BudgetExhausted;

/// The values a draft computes for others (its roots) and the values it reads.
struct Edges {
    roots: Vec<NodeId>,
    reads: Vec<NodeId>,
}

impl Planner<'_> {
    /// Which drafts read each draft's outputs.
    pub(super) fn successors(&self, drafts: &[Draft]) -> Vec<BTreeSet<usize>> {
        let edges: Vec<Edges> = drafts.iter().map(|d| self.edges_of(d)).collect();
        self.successors_of(&edges)
    }

    /// What a draft writes and reads, kept per draft while merging: the
    /// reads of a product resolve its operands' views, which is too dear to
    /// redo for every draft after every merge.
    fn edges_of(&self, d: &Draft) -> Edges {
        let reads = match d {
            Draft::Single(n) => self.t.nodes[*n].inputs.to_vec(),
            Draft::MatMul(n) => match self.matmul_operands(*n) {
                Ok(ops) => ops.iter().map(|o| o.0).collect(),
                Err(_) => self.t.nodes[*n].inputs.to_vec(),
            },
            Draft::Loop(l) => l.reads.iter().copied().collect(),
        };
        Edges { roots: d.roots(), reads }
    }

    fn successors_of(&self, edges: &[Edges]) -> Vec<BTreeSet<usize>> {
        let mut by_value: Vec<Option<usize>> = vec![None; self.t.nodes.len()];
        for (k, e) in edges.iter().enumerate() {
            for &r in &e.roots {
                by_value[r] = Some(k);
            }
        }
        let mut succ = vec![BTreeSet::new(); edges.len()];
        for (k, e) in edges.iter().enumerate() {
            for &v in &e.reads {
                match by_value[v] {
                    Some(p) if p != k => {
                        succ[p].insert(k);
                    }
                    _ => {}
                }
            }
        }
        succ
    }

    /// Whether `to` is reachable from `from` through at least one other draft.
    fn indirect_path(succ: &[BTreeSet<usize>], from: usize, to: usize) -> bool {
        let mut seen = vec![false; succ.len()];
        let mut stack: Vec<usize> = succ[from].iter().copied().filter(|&s| s != to).collect();
        while let Some(k) = stack.pop() {
            if k == to {
                return true;
            }
            if std::mem::replace(&mut seen[k], true) {
                continue;
            }
            stack.extend(succ[k].iter().copied());
        }
        false
    }

    /// Merges loops of `drafts` in place; `Some` when the budget stopped it
    /// before no pair was left to merge.
    pub(super) fn merge(&self, drafts: &mut Vec<Draft>) -> Option<BudgetExhausted> {
        let initial = self.cfg.merge_budget.unwrap_or(4 * drafts.len() + 16);
        let mut budget = initial;
        let mut edges: Vec<Edges> = drafts.iter().map(|d| self.edges_of(d)).collect();
        let mut changed = true;
        while changed && budget > 0 {
            changed = false;
            let succ = self.successors_of(&edges);
            'outer: for a in 0..drafts.len() {
                let Draft::Loop(la) = &drafts[a] else { continue };
                for b in 0..drafts.len() {
                    if a == b {
                        continue;
                    }
                    let Draft::Loop(lb) = &drafts[b] else { continue };
                    // A row loop takes an elementwise loop over its space
                    // either way (a layer norm whose statistics are also
                    // outputs stays one pass); two row loops must reduce
                    // the same trailing axes.
                    if la.shape != lb.shape
                        || (la.row_dims != lb.row_dims && la.row_dims != 0 && lb.row_dims != 0)
                        || la.mm.is_some()
                    {
                        continue;
                    }
                    let vertical = succ[a].contains(&b);
                    let horizontal = !vertical
                        && a < b
                        && la.reads.intersection(&lb.reads).any(|&v| numel(self.shape(v)) > 1)
                        && !succ[b].contains(&a);
                    if !vertical && !horizontal {
                        continue;
                    }
                    if Self::indirect_path(&succ, a, b)
                        || (horizontal && Self::indirect_path(&succ, b, a))
                    {
                        continue;
                    }
                    budget = budget.saturating_sub(1);
                    let mut roots: Vec<NodeId> =
                        la.roots.iter().chain(&lb.roots).copied().collect();
                    roots.sort_unstable();
                    roots.dedup();
                    let Ok(merged) = self.loop_draft(&roots) else { continue };
                    // Merging must not make anything else recomputed.
                    if merged.members.len() > la.members.len() + lb.members.len() {
                        continue;
                    }
                    let (lo, hi) = (a.min(b), a.max(b));
                    drafts.remove(hi);
                    edges.remove(hi);
                    drafts[lo] = Draft::Loop(merged);
                    edges[lo] = self.edges_of(&drafts[lo]);
                    changed = true;
                    break 'outer;
                }
            }
        }
        // Stopped with a merge just made: more may have been possible.
        (changed && budget == 0).then(|| BudgetExhausted { pass: "merge".into(), budget: initial })
    }
}
