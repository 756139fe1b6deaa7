//! DAG-aware extraction: pick one e-node per e-class so that the cost of
//! everything the roots reach, each class counted once, is small.
//!
//! egg's [`egg::Extractor`] sums costs as a tree: a value used twice is paid
//! twice, so it prefers recomputing a cheap expression over sharing an
//! expensive one, which is the opposite of what fusion wants. Here:
//!
//! 1. Greedy, bottom-up: the cost of choosing node `n` for class `c` is the
//!    sum of the node costs of the union of classes `n` reaches (its
//!    children's reach sets, plus `c`). Classes are revisited from a
//!    worklist whenever a child's choice changes, until nothing changes or a
//!    step budget (`32 × e-nodes + e-classes`) runs out.
//! 2. [`DagExtractor::refine`], for the actual roots: the greedy step sees
//!    one class at a time, so it may fuse `layer_norm(x)` even though the
//!    variance it would replace is also an output and is paid anyway. Each
//!    reachable class then tries its other nodes, keeping a switch only if
//!    the cost of everything the roots reach goes down (and no cycle forms).
//!
//! A budget that runs out is reported by [`DagExtractor::budgets_exhausted`]
//! (and from there in the rewrite report and the planned program): the
//! choices are then valid but may be worse than the heuristic could find.
//!
//! Exact DAG extraction is NP-hard; this is a heuristic, and the caller
//! compares the result with the input and with a tree extraction.

use std::collections::{HashMap, VecDeque};

use egg::{Id, Language};

use crate::program::BudgetExhausted;
use crate::{TensorGraph, TensorNode};

/// A set of class indices, as bits.
type Reach = Vec<u64>;

fn has(set: &Reach, i: usize) -> bool {
    set[i / 64] >> (i % 64) & 1 == 1
}

/// The chosen e-node of every class, by DAG cost.
#[derive(Debug)]
pub struct DagExtractor<'a> {
    egraph: &'a TensorGraph,
    index: HashMap<Id, usize>,
    classes: Vec<Id>,
    /// Per class, per node: its own cost, and its children as class indices.
    locals: Vec<Vec<f64>>,
    children: Vec<Vec<Vec<usize>>>,
    /// Per class: the index of the chosen node.
    choice: Vec<Option<usize>>,
    /// The steps that ran out: the greedy pass's, `refine`'s work.
    exhausted: Vec<BudgetExhausted>,
}

impl<'a> DagExtractor<'a> {
    /// Chooses a node for every class of `egraph` under the node cost `node_cost`.
    pub fn new(egraph: &'a TensorGraph, node_cost: impl Fn(&TensorNode) -> f64) -> Self {
        let mut classes: Vec<Id> = egraph.classes().map(|c| c.id).collect();
        classes.sort_unstable();
        let index: HashMap<Id, usize> =
            classes.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let locals =
            classes.iter().map(|&c| egraph[c].nodes.iter().map(&node_cost).collect()).collect();
        let class_indices =
            |n: &TensorNode| n.children().iter().map(|&k| index[&egraph.find(k)]).collect();
        let children =
            classes.iter().map(|&c| egraph[c].nodes.iter().map(class_indices).collect()).collect();
        let mut extractor = DagExtractor {
            egraph,
            index,
            classes,
            locals,
            children,
            choice: Vec::new(),
            exhausted: Vec::new(),
        };
        let (choice, stopped) = extractor.greedy();
        extractor.choice = choice;
        extractor.exhausted.extend(stopped);
        extractor
    }

    /// The greedy choices, and the budget if it ran out with work queued.
    fn greedy(&self) -> (Vec<Option<usize>>, Option<BudgetExhausted>) {
        struct Best {
            node: usize,
            cost: f64,
            reach: Reach,
        }
        let n = self.classes.len();
        let words = n.div_ceil(64);
        let mut parents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (ci, nodes) in self.children.iter().enumerate() {
            for &child in nodes.iter().flatten() {
                parents[child].push(ci);
            }
        }
        for p in &mut parents {
            p.sort_unstable();
            p.dedup();
        }
        let mut best: Vec<Option<Best>> = (0..n).map(|_| None).collect();
        let mut queue: VecDeque<usize> = (0..n).collect();
        let mut queued = vec![true; n];
        let total_nodes: usize = self.locals.iter().map(Vec::len).sum();
        let initial = 32 * total_nodes + n;
        let mut budget = initial;
        let mut stopped = None;
        while let Some(ci) = queue.pop_front() {
            queued[ci] = false;
            if budget == 0 {
                stopped = Some(BudgetExhausted { pass: "extract".into(), budget: initial });
                break;
            }
            budget -= 1;
            let mut candidate: Option<Best> = None;
            for (ni, kids) in self.children[ci].iter().enumerate() {
                let mut reach: Reach = vec![0; words];
                let ready = kids.iter().all(|&k| match &best[k] {
                    Some(b) => {
                        reach.iter_mut().zip(&b.reach).for_each(|(a, b)| *a |= b);
                        true
                    }
                    None => false,
                });
                if !ready || has(&reach, ci) {
                    continue; // not computable yet, or it would need itself
                }
                reach[ci / 64] |= 1 << (ci % 64);
                let local = self.locals[ci][ni];
                let cost = sum_reach(&reach, |k| match &best[k] {
                    _ if k == ci => local,
                    Some(b) => self.locals[k][b.node],
                    None => 0.0,
                });
                if candidate.as_ref().is_none_or(|c| cost < c.cost) {
                    candidate = Some(Best { node: ni, cost, reach });
                }
            }
            let Some(new) = candidate else { continue };
            let changed = best[ci].as_ref().is_none_or(|old| {
                old.node != new.node || old.reach != new.reach || old.cost != new.cost
            });
            if changed {
                best[ci] = Some(new);
                for &p in &parents[ci] {
                    if !queued[p] {
                        queued[p] = true;
                        queue.push_back(p);
                    }
                }
            }
        }
        (best.into_iter().map(|b| b.map(|b| b.node)).collect(), stopped)
    }

    /// The budgets that ran out so far (greedy extraction, [`Self::refine`]).
    pub fn budgets_exhausted(&self) -> &[BudgetExhausted] {
        &self.exhausted
    }

    /// Improves the choices for the roots together: tries every other node
    /// of every class they reach, keeping a switch when the total cost drops.
    /// `work` bounds the classes visited while evaluating, in all.
    pub fn refine(&mut self, roots: &[Id], mut work: usize) {
        let initial = work;
        let Some(roots) = roots.iter().map(|&r| self.class_index(r)).collect::<Option<Vec<_>>>()
        else {
            return;
        };
        let Some((mut current, _)) = self.walk(&roots) else { return };
        let mut improved = true;
        while improved {
            improved = false;
            let Some((_, reached)) = self.walk(&roots) else { return };
            for c in reached {
                for ni in 0..self.locals[c].len() {
                    if work == 0 {
                        self.exhausted
                            .push(BudgetExhausted { pass: "refine".into(), budget: initial });
                        return;
                    }
                    let old = self.choice[c];
                    if old == Some(ni)
                        || self.children[c][ni].iter().any(|&k| self.choice[k].is_none())
                        || old.is_some_and(|o| self.cannot_beat(c, o, ni))
                    {
                        continue;
                    }
                    self.choice[c] = Some(ni);
                    match self.walk(&roots) {
                        Some((cost, seen)) if cost < current => {
                            work = work.saturating_sub(seen.len());
                            current = cost;
                            improved = true;
                        }
                        other => {
                            work = work.saturating_sub(
                                other.map_or(self.classes.len(), |(_, seen)| seen.len()),
                            );
                            self.choice[c] = old;
                        }
                    }
                }
            }
        }
    }

    /// Whether choosing node `ni` of class `c` instead of node `old` surely
    /// costs no less, without a walk: it reads the same classes (so the
    /// roots reach the same set) and costs at least as much itself. Most
    /// alternatives are like that (`a * b` against `b * a`), and skipping
    /// their walks is most of what makes `refine` cheap.
    fn cannot_beat(&self, c: usize, old: usize, ni: usize) -> bool {
        let set = |n: usize| {
            let mut kids = self.children[c][n].clone();
            kids.sort_unstable();
            kids.dedup();
            kids
        };
        self.locals[c][ni] >= self.locals[c][old] && set(ni) == set(old)
    }

    /// The cost of everything `roots` reach under the current choices, and
    /// the classes reached; `None` if a choice is missing or they form a cycle.
    fn walk(&self, roots: &[usize]) -> Option<(f64, Vec<usize>)> {
        const NEW: u8 = 0;
        const OPEN: u8 = 1;
        const DONE: u8 = 2;
        let mut state = vec![NEW; self.classes.len()];
        let mut reached = Vec::new();
        let mut total = 0.0;
        let mut stack: Vec<(usize, bool)> = roots.iter().map(|&r| (r, false)).collect();
        while let Some((c, expanded)) = stack.pop() {
            let node = self.choice[c]?;
            match (state[c], expanded) {
                (DONE, _) => {}
                (OPEN, false) => return None,
                (_, false) => {
                    state[c] = OPEN;
                    stack.push((c, true));
                    stack.extend(
                        self.children[c][node]
                            .iter()
                            .filter(|&&k| state[k] != DONE)
                            .map(|&k| (k, false)),
                    );
                }
                (_, true) => {
                    state[c] = DONE;
                    total += self.locals[c][node];
                    reached.push(c);
                }
            }
        }
        Some((total, reached))
    }

    fn class_index(&self, id: Id) -> Option<usize> {
        self.index.get(&self.egraph.find(id)).copied()
    }

    /// The chosen e-node of the class of `id`; `None` if no choice reaches
    /// leaves without going through the class itself.
    pub fn choice(&self, id: Id) -> Option<&'a TensorNode> {
        let ci = self.class_index(id)?;
        self.egraph[self.classes[ci]].nodes.get(self.choice[ci]?)
    }

    /// The DAG cost of the class of `id` alone.
    pub fn cost(&self, id: Id) -> Option<f64> {
        self.total_cost(&[id])
    }

    /// The DAG cost of everything `roots` reach together, each class once.
    pub fn total_cost(&self, roots: &[Id]) -> Option<f64> {
        let roots: Option<Vec<usize>> = roots.iter().map(|&r| self.class_index(r)).collect();
        self.walk(&roots?).map(|(cost, _)| cost)
    }
}

/// Sums `cost` over the members of `set`.
fn sum_reach(set: &Reach, cost: impl Fn(usize) -> f64) -> f64 {
    let mut total = 0.0;
    for (w, &word) in set.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            total += cost(w * 64 + b);
            bits &= bits - 1;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use egg::{AstSize, Extractor};
    use trace_ir::{BinaryOp, DType, Meta, Op, Trace, UnaryOp};

    use super::*;
    use crate::NodeKind;

    /// One class with two spellings: `exp(x) * exp(x)` shares `exp(x)`, and
    /// `neg(neg(neg(x)))` shares nothing. Counting e-nodes, a tree pays for
    /// `exp(x)` twice (11 nodes against 7: it picks the negations), the DAG
    /// once (6 distinct classes against 7: it picks the product).
    #[test]
    fn dag_cost_pays_a_shared_value_once_where_a_tree_pays_twice() {
        let mut t = Trace::new();
        let x = t.push_parameter(Meta::new([4].into_iter().collect(), DType::F32));
        let e = t.push(Op::Unary { kind: UnaryOp::Exp }, &[x]).unwrap();
        let product = t.push(Op::Binary { kind: BinaryOp::Mul }, &[e, e]).unwrap();
        let mut negs = x;
        for _ in 0..3 {
            negs = t.push(Op::Unary { kind: UnaryOp::Neg }, &[negs]).unwrap();
        }
        let (mut egraph, classes) = crate::build::to_egraph(&t).unwrap();
        // Not equal in value: this only exercises the extractors.
        egraph.union(classes[product], classes[negs]);
        egraph.rebuild();
        let root = classes[product];

        let tree = Extractor::new(&egraph, AstSize);
        assert_eq!(tree.find_best_node(root).kind, NodeKind::Unary(UnaryOp::Neg));
        assert_eq!(tree.find_best_cost(root), 7);

        let dag = DagExtractor::new(&egraph, |_| 1.0);
        assert_eq!(dag.choice(root).map(|n| &n.kind), Some(&NodeKind::Binary(BinaryOp::Mul)));
        assert_eq!(dag.cost(root), Some(6.0));
        assert_eq!(dag.total_cost(&[root, classes[x]]), Some(6.0));
    }
}
