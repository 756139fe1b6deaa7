//! Every rule fires on a trace built for it, and the result keeps the contract.

mod common;

use common::rule_traces::trace_for;
use common::*;
use rewrite_rules::{RewriteConfig, RuleSets, Stop};
use trace_ir::{BinaryOp, DType, Op, Trace, UnaryOp};

use BinaryOp::*;
use DType::*;
use UnaryOp::*;

#[test]
fn every_rule_fires_on_its_trace() {
    for set in RuleSets::NAMES {
        for name in RuleSets::rule_names(set) {
            let t = trace_for(&name).unwrap_or_else(|| panic!("no test trace for rule {name}"));
            let out = optimize_checked(&t, &roomy());
            assert!(
                out.report.rules_fired.contains_key(&name),
                "{name} did not fire: {:?}",
                out.report
            );
            assert!(out.report.cost_after <= out.report.cost_before, "{name}: {:?}", out.report);
        }
    }
}

#[test]
fn every_rule_set_has_rules_and_unknown_names_are_errors() {
    for set in RuleSets::NAMES {
        assert!(!RuleSets::rule_names(set).is_empty(), "{set}");
    }
    let err = RuleSets::default().set("fusion", false).unwrap_err().to_string();
    assert!(err.contains("fusion") && err.contains("algebraic"), "{err}");
    assert_eq!(RuleSets::none().rules().len(), 0);
}

/// Fused ops of an optimized trace, and what must be gone.
fn lifted(t: &Trace) -> Trace {
    optimize_checked(t, &roomy()).trace
}

#[test]
fn engine_softmax_becomes_one_softmax() {
    let mut b = B::default();
    let x = b.param(&[4, 8], F32);
    let y = b.softmax(x, 1);
    let out = lifted(&b.done(&[y]));
    assert_eq!(count(&out, |op| matches!(op, Op::Softmax { axis: 1 })), 1);
    assert_eq!(count(&out, |op| is_unary(op, Exp) || matches!(op, Op::Reduce { .. })), 0);
}

#[test]
fn engine_log_softmax_becomes_one_log_softmax() {
    let mut b = B::default();
    let x = b.param(&[4, 8], BF16);
    let y = b.log_softmax(x, 0);
    let out = lifted(&b.done(&[y]));
    assert_eq!(count(&out, |op| matches!(op, Op::LogSoftmax { axis: 0 })), 1);
    assert_eq!(count(&out, |op| is_unary(op, Exp) || is_unary(op, Log)), 0);
}

#[test]
fn engine_layer_norm_with_affine_keeps_the_affine_ops() {
    let mut b = B::default();
    let x = b.param(&[2, 5, 8], F32);
    let (w, bias) = (b.param(&[8], F32), b.param(&[8], F32));
    let n = b.layer_norm(x, &[1, 2]);
    let y = b.bin(Mul, n, w);
    let y = b.bin(Add, y, bias);
    let out = lifted(&b.done(&[y]));
    assert_eq!(
        count(&out, |op| matches!(op, Op::LayerNorm { axes } if axes.as_slice() == [1, 2])),
        1
    );
    assert_eq!(count(&out, |op| matches!(op, Op::Reduce { .. }) || is_unary(op, Rsqrt)), 0);
    assert_eq!(count(&out, |op| matches!(op, Op::Binary { .. })), 2);
}

#[test]
fn engine_rms_norm_becomes_one_rms_norm() {
    let mut b = B::default();
    let x = b.param(&[3, 16], F16);
    let y = b.rms_norm(x, &[1]);
    let out = lifted(&b.done(&[y]));
    assert_eq!(count(&out, |op| matches!(op, Op::RmsNorm { .. })), 1);
    assert_eq!(count(&out, |op| is_unary(op, Rsqrt) || matches!(op, Op::Reduce { .. })), 0);
}

#[test]
fn hand_written_gelu_becomes_gelu_tanh_in_bf16_too() {
    for dtype in [F32, BF16] {
        let mut b = B::default();
        let x = b.param(&[2, 7], dtype);
        let y = b.gelu_tanh_by_hand(x);
        let out = lifted(&b.done(&[y]));
        assert_eq!(count(&out, |op| is_unary(op, GeluTanh)), 1, "{dtype}");
        assert_eq!(
            count(&out, |op| is_unary(op, Tanh) || matches!(op, Op::Binary { .. })),
            0,
            "{dtype}"
        );
    }
}

#[test]
fn gelu_with_a_wrong_constant_is_left_alone() {
    let mut b = B::default();
    let x = b.param(&[2, 7], F32);
    let y = b.gelu_tanh_by_hand(x);
    let mut t = b.done(&[y]);
    // Replace 0.044715 by 0.05.
    for n in &mut t.nodes {
        if let Op::Full { value, .. } = &mut n.op {
            if *value == 0.044715 {
                *value = 0.05;
            }
        }
    }
    let out = lifted(&t);
    assert_eq!(count(&out, |op| is_unary(op, GeluTanh)), 0);
}

#[test]
fn shapes_that_broadcast_block_identities() {
    // x * 1 where the 1 is larger than x: the product is not x.
    let mut b = B::default();
    let x = b.param(&[4], F32);
    let ones = b.full(1.0, &[2, 4], F32);
    let y = b.bin(Mul, x, ones);
    let out = optimize_checked(&b.done(&[y]), &roomy());
    assert!(!out.report.rules_fired.contains_key("mul-one"));
    assert_eq!(out.trace.meta(out.trace.outputs[0]).shape.as_slice(), &[2, 4]);
}

#[test]
fn inexact_identities_are_not_applied() {
    let mut b = B::default();
    let x = b.param(&[4], F32);
    let zero = b.full(0.0, &[], F32);
    let plus = b.bin(Add, x, zero); // -0.0 + 0.0 is +0.0: not x
    let times = b.bin(Mul, x, zero); // NaN * 0 is NaN: not 0
    let minus = b.bin(Sub, x, x); // inf - inf is NaN: not 0
    let out = optimize_checked(&b.done(&[plus, times, minus]), &roomy());
    assert!(
        out.trace.outputs.iter().all(|&o| !out.trace.nodes[o].op.is_source()),
        "{:?}",
        out.trace
    );
    // Integers have no -0.0: there x + 0 is x.
    let mut b = B::default();
    let x = b.param(&[4], I32);
    let zero = b.full(0.0, &[], I32);
    let y = b.bin(Add, zero, x);
    let out = optimize_checked(&b.done(&[y]), &roomy());
    assert_eq!(out.trace.outputs, vec![0]);
}

#[test]
fn folding_rounds_like_the_kernels() {
    let mut b = B::default();
    let (a, c) = (b.full(0.1, &[], F32), b.full(0.2, &[], F32));
    let y = b.bin(Add, a, c);
    let (a16, c16) = (b.full(1.0, &[3], BF16), b.full(1.0 / 512.0, &[2, 1], BF16));
    let y16 = b.bin(Add, a16, c16);
    let out = optimize_checked(&b.done(&[y, y16]), &roomy());
    let value = |i: usize| match &out.trace.nodes[out.trace.outputs[i]].op {
        Op::Full { value, shape, .. } => (*value, shape.to_vec()),
        other => panic!("not folded: {other:?}"),
    };
    assert_eq!(value(0), ((0.1f32 + 0.2f32) as f64, vec![]));
    assert_eq!(value(1), (1.0, vec![2, 3])); // 1 + 2^-9 rounds to 1 in bf16
}

#[test]
fn parameters_are_never_folded_and_unused_ones_are_kept() {
    let mut b = B::default();
    let _unused = b.param(&[5], I64);
    let s = b.scalar(F32);
    let two = b.full(2.0, &[], F32);
    let y = b.bin(Mul, s, two);
    let out = optimize_checked(&b.done(&[y]), &roomy());
    assert_eq!(out.trace.num_parameters(), 2);
    assert!(matches!(out.trace.nodes[out.trace.outputs[0]].op, Op::Binary { kind: Mul }));
}

#[test]
fn common_subexpressions_merge_and_outputs_keep_their_order() {
    let mut b = B::default();
    let x = b.param(&[3], F32);
    let e1 = b.un(Exp, x);
    let e2 = b.un(Exp, x);
    let s = b.bin(Add, e1, e2);
    let out = optimize_checked(&b.done(&[s, e2, x, e1]), &roomy());
    assert_eq!(count(&out.trace, |op| is_unary(op, Exp)), 1);
    let o = &out.trace.outputs;
    assert_eq!((o[1], o[2], o[3]), (o[3], 0, o[1]));
}

#[test]
fn with_every_set_off_the_trace_is_unchanged() {
    let mut b = B::default();
    let x = b.param(&[2, 3], F32);
    let y = b.softmax(x, 1);
    let t = b.done(&[y]);
    let config = RewriteConfig { rule_sets: RuleSets::none(), ..roomy() };
    let out = optimize_checked(&t, &config);
    assert_eq!(out.trace, t);
    assert!(out.report.rules_fired.is_empty());
    assert_eq!(out.report.stop_reason, Stop::Saturated);
}

#[test]
fn limits_are_reported() {
    // A chain where every round finds more to do.
    let mut b = B::default();
    let x = b.param(&[2, 3], F32);
    let mut y = x;
    for _ in 0..6 {
        y = b.un(Neg, y);
    }
    let z = b.softmax(y, 1);
    let t = b.done(&[z]);

    let out = optimize_checked(&t, &roomy());
    assert_eq!(out.report.stop_reason, Stop::Saturated);
    assert!(out.report.iterations > 1);

    let out = optimize_checked(&t, &RewriteConfig { iter_limit: 1, ..roomy() });
    assert_eq!(out.report.stop_reason, Stop::IterationLimit);
    assert_eq!(out.report.iterations, 1);

    let out = optimize_checked(&t, &RewriteConfig { node_limit: 10, ..roomy() });
    assert_eq!(out.report.stop_reason, Stop::NodeLimit);

    let out =
        optimize_checked(&t, &RewriteConfig { time_limit: std::time::Duration::ZERO, ..roomy() });
    assert_eq!(out.report.stop_reason, Stop::TimeLimit);
}

#[test]
fn invalid_input_is_an_error_not_a_panic() {
    let mut b = B::default();
    let x = b.param(&[2], F32);
    let mut t = b.done(&[x]);
    t.nodes[0].meta.shape = [3].into_iter().collect();
    assert!(rewrite_rules::optimize(&t, &roomy()).is_err());
}

#[test]
fn trivial_traces() {
    let empty = trace_ir::Trace::new();
    assert_eq!(optimize_checked(&empty, &roomy()).trace, empty);
    let mut b = B::default();
    let x = b.param(&[0, 3], BF16);
    let _ = b.un(Exp, x);
    let no_outputs = b.done(&[]);
    let out = optimize_checked(&no_outputs, &roomy());
    assert_eq!(out.trace.len(), 1);
}
