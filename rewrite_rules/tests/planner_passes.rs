//! The planner's passes one at a time: what each switch in `PlanConfig`
//! changes in the program, that each switch off alone still plans every
//! random trace, and that a budget that stops a pass is recorded.
//!
//! These are structural checks: this crate cannot run programs. That each
//! switch off alone still computes what the op-by-op reference computes is
//! checked by running the programs, in `engine/tests/planner_passes.rs`.

mod common;

use common::B;
use proptest::prelude::*;
use rewrite_rules::planner::{plan, PlanConfig};
use rewrite_rules::program::{BudgetExhausted, CutReason, KernelKind, Program};
use trace_ir::{BinaryOp, DType, Op, Trace, UnaryOp};

fn planned(t: &Trace, config: &PlanConfig) -> Program {
    plan(t, config).unwrap_or_else(|e| panic!("plan: {e}"))
}

fn has_cut(p: &Program, reason: CutReason) -> bool {
    p.cuts.iter().any(|c| c.reason == reason)
}

/// Whether a node computes something (as opposed to a view, a literal or a
/// broadcast, which any kernel may read or repeat for free).
fn computes(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary { .. }
            | Op::Binary { .. }
            | Op::Where
            | Op::Cast { .. }
            | Op::Reduce { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::MatMul
    )
}

/// `sin(x)`, `cos(x)` and `tanh(x)`: three loops reading one input, which
/// horizontal merging makes one.
fn siblings() -> Trace {
    let mut b = B::default();
    let x = b.param(&[64, 32], DType::F32);
    let outs: Vec<_> = [UnaryOp::Sin, UnaryOp::Cos, UnaryOp::Tanh].map(|k| b.un(k, x)).into();
    b.done(&outs)
}

#[test]
fn every_switch_is_on_by_default() {
    let c = PlanConfig::default();
    assert!(c.recompute && c.split && c.merge && c.epilogues);
    assert_eq!(c.merge_budget, None);
}

#[test]
fn recompute_off_realizes_a_shared_node() {
    // e = exp(x) feeds two outputs; without merging, two kernels need it.
    let mut b = B::default();
    let x = b.param(&[16, 8], DType::F32);
    let e = b.un(UnaryOp::Exp, x);
    let s = b.un(UnaryOp::Sin, e);
    let c = b.un(UnaryOp::Cos, e);
    let t = b.done(&[s, c]);
    let base = PlanConfig { merge: false, ..PlanConfig::default() };
    let on = planned(&t, &base);
    assert_eq!(on.kernels_of(e).len(), 2, "cheap: recomputed in both");
    assert!(!has_cut(&on, CutReason::SecondConsumer));
    let off = planned(&t, &PlanConfig { recompute: false, ..base });
    assert_eq!(off.kernels_of(e).len(), 1, "computed once");
    assert_eq!(off.why_cut(e, s), Some(&CutReason::SecondConsumer));
    assert_eq!(off.kernels.len(), 3);
}

#[test]
fn merge_off_keeps_one_kernel_per_root() {
    let t = siblings();
    assert_eq!(planned(&t, &PlanConfig::default()).kernels.len(), 1);
    let off = planned(&t, &PlanConfig { merge: false, ..PlanConfig::default() });
    assert_eq!(off.kernels.len(), 3);
    assert!(off.kernels.iter().all(|k| k.outputs.len() == 1));
}

#[test]
fn split_off_keeps_a_long_chain_whole() {
    let mut b = B::default();
    let x = b.param(&[100], DType::F32);
    let mut v = x;
    for i in 0..40 {
        v = b.un(if i % 2 == 0 { UnaryOp::Sin } else { UnaryOp::Tanh }, v);
    }
    let t = b.done(&[v]);
    let small = PlanConfig { max_kernel_ops: 16, ..PlanConfig::default() };
    let on = planned(&t, &small);
    assert!(on.kernels.len() >= 3, "{} kernels", on.kernels.len());
    assert!(has_cut(&on, CutReason::Limit));
    let off = planned(&t, &PlanConfig { split: false, ..small });
    assert_eq!(off.kernels.len(), 1);
    assert!(!has_cut(&off, CutReason::Limit));
}

/// The arithmetic a loop kernel runs (its loads and literals excluded).
fn loop_ops(p: &Program) -> Vec<usize> {
    use rewrite_rules::program::Instr;
    p.kernels
        .iter()
        .filter_map(|k| match &k.kind {
            KernelKind::Loop(l) => Some(
                l.instrs
                    .iter()
                    .filter(|i| !matches!(i, Instr::Load { .. } | Instr::Literal { .. }))
                    .count(),
            ),
            _ => None,
        })
        .collect()
}

#[test]
fn split_cuts_long_chains_and_shared_dags_into_kernels_under_the_limit() {
    // A plain chain of 3,000 ops, and a DAG whose every op reads the two
    // before it (closures overlap, so counting each input's closure apart
    // would count shared ops twice).
    let chain = {
        let mut b = B::default();
        let mut v = b.param(&[64], DType::F32);
        for i in 0..3000 {
            v = b.un(if i % 2 == 0 { UnaryOp::Sin } else { UnaryOp::Tanh }, v);
        }
        b.done(&[v])
    };
    let shared = {
        let mut b = B::default();
        let (mut u, mut v) = (b.param(&[64], DType::F32), b.param(&[64], DType::F32));
        for _ in 0..200 {
            (u, v) = (v, b.bin(BinaryOp::Add, u, v));
        }
        b.done(&[v])
    };
    for (name, t, ops) in [("chain", &chain, 3000), ("shared", &shared, 200)] {
        let limit = 64;
        let p = planned(t, &PlanConfig { max_kernel_ops: limit, ..PlanConfig::default() });
        let sizes = loop_ops(&p);
        assert!(sizes.iter().all(|&n| n <= limit), "{name}: kernels of {sizes:?} ops");
        assert_eq!(sizes.iter().sum::<usize>(), ops, "{name}: every op runs once");
        // Cuts near the middle leave at most one kernel (a chain's last)
        // under a quarter of the limit.
        let small = sizes.iter().filter(|&&n| n < limit / 4).count();
        assert!(small <= 1, "{name}: kernels of {sizes:?} ops");
    }
}

#[test]
fn epilogues_off_stores_the_product() {
    // gelu-free linear: x @ w + bias, then relu.
    let mut b = B::default();
    let x = b.param(&[8, 16], DType::F32);
    let w = b.param(&[16, 4], DType::F32);
    let bias = b.param(&[4], DType::F32);
    let h = b.op(Op::MatMul, &[x, w]);
    let hb = b.bin(BinaryOp::Add, h, bias);
    let y = b.un(UnaryOp::Relu, hb);
    let t = b.done(&[y]);
    let on = planned(&t, &PlanConfig::default());
    assert_eq!(on.kernels.len(), 1);
    assert!(matches!(&on.kernels[0].kind, KernelKind::MatMul(m) if m.epilogue.is_some()));
    let off = planned(&t, &PlanConfig { epilogues: false, ..PlanConfig::default() });
    assert_eq!(off.kernels.len(), 2);
    assert!(matches!(&off.kernels[0].kind, KernelKind::MatMul(m) if m.epilogue.is_none()));
    assert_eq!(off.why_cut(h, hb), Some(&CutReason::MatMulBoundary));
}

#[test]
fn a_tiny_merge_budget_is_recorded() {
    let t = siblings();
    // Two merges are needed; a budget of one step stops after the first.
    let p = planned(&t, &PlanConfig { merge_budget: Some(1), ..PlanConfig::default() });
    assert_eq!(p.kernels.len(), 2);
    assert_eq!(p.budgets_exhausted, vec![BudgetExhausted { pass: "merge".into(), budget: 1 }]);
    assert_eq!(p.budgets_exhausted[0].to_string(), "merge: budget of 1 steps exhausted");
    // Recorded in the serialized form, and read back.
    let json = p.to_json();
    assert!(json.contains("budgets_exhausted"), "{json}");
    assert_eq!(Program::from_json(&json).unwrap(), p);
    // The default budget finishes: nothing recorded, nothing serialized.
    let done = planned(&t, &PlanConfig::default());
    assert!(done.budgets_exhausted.is_empty());
    assert!(!done.to_json().contains("budgets_exhausted"));
    // A budget that was enough is not recorded, however small.
    let mut b = B::default();
    let x = b.param(&[8], DType::F32);
    let y = b.un(UnaryOp::Exp, x);
    let one = planned(&b.done(&[y]), &PlanConfig { merge_budget: Some(1), ..Default::default() });
    assert!(one.budgets_exhausted.is_empty());
}

#[test]
fn programs_without_the_budget_record_still_read() {
    // What a build that predates the field wrote (the same format version).
    let p = planned(&siblings(), &PlanConfig::default());
    let mut value: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
    value.as_object_mut().unwrap().remove("budgets_exhausted");
    let back = Program::from_json(&value.to_string()).unwrap();
    assert!(back.budgets_exhausted.is_empty());
    assert_eq!(back.fingerprint(), p.fingerprint());
}

/// What a switch off promises about a plan of a trace.
type Promise = fn(&Trace, &Program) -> Result<(), String>;

/// Each switch off alone, and the invariant it promises.
fn switches() -> Vec<(&'static str, PlanConfig, Promise)> {
    let d = PlanConfig::default;
    vec![
        ("recompute", PlanConfig { recompute: false, ..d() }, |t, p| {
            // Nothing that computes runs in two kernels.
            for (n, node) in t.nodes.iter().enumerate() {
                if computes(&node.op) && p.kernels_of(n).len() > 1 {
                    return Err(format!("node {n} ({}) in {:?}", node.op.name(), p.kernels_of(n)));
                }
            }
            Ok(())
        }),
        ("merge", PlanConfig { merge: false, ..d() }, |_, p| {
            match p.kernels.iter().position(|k| k.outputs.len() != 1) {
                Some(k) => Err(format!("{} has several outputs", p.describe_kernel(k))),
                None => Ok(()),
            }
        }),
        ("split", PlanConfig { split: false, max_kernel_ops: 3, ..d() }, |_, p| {
            match p.cuts.iter().find(|c| c.reason == CutReason::Limit) {
                Some(c) => Err(format!("limit cut {c:?}")),
                None => Ok(()),
            }
        }),
        ("epilogues", PlanConfig { epilogues: false, ..d() }, |_, p| {
            let with = |k: &rewrite_rules::program::Kernel| matches!(&k.kind, KernelKind::MatMul(m) if m.epilogue.is_some());
            match p.kernels.iter().position(with) {
                Some(k) => Err(format!("{} has an epilogue", p.describe_kernel(k))),
                None => Ok(()),
            }
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x9a55),
        ..ProptestConfig::default()
    })]

    /// Every switch off alone plans every random trace (the engine's
    /// generator, the same traces the differential tests run), keeps its
    /// promise, stores each output once and records no budget.
    #[test]
    fn each_switch_off_alone_plans_random_traces(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let t = trace_ir::generate::random_trace(&mut trace_ir::generate::Bytes::new(&bytes), 16).trace;
        let default = plan(&t, &PlanConfig::default()).map_err(|e| TestCaseError::fail(format!("default: {e}")))?;
        for (name, config, promise) in switches() {
            let p = plan(&t, &config).map_err(|e| TestCaseError::fail(format!("{name} off: {e}")))?;
            promise(&t, &p).map_err(|e| TestCaseError::fail(format!("{name} off: {e}\n{}", t.to_json())))?;
            // (Other switches may realize a node that then lets two loops
            // merge, so only merging off promises no fewer kernels.)
            if name == "merge" {
                prop_assert!(p.kernels.len() >= default.kernels.len(), "{} off: {} kernels, default {}", name, p.kernels.len(), default.kernels.len());
            }
            for &o in &p.outputs {
                let stored = p.kernels.iter().filter(|k| k.outputs.contains(&o)).count();
                prop_assert!(stored == 1 || p.params.contains(&o), "{} off: output {} stored {} times", name, o, stored);
            }
            prop_assert!(p.budgets_exhausted.is_empty(), "{} off: {:?}", name, p.budgets_exhausted);
        }
    }
}
