//! The driver: trace in, e-graph, rules to a limit, extraction, trace out.

use std::collections::{BTreeMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use egg::{Extractor, Id, Language, Runner, StopReason};
use trace_ir::{Error, NodeId, Result, Trace};

use crate::cost::{BytesMoved, TreeCost};
use crate::{
    build, rebuild, DagExtractor, NodeKind, RuleSets, TensorAnalysis, TensorGraph, TensorNode,
};

/// The bounds of one rewrite run, and which rule sets it uses.
#[derive(Debug, Clone, PartialEq)]
pub struct RewriteConfig {
    /// Stop once the e-graph holds more e-nodes than this.
    pub node_limit: usize,
    /// Stop after this many rounds of applying every rule.
    pub iter_limit: usize,
    /// Stop once saturation has run this long (extraction comes after).
    pub time_limit: Duration,
    /// Which rule sets are on.
    pub rule_sets: RuleSets,
}

impl Default for RewriteConfig {
    /// 20 000 e-nodes, 16 rounds, 50 ms, every rule set: enough for the
    /// patterns in traces of a few thousand ops, small next to compiling.
    fn default() -> Self {
        RewriteConfig {
            node_limit: 20_000,
            iter_limit: 16,
            time_limit: Duration::from_millis(50),
            rule_sets: RuleSets::default(),
        }
    }
}

/// What a run did, for dumps and `fusion-debug`.
#[derive(Debug, Clone, PartialEq)]
pub struct RewriteReport {
    /// How many times each rule changed the e-graph; rules that never did are absent.
    pub rules_fired: BTreeMap<String, usize>,
    /// Why saturation stopped.
    pub stop_reason: Stop,
    /// Rounds of rule application run (the last may have been cut short by a limit).
    pub iterations: usize,
    /// E-nodes in the final e-graph.
    pub egraph_nodes: usize,
    /// E-classes in the final e-graph.
    pub egraph_classes: usize,
    /// Cost ([`crate::cost`], in bytes) of the input trace.
    pub cost_before: f64,
    /// Cost of the optimized trace: never above `cost_before`, since when
    /// extraction finds nothing cheaper the input is returned as it is.
    pub cost_after: f64,
    /// Wall time of the whole optimization, extraction included.
    pub time: Duration,
    /// Extraction steps whose budget ran out (`extract`, `refine`): the
    /// trace is valid but may be costlier than a longer search would find.
    /// The engine copies these into the planned program's
    /// [`crate::program::Program::budgets_exhausted`].
    pub budgets_exhausted: Vec<crate::program::BudgetExhausted>,
}

/// An optimized trace and the report of how it was found.
#[derive(Debug, Clone)]
pub struct Optimized {
    /// Same outputs (order and metas) and same parameters as the input.
    pub trace: Trace,
    /// What the rewrite did.
    pub report: RewriteReport,
    /// For each node of `trace`, the input trace's nodes in the same e-class
    /// (ascending; empty for values only the rewrites introduced), so a dump
    /// can point an optimized node back at the user's op.
    pub origins: Vec<Vec<NodeId>>,
}

/// How many e-class visits [`DagExtractor::refine`] may spend.
const REFINE_WORK: usize = 2_000_000;

/// Why equality saturation stopped: egg's [`StopReason`] without its
/// payloads (the limits are in the [`RewriteConfig`]). Serialized as the
/// words [`Display`](std::fmt::Display) writes, which is what dumps hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", from = "String")]
pub enum Stop {
    /// No rule could change the e-graph any more.
    Saturated,
    /// The e-graph reached [`RewriteConfig::node_limit`] nodes.
    NodeLimit,
    /// [`RewriteConfig::iter_limit`] rounds ran.
    IterationLimit,
    /// [`RewriteConfig::time_limit`] passed.
    TimeLimit,
    /// A rule or hook asked to stop, saying why.
    Other(String),
}

impl Stop {
    /// Whether a limit cut saturation short (the result may be less optimized).
    pub fn is_limit(&self) -> bool {
        !matches!(self, Stop::Saturated)
    }
}

impl From<&StopReason> for Stop {
    fn from(reason: &StopReason) -> Stop {
        match reason {
            StopReason::Saturated => Stop::Saturated,
            StopReason::NodeLimit(_) => Stop::NodeLimit,
            StopReason::IterationLimit(_) => Stop::IterationLimit,
            StopReason::TimeLimit(_) => Stop::TimeLimit,
            StopReason::Other(why) => Stop::Other(why.clone()),
        }
    }
}

impl From<Stop> for String {
    fn from(stop: Stop) -> String {
        stop.to_string()
    }
}

impl From<String> for Stop {
    /// Reads back what `Display` wrote; any other words are [`Stop::Other`].
    fn from(words: String) -> Stop {
        match words.as_str() {
            "saturated" => Stop::Saturated,
            "node limit" => Stop::NodeLimit,
            "iteration limit" => Stop::IterationLimit,
            "time limit" => Stop::TimeLimit,
            _ => Stop::Other(words),
        }
    }
}

impl std::fmt::Display for Stop {
    /// The words dumps and `fusion-debug` show: `saturated`, `node limit`, ...
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stop::Saturated => "saturated",
            Stop::NodeLimit => "node limit",
            Stop::IterationLimit => "iteration limit",
            Stop::TimeLimit => "time limit",
            Stop::Other(why) => why,
        })
    }
}

/// Rewrites `trace` within `config`'s limits and extracts the cheapest
/// equivalent trace.
///
/// The result validates, has the same outputs in the same order with the
/// same metas, and the same parameters (indices and metas, unused ones
/// kept). Any internal problem, including a panic inside the e-graph
/// library, is returned as an error so the caller can run the trace as it is.
pub fn optimize(trace: &Trace, config: &RewriteConfig) -> Result<Optimized> {
    trace.validate()?;
    match catch_unwind(AssertUnwindSafe(|| optimize_valid(trace, config))) {
        Ok(result) => result,
        Err(panic) => {
            let msg = panic.downcast_ref::<&str>().map(|s| s.to_string());
            let msg = msg.or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
            Err(Error::backend("rewrite_rules", format!("panicked: {msg}")))
        }
    }
}

fn optimize_valid(trace: &Trace, config: &RewriteConfig) -> Result<Optimized> {
    let start = Instant::now();
    let (egraph, classes) = build::to_egraph(trace)?;
    let outputs: Vec<Id> = trace.outputs.iter().map(|&o| classes[o]).collect();
    let cost_before = built_cost(&egraph, &outputs);

    let runner: Runner<TensorNode, TensorAnalysis> = Runner::default()
        .with_egraph(egraph)
        .with_node_limit(config.node_limit)
        .with_iter_limit(config.iter_limit)
        .with_time_limit(config.time_limit)
        .run(config.rule_sets.rules());
    let egraph = &runner.egraph;
    let mut rules_fired = BTreeMap::new();
    for it in &runner.iterations {
        for (name, &n) in &it.applied {
            *rules_fired.entry(name.to_string()).or_insert(0) += n;
        }
    }

    let model = BytesMoved::new(egraph);
    let mut dag = DagExtractor::new(egraph, |n| model.node_cost(n));
    dag.refine(&outputs, REFINE_WORK);
    let extracted = rebuild::to_trace(egraph, trace, &classes, &outputs, |c| dag.choice(c))
        .or_else(|_| {
            // The greedy DAG choice can, rarely, be cyclic; a tree choice never is.
            let tree = Extractor::new(egraph, TreeCost(|n: &TensorNode| model.node_cost(n)));
            rebuild::to_trace(egraph, trace, &classes, &outputs, |c| Some(tree.find_best_node(c)))
        })?;
    check_contract(trace, &extracted)?;
    // Extraction is a heuristic: never hand back something the model says is worse.
    let (trace_out, cost_after) = match trace_cost(&extracted) {
        Some(after) if cost_before.is_none_or(|before| after <= before) => (extracted, Some(after)),
        _ => (trace.clone(), cost_before),
    };

    let origins = origins(egraph, &classes, &trace_out);
    Ok(Optimized {
        origins,
        trace: trace_out,
        report: RewriteReport {
            rules_fired,
            stop_reason: runner.stop_reason.as_ref().map_or(Stop::Saturated, Stop::from),
            iterations: runner.iterations.len().min(config.iter_limit),
            egraph_nodes: egraph.total_number_of_nodes(),
            egraph_classes: egraph.number_of_classes(),
            cost_before: cost_before.unwrap_or(f64::NAN),
            cost_after: cost_after.unwrap_or(f64::NAN),
            time: start.elapsed(),
            budgets_exhausted: dag.budgets_exhausted().to_vec(),
        },
    })
}

/// For each node of `extracted` (built from `egraph`), the nodes of the input
/// trace whose e-class (`classes`) it belongs to.
fn origins(egraph: &TensorGraph, classes: &[Id], extracted: &Trace) -> Vec<Vec<NodeId>> {
    let mut members: std::collections::HashMap<Id, Vec<NodeId>> = std::collections::HashMap::new();
    for (node, &class) in classes.iter().enumerate() {
        members.entry(egraph.find(class)).or_default().push(node);
    }
    let mut built: Vec<Option<Id>> = Vec::with_capacity(extracted.len());
    for node in &extracted.nodes {
        let (kind, attrs) = NodeKind::from_op(&node.op);
        let inputs = node.inputs.iter().map(|&i| built[i]);
        let attrs = attrs.into_iter().map(|a| egraph.lookup(TensorNode::attr(a)));
        let children: Option<smallvec::SmallVec<[Id; 4]>> = inputs.chain(attrs).collect();
        built.push(children.and_then(|children| egraph.lookup(TensorNode { kind, children })));
    }
    built
        .iter()
        .map(|c| c.and_then(|c| members.get(&egraph.find(c)).cloned()).unwrap_or_default())
        .collect()
}

/// The cost of a trace under [`BytesMoved`], each distinct value paid once.
pub fn trace_cost(trace: &Trace) -> Option<f64> {
    let (egraph, classes) = build::to_egraph(trace).ok()?;
    let outputs: Vec<Id> = trace.outputs.iter().map(|&o| classes[o]).collect();
    built_cost(&egraph, &outputs)
}

/// The cost of what `outputs` reach in an e-graph built from a trace and
/// not yet rewritten: each class holds one e-node, so there is nothing to
/// choose and a walk sums it, where an extractor would weigh every class's
/// reach (a third of a rewrite's time, for two costs per flush).
fn built_cost(egraph: &TensorGraph, outputs: &[Id]) -> Option<f64> {
    let model = BytesMoved::new(egraph);
    let mut seen = HashSet::new();
    let mut stack = outputs.to_vec();
    let mut total = 0.0;
    while let Some(c) = stack.pop() {
        let c = egraph.find(c);
        if !seen.insert(c) {
            continue;
        }
        let [node] = egraph[c].nodes.as_slice() else {
            // Congruent nodes merged while building: let the extractor choose.
            return DagExtractor::new(egraph, |n| model.node_cost(n)).total_cost(outputs);
        };
        total += model.node_cost(node);
        stack.extend(node.children().iter().copied());
    }
    Some(total)
}

/// What the engine relies on: a valid trace with the same outputs and parameters.
fn check_contract(before: &Trace, after: &Trace) -> Result<()> {
    let broken =
        |what: &str| Err(Error::backend("rewrite_rules", format!("optimized trace has {what}")));
    after.validate()?;
    let metas = |t: &Trace| t.outputs.iter().map(|&o| t.meta(o).clone()).collect::<Vec<_>>();
    if metas(before) != metas(after) {
        return broken("different output metas");
    }
    let params =
        |t: &Trace| t.parameters().into_iter().map(|p| t.nodes[p].op.clone()).collect::<Vec<_>>();
    if params(before) != params(after) {
        return broken("different parameters");
    }
    Ok(())
}
