//! Random valid traces: `optimize` never fails or panics, and keeps its contract.

mod common;

use common::*;
use proptest::prelude::*;
use rewrite_rules::RewriteConfig;
use trace_ir::{
    ArgReduceOp, Axes, BinaryOp, DType, Distribution, NodeId, Op, ReduceOp, Shape, UnaryOp,
};

const SHAPES: [&[usize]; 7] = [&[2, 3], &[3], &[1, 3], &[], &[2, 1], &[2, 0], &[2, 2, 3]];
const VALUES: [f64; 10] = [0.0, -0.0, 1.0, 0.5, 2.0, 3.0, -1.5, f64::NAN, f64::INFINITY, 0.044715];
const REDUCES: [ReduceOp; 5] =
    [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];

/// One step: an op code and three numbers that pick operands and attributes.
type Step = (u8, u16, u16, u16);

fn pick<T: Copy>(items: &[T], s: u16) -> T {
    items[s as usize % items.len()]
}

/// Appends the op `step` describes, if it applies to the operands it picks.
fn apply(b: &mut B, (code, s1, s2, s3): Step) {
    let n = b.t.len();
    let (a, c) = (s1 as usize % n, s2 as usize % n);
    let ma = b.t.meta(a).clone();
    let rank = ma.shape.len();
    let float = ma.dtype.is_float();
    let axes: Axes = (0..rank).filter(|i| s3 >> i & 1 == 1).collect();
    let push = |b: &mut B, op: Op, inputs: &[NodeId]| {
        let _ = b.t.push(op, inputs);
    };
    match code % 23 {
        0 => push(b, Op::Unary { kind: pick(&UnaryOp::ALL, s3) }, &[a]),
        1 => push(b, Op::Binary { kind: pick(&BinaryOp::ALL, s3) }, &[a, c]),
        2 => push(
            b,
            Op::Full { value: pick(&VALUES, s3), shape: pick(&SHAPES, s2).into(), dtype: ma.dtype },
            &[],
        ),
        3 => push(b, Op::Cast { to: pick(&DType::ALL, s3) }, &[a]),
        4 => push(b, Op::Reduce { kind: pick(&REDUCES, s2), axes, keepdim: s3 & 64 != 0 }, &[a]),
        5 => {
            let axis = s3 as usize % rank.max(1);
            push(b, Op::ArgReduce { kind: ArgReduceOp::Argmax, axis, keepdim: false }, &[a]);
        }
        6 => {
            let mut shape: Shape = ma.shape.iter().map(|&d| if d == 1 { 4 } else { d }).collect();
            shape.insert(0, 2);
            push(b, Op::Expand { shape }, &[a]);
        }
        7 => {
            let shape: &[usize] = if s3 % 2 == 0 { &[ma.numel()] } else { &[1, ma.numel()] };
            push(b, Op::Reshape { shape: shape.into() }, &[a]);
        }
        8 => push(b, Op::Permute { perm: (0..rank).rev().collect() }, &[a]),
        9 => {
            let axis = s3 as usize % rank.max(1);
            let stop = ma.shape.get(axis).copied().unwrap_or(0);
            push(b, Op::Slice { axis, start: 0, stop, step: 1 + s2 as usize % 2 }, &[a]);
        }
        10 => push(b, Op::Concat { axis: 0 }, &[a, c]),
        11 => push(b, Op::MatMul, &[a, c]),
        12 => {
            if let Ok(cond) = b.t.push(Op::Binary { kind: BinaryOp::Gt }, &[a, c]) {
                push(b, Op::Where, &[cond, a, c]);
            }
        }
        // (Their max over an empty axis is refused at the op, as in PyTorch.)
        13 if float && rank > 0 && ma.shape[s3 as usize % rank] > 0 => {
            b.softmax(a, s3 as usize % rank);
        }
        14 if float && !axes.is_empty() => {
            b.layer_norm(a, &axes);
        }
        15 if float && !axes.is_empty() => {
            b.rms_norm(a, &axes);
        }
        16 if float => {
            b.gelu_tanh_by_hand(a);
        }
        17 if float => {
            let s = b.un(UnaryOp::Sigmoid, a);
            b.bin(BinaryOp::Mul, a, s);
        }
        18 if float && rank > 0 && ma.shape[s3 as usize % rank] > 0 => {
            b.log_softmax(a, s3 as usize % rank);
        }
        19 => push(
            b,
            Op::Arange {
                start: pick(&VALUES, s2),
                step: 0.5,
                len: s3 as usize % 4,
                dtype: ma.dtype,
            },
            &[],
        ),
        20 => {
            let dist = if s3 % 2 == 0 { Distribution::Uniform } else { Distribution::Normal };
            push(
                b,
                Op::Random {
                    seed: s2 as u64,
                    dist,
                    shape: pick(&SHAPES, s3).into(),
                    dtype: ma.dtype,
                },
                &[],
            );
        }
        21 => {
            if let Ok(x) = b.t.push(Op::Unary { kind: UnaryOp::Neg }, &[a]) {
                push(b, Op::Unary { kind: UnaryOp::Neg }, &[x]);
            }
        }
        _ => {
            let id = b.full(pick(&VALUES, s2), pick(&SHAPES, s3), ma.dtype);
            let kind = pick(&[BinaryOp::Mul, BinaryOp::Add, BinaryOp::Sub, BinaryOp::Div], s1);
            push(b, Op::Binary { kind }, &[a, id]);
        }
    }
}

fn trace_strategy() -> impl Strategy<Value = trace_ir::Trace> {
    let params = prop::collection::vec((0..SHAPES.len(), 0..DType::ALL.len()), 1..4);
    let steps = prop::collection::vec(any::<Step>(), 1..30);
    let outputs = prop::collection::vec(any::<u16>(), 0..4);
    (params, steps, outputs).prop_map(|(params, steps, outputs)| {
        let mut b = B::default();
        for (s, d) in params {
            b.param(SHAPES[s], DType::ALL[d]);
        }
        for step in steps {
            apply(&mut b, step);
        }
        let n = b.t.len();
        let mut outs: Vec<NodeId> = outputs.iter().map(|&o| o as usize % n).collect();
        outs.push(n - 1);
        b.done(&outs)
    })
}

proptest! {
    // 256 cases unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn optimize_keeps_the_contract(t in trace_strategy()) {
        prop_assert!(t.validate().is_ok());
        let out = optimize_checked(&t, &RewriteConfig::default());
        prop_assert!(out.report.cost_after <= out.report.cost_before + 1e-6,
            "cost went up: {:?}", out.report);
    }

    /// The project's shared generator (`trace_ir::generate`), which the fuzz
    /// targets use too, so a failure here replays there.
    #[test]
    fn shared_generator_traces_keep_the_contract(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let generated = trace_ir::generate::random_trace(&mut trace_ir::generate::Bytes::new(&bytes), 40);
        optimize_checked(&generated.trace, &RewriteConfig::default());
    }

    #[test]
    fn tight_limits_keep_the_contract(t in trace_strategy(), nodes in 1usize..200, iters in 1usize..4) {
        let config = RewriteConfig { node_limit: nodes, iter_limit: iters, ..RewriteConfig::default() };
        optimize_checked(&t, &config);
    }
}
