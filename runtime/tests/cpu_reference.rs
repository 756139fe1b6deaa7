//! The CPU reference backend against values computed by hand.

use std::sync::Arc;

use half::bf16;
use rewrite_rules::program::Program;
use runtime::{Backend, CpuBackend, HostData, MemoryTracker};
use trace_ir::shape::shape;
use trace_ir::{
    ArgReduceOp, BinaryOp, DType, Distribution, Meta, NodeId, Op, ReduceOp, Result, Trace, UnaryOp,
};

fn ax(a: &[usize]) -> trace_ir::Axes {
    a.into()
}

fn meta(dims: &[usize], dtype: DType) -> Meta {
    Meta::new(shape(dims), dtype)
}

fn backend() -> CpuBackend {
    CpuBackend::new(MemoryTracker::new())
}

/// Compiles and runs `trace` on host inputs, returning host outputs.
fn run(trace: &Trace, inputs: Vec<HostData>) -> Result<Vec<HostData>> {
    let be = backend();
    let exe = be.compile(&Program::unfused(trace))?;
    let params = trace.parameters();
    let bufs = inputs
        .into_iter()
        .zip(params)
        .map(|(d, p)| be.upload(trace.meta(p).clone(), d))
        .collect::<Result<Vec<_>>>()?;
    let outs = exe.run(bufs)?;
    outs.iter().map(|b| be.download(b)).collect()
}

fn run1(trace: &Trace, inputs: Vec<HostData>) -> HostData {
    run(trace, inputs).unwrap().remove(0)
}

fn f32s(d: &HostData) -> Vec<f32> {
    match d {
        HostData::F32(v) => v.clone(),
        other => panic!("expected f32, got {:?}", other.dtype()),
    }
}

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

/// Deterministic pseudo-random data in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn unary_trace(input: Meta, op: Op) -> Trace {
    let mut t = Trace::new();
    let x = t.push_parameter(input);
    let y = t.push(op, &[x]).unwrap();
    t.outputs = vec![y];
    t
}

fn binary_trace(a: Meta, b: Meta, kind: BinaryOp) -> Trace {
    let mut t = Trace::new();
    let x = t.push_parameter(a);
    let y = t.push_parameter(b);
    let z = t.push(Op::Binary { kind }, &[x, y]).unwrap();
    t.outputs = vec![z];
    t
}

fn assert_same_f32(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "element {i}: got {g}, want {w}"
        );
    }
}

#[test]
fn broadcasting_add() {
    let t = binary_trace(meta(&[2, 1, 3], DType::F32), meta(&[4, 1], DType::F32), BinaryOp::Add);
    assert_eq!(t.meta(2).shape.as_slice(), &[2, 4, 3]);
    let b = vec![10.0, 20.0, 30.0, 40.0];
    let out = f32s(&run1(&t, vec![HostData::F32(iota(6)), HostData::F32(b.clone())]));
    let mut want = Vec::new();
    for i in 0..2 {
        for bj in &b {
            for k in 0..3 {
                want.push((i * 3 + k) as f32 + bj);
            }
        }
    }
    assert_eq!(out, want);
}

#[test]
fn scalar_and_large_broadcast_match_naive() {
    // Above the parallel threshold, with a strided operand and a 0-d one.
    let (m, n) = (700, 300);
    let a = noise(m * n, 1);
    let b = noise(n, 2);
    let t = binary_trace(meta(&[m, n], DType::F32), meta(&[n], DType::F32), BinaryOp::Mul);
    let out = f32s(&run1(&t, vec![HostData::F32(a.clone()), HostData::F32(b.clone())]));
    let want: Vec<f32> = (0..m * n).map(|i| a[i] * b[i % n]).collect();
    assert_eq!(out, want);

    let t = binary_trace(meta(&[m, 1], DType::F32), meta(&[1, n], DType::F32), BinaryOp::Sub);
    let (x, y) = (noise(m, 3), noise(n, 4));
    let out = f32s(&run1(&t, vec![HostData::F32(x.clone()), HostData::F32(y.clone())]));
    let want: Vec<f32> = (0..m * n).map(|i| x[i / n] - y[i % n]).collect();
    assert_eq!(out, want);

    let t = binary_trace(meta(&[], DType::F32), meta(&[3], DType::F32), BinaryOp::Sub);
    let out = f32s(&run1(&t, vec![HostData::F32(vec![10.0]), HostData::F32(vec![1.0, 2.0, 3.0])]));
    assert_eq!(out, vec![9.0, 8.0, 7.0]);
}

#[test]
fn pow_on_integers_wraps_and_handles_negative_exponents() {
    let base = vec![2, 3, -2, 5, 1, -1, -1, 0, 2, 7];
    let exp = vec![10, 3, 3, 0, -5, -3, -4, -1, 40, -2];
    let t = binary_trace(meta(&[10], DType::I32), meta(&[10], DType::I32), BinaryOp::Pow);
    let out = run1(&t, vec![HostData::I32(base), HostData::I32(exp)]);
    assert_eq!(out, HostData::I32(vec![1024, 27, -8, 1, 1, -1, 1, 0, 0, 0]));

    let t = binary_trace(meta(&[3], DType::I64), meta(&[3], DType::I64), BinaryOp::Pow);
    let out = run1(&t, vec![HostData::I64(vec![3, 2, -3]), HostData::I64(vec![40, 62, 41])]);
    assert_eq!(out, HostData::I64(vec![3i64.wrapping_pow(40), 1 << 62, (-3i64).wrapping_pow(41)]));
}

#[test]
fn maximum_minimum_propagate_nan() {
    let nan = f32::NAN;
    let a = vec![1.0, nan, 3.0, -0.5];
    let b = vec![2.0, 0.0, nan, -1.5];
    let t = binary_trace(meta(&[4], DType::F32), meta(&[4], DType::F32), BinaryOp::Maximum);
    assert_same_f32(
        &f32s(&run1(&t, vec![HostData::F32(a.clone()), HostData::F32(b.clone())])),
        &[2.0, nan, nan, -0.5],
    );
    let t = binary_trace(meta(&[4], DType::F32), meta(&[4], DType::F32), BinaryOp::Minimum);
    assert_same_f32(
        &f32s(&run1(&t, vec![HostData::F32(a.clone()), HostData::F32(b)])),
        &[1.0, nan, nan, -1.5],
    );

    let t = unary_trace(
        meta(&[4], DType::F32),
        Op::Reduce { kind: ReduceOp::Max, axes: ax(&[0]), keepdim: false },
    );
    assert!(f32s(&run1(&t, vec![HostData::F32(a.clone())]))[0].is_nan());
    let t = unary_trace(meta(&[4], DType::F32), Op::Unary { kind: UnaryOp::Relu });
    assert_same_f32(&f32s(&run1(&t, vec![HostData::F32(a)])), &[1.0, nan, 3.0, 0.0]);
}

#[test]
fn comparisons_and_logic() {
    let nan = f32::NAN;
    let t = binary_trace(meta(&[4], DType::F32), meta(&[], DType::F32), BinaryOp::Le);
    let out = run1(&t, vec![HostData::F32(vec![1.0, 2.0, 3.0, nan]), HostData::F32(vec![2.0])]);
    assert_eq!(out, HostData::Bool(vec![true, true, false, false]));
    let t = binary_trace(meta(&[3], DType::I64), meta(&[3], DType::I64), BinaryOp::Ne);
    let out = run1(&t, vec![HostData::I64(vec![1, 2, 3]), HostData::I64(vec![1, 0, 3])]);
    assert_eq!(out, HostData::Bool(vec![false, true, false]));
    let t = binary_trace(meta(&[4], DType::Bool), meta(&[4], DType::Bool), BinaryOp::LogicalAnd);
    let (p, q) = (vec![true, true, false, false], vec![true, false, true, false]);
    let out = run1(&t, vec![HostData::Bool(p.clone()), HostData::Bool(q.clone())]);
    assert_eq!(out, HostData::Bool(vec![true, false, false, false]));
    let t = binary_trace(meta(&[4], DType::Bool), meta(&[4], DType::Bool), BinaryOp::Lt);
    let out = run1(&t, vec![HostData::Bool(p), HostData::Bool(q)]);
    assert_eq!(out, HostData::Bool(vec![false, false, true, false]));
}

#[test]
fn where_broadcasts_three_ways() {
    let mut t = Trace::new();
    let c = t.push_parameter(meta(&[2, 1], DType::Bool));
    let a = t.push_parameter(meta(&[3], DType::I32));
    let b = t.push_parameter(meta(&[], DType::I32));
    let w = t.push(Op::Where, &[c, a, b]).unwrap();
    t.outputs = vec![w];
    let out = run1(
        &t,
        vec![
            HostData::Bool(vec![true, false]),
            HostData::I32(vec![1, 2, 3]),
            HostData::I32(vec![-7]),
        ],
    );
    assert_eq!(out, HostData::I32(vec![1, 2, 3, -7, -7, -7]));
}

#[test]
fn sum_over_axes_with_and_without_keepdim() {
    for keepdim in [false, true] {
        let op = Op::Reduce { kind: ReduceOp::Sum, axes: ax(&[0, 2]), keepdim };
        let t = unary_trace(meta(&[2, 3, 4], DType::F32), op);
        let want_shape: &[usize] = if keepdim { &[1, 3, 1] } else { &[3] };
        assert_eq!(t.meta(1).shape.as_slice(), want_shape);
        let out = f32s(&run1(&t, vec![HostData::F32(iota(24))]));
        assert_eq!(out, vec![60.0, 92.0, 124.0]);
    }
    // Integer sums wrap; an empty axis list is a copy.
    let t = unary_trace(
        meta(&[2, 2], DType::I32),
        Op::Reduce { kind: ReduceOp::Sum, axes: ax(&[1]), keepdim: false },
    );
    assert_eq!(
        run1(&t, vec![HostData::I32(vec![i32::MAX, 1, 5, 6])]),
        HostData::I32(vec![i32::MIN, 11])
    );
    let t = unary_trace(
        meta(&[2, 2], DType::F32),
        Op::Reduce { kind: ReduceOp::Sum, axes: ax(&[]), keepdim: false },
    );
    assert_same_f32(
        &f32s(&run1(&t, vec![HostData::F32(vec![-0.0, 1.5, f32::NAN, 3.0])])),
        &[-0.0, 1.5, f32::NAN, 3.0],
    );
    // A long full reduction takes the parallel path.
    let n = 1 << 20;
    let t = unary_trace(
        meta(&[n], DType::F32),
        Op::Reduce { kind: ReduceOp::Sum, axes: ax(&[0]), keepdim: false },
    );
    assert_eq!(f32s(&run1(&t, vec![HostData::F32(vec![0.5; n])])), vec![(n / 2) as f32]);
}

#[test]
fn leading_axis_reductions_read_rows_in_order() {
    // A bias-gradient shape: the reduced axes lead, so the kernel folds whole
    // rows; wide enough that column blocks run in parallel.
    let (r, k) = (300, 2500);
    let mut x = noise(r * k, 7);
    x[5 * k + 17] = f32::NAN;
    x[9 * k + 40] = f32::INFINITY;
    let t = |kind| {
        unary_trace(
            meta(&[3, r / 3, k], DType::F32),
            Op::Reduce { kind, axes: ax(&[0, 1]), keepdim: true },
        )
    };
    let col = |j: usize| (0..r).map(|i| x[i * k + j]).collect::<Vec<f32>>().into_iter();
    let sums: Vec<f32> = (0..k).map(|j| col(j).fold(-0.0f64, |a, v| a + v as f64) as f32).collect();
    let maxs: Vec<f32> = (0..k)
        .map(|j| {
            col(j).fold(f32::NEG_INFINITY, |a, v| {
                if a.is_nan() || v.is_nan() {
                    f32::NAN
                } else {
                    a.max(v)
                }
            })
        })
        .collect();
    assert_same_f32(&f32s(&run1(&t(ReduceOp::Sum), vec![HostData::F32(x.clone())])), &sums);
    assert_same_f32(&f32s(&run1(&t(ReduceOp::Max), vec![HostData::F32(x.clone())])), &maxs);
    assert!(sums[17].is_nan() && maxs[17].is_nan() && sums[40] == f32::INFINITY);
    // Integer sums wrap the same way on this path.
    let t = unary_trace(
        meta(&[2, 3], DType::I32),
        Op::Reduce { kind: ReduceOp::Sum, axes: ax(&[0]), keepdim: false },
    );
    assert_eq!(
        run1(&t, vec![HostData::I32(vec![i32::MAX, 1, 2, 1, 2, 3])]),
        HostData::I32(vec![i32::MIN, 3, 5])
    );
}

#[test]
fn row_gather_clamps_and_scatter_add_skips() {
    let mut t = Trace::new();
    let x = t.push_parameter(meta(&[3, 2], DType::F32));
    let idx = t.push_parameter(meta(&[4], DType::I64));
    let to = t.push_parameter(meta(&[4], DType::I64));
    let upd = t.push_parameter(meta(&[4, 2], DType::BF16));
    let to32 = t.push_parameter(meta(&[4], DType::I32));
    let ints = t.push_parameter(meta(&[4], DType::I32));
    let g = t.push(Op::GatherRows, &[x, idx]).unwrap();
    let s = t.push(Op::ScatterAddRows { rows: 3 }, &[to, upd]).unwrap();
    let w = t.push(Op::ScatterAddRows { rows: 2 }, &[to32, ints]).unwrap();
    t.outputs = vec![g, s, w];
    let bf = |v: [f32; 8]| HostData::BF16(v.map(bf16::from_f32).to_vec());
    let out = run(
        &t,
        vec![
            HostData::F32(iota(6)),
            HostData::I64(vec![2, -1, 7, 1]),
            HostData::I64(vec![2, 2, 7, 2]),
            // Row 2 sums 256 + 1 + 1 = 258 and rounds once: added one at a
            // time in bf16 it would stay 256.
            bf([256.0, 1.0, 1.0, 5.0, 9.0, 9.0, 1.0, 1.0]),
            HostData::I32(vec![0, 0, 5, 1]),
            HostData::I32(vec![i32::MAX, 1, 7, 3]),
        ],
    )
    .unwrap();
    // Out of range: the gather reads the nearest row, the scatter skips.
    assert_eq!(f32s(&out[0]), vec![4.0, 5.0, 0.0, 1.0, 4.0, 5.0, 2.0, 3.0]);
    assert_eq!(out[1].to_f64_vec(), vec![0.0, 0.0, 0.0, 0.0, 258.0, 7.0]);
    assert_eq!(out[2], HostData::I32(vec![i32::MIN, 3]));
    // Indices must be integers, one per row of updates.
    let mut t = Trace::new();
    let x = t.push_parameter(meta(&[3, 2], DType::F32));
    let f = t.push_parameter(meta(&[4], DType::F32));
    assert!(t.push(Op::GatherRows, &[x, f]).is_err());
    let i = t.push_parameter(meta(&[4], DType::I64));
    let err = t.push(Op::ScatterAddRows { rows: 3 }, &[i, x]).unwrap_err();
    assert!(err.to_string().contains("one row of updates per index"), "{err}");
}

#[test]
fn mean_prod_and_empty_axes() {
    let t = unary_trace(
        meta(&[2, 3], DType::F32),
        Op::Reduce { kind: ReduceOp::Mean, axes: ax(&[1]), keepdim: false },
    );
    assert_eq!(
        f32s(&run1(&t, vec![HostData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])])),
        vec![2.0, 5.0]
    );
    let t = unary_trace(
        meta(&[2, 3], DType::BF16),
        Op::Reduce { kind: ReduceOp::Mean, axes: ax(&[0, 1]), keepdim: true },
    );
    let x: Vec<bf16> =
        [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(run1(&t, vec![HostData::BF16(x)]), HostData::BF16(vec![bf16::from_f32(3.5)]));
    let t = unary_trace(
        meta(&[4], DType::I64),
        Op::Reduce { kind: ReduceOp::Prod, axes: ax(&[0]), keepdim: false },
    );
    assert_eq!(run1(&t, vec![HostData::I64(vec![2, -3, 4, 5])]), HostData::I64(vec![-120]));

    let empty = || HostData::F32(vec![]);
    let red = |kind| {
        unary_trace(meta(&[2, 0], DType::F32), Op::Reduce { kind, axes: ax(&[1]), keepdim: false })
    };
    assert_eq!(f32s(&run1(&red(ReduceOp::Sum), vec![empty()])), vec![0.0, 0.0]);
    assert_eq!(f32s(&run1(&red(ReduceOp::Prod), vec![empty()])), vec![1.0, 1.0]);
    assert!(f32s(&run1(&red(ReduceOp::Mean), vec![empty()])).iter().all(|v| v.is_nan()));
    // A max or min over an empty axis is refused when the trace is built,
    // as PyTorch refuses it at the call.
    for kind in [ReduceOp::Max, ReduceOp::Min] {
        let mut t = Trace::new();
        let x = t.push_parameter(meta(&[2, 0], DType::F32));
        let err = t.push(Op::Reduce { kind, axes: ax(&[1]), keepdim: false }, &[x]).unwrap_err();
        assert!(err.to_string().contains("empty axis"), "{err}");
    }
    // Reducing the non-empty axis of an empty tensor gives an empty result.
    let t = unary_trace(
        meta(&[0, 3], DType::F32),
        Op::Reduce { kind: ReduceOp::Max, axes: ax(&[1]), keepdim: false },
    );
    assert_eq!(f32s(&run1(&t, vec![empty()])), Vec::<f32>::new());
}

#[test]
fn argmax_argmin_ties_and_nan() {
    let nan = f32::NAN;
    let x = vec![1.0, 3.0, 3.0, 2.0, 5.0, nan, nan, 1.0, -1.0, -1.0, -1.0, -1.0];
    let arg = |kind, axis, keepdim| {
        unary_trace(meta(&[3, 4], DType::F32), Op::ArgReduce { kind, axis, keepdim })
    };
    assert_eq!(
        run1(&arg(ArgReduceOp::Argmax, 1, false), vec![HostData::F32(x.clone())]),
        HostData::I64(vec![1, 1, 0])
    );
    assert_eq!(
        run1(&arg(ArgReduceOp::Argmin, 1, false), vec![HostData::F32(x.clone())]),
        HostData::I64(vec![0, 1, 0])
    );
    let t = arg(ArgReduceOp::Argmax, 0, true);
    assert_eq!(t.meta(1).shape.as_slice(), &[1, 4]);
    assert_eq!(run1(&t, vec![HostData::F32(x)]), HostData::I64(vec![1, 1, 1, 0]));
    let t = unary_trace(
        meta(&[2, 2], DType::I32),
        Op::ArgReduce { kind: ArgReduceOp::Argmax, axis: 0, keepdim: false },
    );
    assert_eq!(run1(&t, vec![HostData::I32(vec![1, 5, 3, 5])]), HostData::I64(vec![1, 0]));
}

#[test]
fn permute_is_a_general_transpose() {
    let t = unary_trace(meta(&[2, 3, 4], DType::I64), Op::Permute { perm: ax(&[2, 0, 1]) });
    assert_eq!(t.meta(1).shape.as_slice(), &[4, 2, 3]);
    let out = run1(&t, vec![HostData::I64((0..24).collect())]);
    let mut want = Vec::new();
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                want.push((i * 12 + j * 4 + k) as i64);
            }
        }
    }
    assert_eq!(out, HostData::I64(want));
}

#[test]
fn slice_with_step_expand_and_reshape() {
    let t = unary_trace(meta(&[10], DType::F32), Op::Slice { axis: 0, start: 1, stop: 9, step: 3 });
    assert_eq!(f32s(&run1(&t, vec![HostData::F32(iota(10))])), vec![1.0, 4.0, 7.0]);
    let t =
        unary_trace(meta(&[2, 5], DType::F32), Op::Slice { axis: 1, start: 0, stop: 5, step: 2 });
    assert_eq!(f32s(&run1(&t, vec![HostData::F32(iota(10))])), vec![0.0, 2.0, 4.0, 5.0, 7.0, 9.0]);
    let t =
        unary_trace(meta(&[2, 5], DType::F32), Op::Slice { axis: 1, start: 3, stop: 3, step: 1 });
    assert_eq!(f32s(&run1(&t, vec![HostData::F32(iota(10))])), Vec::<f32>::new());

    let t = unary_trace(meta(&[3, 1], DType::I32), Op::Expand { shape: shape(&[2, 3, 2]) });
    assert_eq!(
        run1(&t, vec![HostData::I32(vec![1, 2, 3])]),
        HostData::I32(vec![1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3])
    );
    let t = unary_trace(meta(&[2, 3], DType::I32), Op::Reshape { shape: shape(&[3, 2]) });
    assert_eq!(
        run1(&t, vec![HostData::I32(vec![1, 2, 3, 4, 5, 6])]),
        HostData::I32(vec![1, 2, 3, 4, 5, 6])
    );
}

#[test]
fn concat_along_an_inner_axis() {
    let mut t = Trace::new();
    let a = t.push_parameter(meta(&[2, 1], DType::I32));
    let b = t.push_parameter(meta(&[2, 2], DType::I32));
    let c = t.push_parameter(meta(&[2, 0], DType::I32));
    let z = t.push(Op::Concat { axis: 1 }, &[a, b, c, a]).unwrap();
    t.outputs = vec![z];
    let out = run1(
        &t,
        vec![HostData::I32(vec![1, 2]), HostData::I32(vec![10, 11, 20, 21]), HostData::I32(vec![])],
    );
    assert_eq!(out, HostData::I32(vec![1, 10, 11, 1, 2, 20, 21, 2]));
}

/// Concat and row gathers large enough to run in parallel chunks, which
/// start and end inside blocks and rows, against index arithmetic.
#[test]
fn large_concats_row_gathers_and_scatter_adds_agree_with_their_definition() {
    let (outer, widths) = (3001usize, [1usize, 0, 70, 5]);
    let mut t = Trace::new();
    let parts: Vec<NodeId> =
        widths.iter().map(|&w| t.push_parameter(meta(&[outer, w], DType::F32))).collect();
    let z = t.push(Op::Concat { axis: 1 }, &parts).unwrap();
    t.outputs = vec![z];
    let data: Vec<Vec<f32>> =
        widths.iter().enumerate().map(|(i, &w)| noise(outer * w, i as u64)).collect();
    let got = f32s(&run1(&t, data.iter().cloned().map(HostData::F32).collect()));
    let want: Vec<f32> = (0..outer)
        .flat_map(|o| {
            data.iter().zip(widths).flat_map(move |(d, w)| d[o * w..(o + 1) * w].to_vec())
        })
        .collect();
    assert_eq!(got, want);

    for row in [1usize, 3] {
        let (rows, count) = (1000usize, 200_003usize);
        let mut t = Trace::new();
        let table = t.push_parameter(meta(&[rows, row], DType::F32));
        let idx = t.push_parameter(meta(&[count], DType::I64));
        let g = t.push(Op::GatherRows, &[table, idx]).unwrap();
        t.outputs = vec![g];
        let values = noise(rows * row, 7);
        // Out of range indices read the nearest row.
        let index: Vec<i64> = (0..count as i64).map(|i| (i * 7919) % 1100 - 50).collect();
        let got =
            f32s(&run1(&t, vec![HostData::F32(values.clone()), HostData::I64(index.clone())]));
        let want: Vec<f32> = index
            .iter()
            .flat_map(|&i| {
                let r = i.clamp(0, rows as i64 - 1) as usize;
                values[r * row..(r + 1) * row].to_vec()
            })
            .collect();
        assert_eq!(got, want, "rows of {row}");

        // The scatter-add back through the same index, split over the cores
        // by destination row: each row's sum in update order, exactly as one
        // pass makes it; out of range adds nothing.
        let mut t = Trace::new();
        let idx = t.push_parameter(meta(&[count], DType::I64));
        let upd = t.push_parameter(meta(&[count, row], DType::F32));
        let s = t.push(Op::ScatterAddRows { rows }, &[idx, upd]).unwrap();
        t.outputs = vec![s];
        let updates = noise(count * row, 8);
        let got =
            f32s(&run1(&t, vec![HostData::I64(index.clone()), HostData::F32(updates.clone())]));
        let mut want = vec![0f32; rows * row];
        for (&i, u) in index.iter().zip(updates.chunks_exact(row)) {
            if (0..rows as i64).contains(&i) {
                for (a, &x) in want[i as usize * row..][..row].iter_mut().zip(u) {
                    *a += x;
                }
            }
        }
        assert_eq!(got, want, "scatter-add rows of {row}");
    }
}

fn naive_matmul(a: &[f32], sa: &[usize], b: &[f32], sb: &[usize], out: &[usize]) -> Vec<f32> {
    let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
    let ob = &out[..out.len() - 2];
    let nb: usize = ob.iter().product();
    let mut res = vec![0.0f32; nb * m * n];
    for bi in 0..nb {
        // Unravel the batch index and broadcast it into each operand.
        let mut idx = vec![0; ob.len()];
        let mut r = bi;
        for d in (0..ob.len()).rev() {
            idx[d] = r % ob[d];
            r /= ob[d];
        }
        let off = |s: &[usize]| -> usize {
            let bs = &s[..s.len() - 2];
            let lead = ob.len() - bs.len();
            let mut o = 0;
            for (d, &dim) in bs.iter().enumerate() {
                o = o * dim + if dim == 1 { 0 } else { idx[lead + d] };
            }
            o
        };
        let (oa, obb) = (off(sa) * m * k, off(sb) * k * n);
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0f64;
                for p in 0..k {
                    s += a[oa + i * k + p] as f64 * b[obb + p * n + j] as f64;
                }
                res[bi * m * n + i * n + j] = s as f32;
            }
        }
    }
    res
}

#[test]
fn matmul_batched_with_broadcasting() {
    for (sa, sb) in [
        (vec![2, 1, 3, 4], vec![3, 4, 5]),
        (vec![5, 7], vec![4, 7, 3]),
        (vec![3, 64, 96], vec![96, 80]),
        (vec![130, 120], vec![120, 110]),
    ] {
        let mut t = Trace::new();
        let a = t.push_parameter(meta(&sa, DType::F32));
        let b = t.push_parameter(meta(&sb, DType::F32));
        let c = t.push(Op::MatMul, &[a, b]).unwrap();
        t.outputs = vec![c];
        let out_shape = t.meta(c).shape.clone();
        let x = noise(sa.iter().product(), 7);
        let y = noise(sb.iter().product(), 8);
        let got = f32s(&run1(&t, vec![HostData::F32(x.clone()), HostData::F32(y.clone())]));
        let want = naive_matmul(&x, &sa, &y, &sb, &out_shape);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4, "{sa:?} @ {sb:?}: {g} vs {w}");
        }
    }
}

#[test]
fn matmul_degenerate_and_half() {
    let mut t = Trace::new();
    let a = t.push_parameter(meta(&[2, 0], DType::F32));
    let b = t.push_parameter(meta(&[0, 3], DType::F32));
    let c = t.push(Op::MatMul, &[a, b]).unwrap();
    t.outputs = vec![c];
    assert_eq!(f32s(&run1(&t, vec![HostData::F32(vec![]), HostData::F32(vec![])])), vec![0.0; 6]);

    let mut t = Trace::new();
    let a = t.push_parameter(meta(&[2, 2], DType::BF16));
    let b = t.push_parameter(meta(&[2, 2], DType::BF16));
    let c = t.push(Op::MatMul, &[a, b]).unwrap();
    t.outputs = vec![c];
    let h = |v: &[f32]| HostData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect());
    // [[1, 2], [3, 4]] @ [[1, 1/256], [0, 1]]: 1 + 2/256 needs rounding in bf16.
    let out = run1(&t, vec![h(&[1.0, 2.0, 3.0, 4.0]), h(&[1.0, 1.0 / 256.0, 0.0, 1.0])]);
    assert_eq!(out, h(&[1.0, 2.0 + 1.0 / 256.0, 3.0, 4.0 + 3.0 / 256.0]));
}

#[test]
fn casts_round_truncate_and_wrap() {
    let t = unary_trace(meta(&[5], DType::F32), Op::Cast { to: DType::BF16 });
    let x = vec![1.0, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, std::f32::consts::PI, -65.3];
    let out = run1(&t, vec![HostData::F32(x)]);
    let want: Vec<u16> = [1.0f32, 1.0, 1.015625, 3.140625, -65.5]
        .iter()
        .map(|&v| bf16::from_f32(v).to_bits())
        .collect();
    match out {
        HostData::BF16(v) => assert_eq!(v.iter().map(|b| b.to_bits()).collect::<Vec<_>>(), want),
        other => panic!("{other:?}"),
    }
    let t = unary_trace(meta(&[5], DType::F32), Op::Cast { to: DType::I32 });
    let out = run1(&t, vec![HostData::F32(vec![-1.7, 2.9, f32::NAN, 1e10, -0.2])]);
    assert_eq!(out, HostData::I32(vec![-1, 2, 0, i32::MAX, 0]));
    let t = unary_trace(meta(&[3], DType::I64), Op::Cast { to: DType::I32 });
    assert_eq!(
        run1(&t, vec![HostData::I64(vec![1 << 32, -1, (1 << 31) + 5])]),
        HostData::I32(vec![0, -1, i32::MIN + 5])
    );
    let t = unary_trace(meta(&[3], DType::F32), Op::Cast { to: DType::Bool });
    assert_eq!(
        run1(&t, vec![HostData::F32(vec![0.0, -0.0, f32::NAN])]),
        HostData::Bool(vec![false, false, true])
    );
    let t = unary_trace(meta(&[2], DType::Bool), Op::Cast { to: DType::F16 });
    assert_eq!(
        run1(&t, vec![HostData::Bool(vec![true, false])]),
        HostData::F16(vec![half::f16::ONE, half::f16::ZERO])
    );
    // Same-size casts run in place and stay right.
    let t = unary_trace(meta(&[3], DType::I32), Op::Cast { to: DType::F32 });
    assert_eq!(
        f32s(&run1(&t, vec![HostData::I32(vec![-3, 16_777_217, 7])])),
        vec![-3.0, 16_777_216.0, 7.0]
    );
}

#[test]
fn unary_values() {
    let t = unary_trace(meta(&[4], DType::F32), Op::Unary { kind: UnaryOp::GeluErf });
    let out = f32s(&run1(&t, vec![HostData::F32(vec![1.0, -0.5, 0.0, -10.0])]));
    assert!((out[0] - 0.841_344_7).abs() <= 1e-7, "{}", out[0]);
    assert!((out[1] - -0.154_268_77).abs() <= 1e-7, "{}", out[1]);
    assert_eq!(out[2], 0.0);
    // erfc keeps the tail: gelu(-10) = -10 * erfc(10 / sqrt 2) / 2 = -7.62e-23.
    assert!((out[3] / -7.619_853e-23 - 1.0).abs() < 1e-5, "{}", out[3]);

    let cases: Vec<(UnaryOp, f32, f32)> = vec![
        (UnaryOp::Sigmoid, 0.0, 0.5),
        (UnaryOp::Silu, 2.0, 2.0 / (1.0 + (-2.0f32).exp())),
        (UnaryOp::Rsqrt, 4.0, 0.5),
        (UnaryOp::Floor, -1.5, -2.0),
        (UnaryOp::Sign, -3.0, -1.0),
        (UnaryOp::Reciprocal, 4.0, 0.25),
        (UnaryOp::GeluTanh, 0.0, 0.0),
    ];
    for (kind, x, want) in cases {
        let t = unary_trace(meta(&[], DType::F32), Op::Unary { kind });
        assert_eq!(f32s(&run1(&t, vec![HostData::F32(vec![x])])), vec![want], "{kind:?}");
    }
    let t = unary_trace(meta(&[1], DType::F32), Op::Unary { kind: UnaryOp::Sign });
    assert!(f32s(&run1(&t, vec![HostData::F32(vec![f32::NAN])]))[0].is_nan());
    let t = unary_trace(meta(&[4], DType::I32), Op::Unary { kind: UnaryOp::Sign });
    assert_eq!(
        run1(&t, vec![HostData::I32(vec![-5, 0, 9, i32::MIN])]),
        HostData::I32(vec![-1, 0, 1, -1])
    );
    let t = unary_trace(meta(&[2], DType::I32), Op::Unary { kind: UnaryOp::Neg });
    assert_eq!(run1(&t, vec![HostData::I32(vec![i32::MIN, 4])]), HostData::I32(vec![i32::MIN, -4]));
    let t = unary_trace(meta(&[2], DType::Bool), Op::Unary { kind: UnaryOp::LogicalNot });
    assert_eq!(
        run1(&t, vec![HostData::Bool(vec![true, false])]),
        HostData::Bool(vec![false, true])
    );
}

#[test]
fn sources_full_arange_random() {
    let mut t = Trace::new();
    let f = t.push(Op::Full { value: 2.5, shape: shape(&[2]), dtype: DType::I32 }, &[]).unwrap();
    let a = t.push(Op::Arange { start: 1.0, step: 0.5, len: 4, dtype: DType::F32 }, &[]).unwrap();
    t.outputs = vec![f, a];
    let out = run(&t, vec![]).unwrap();
    assert_eq!(out, vec![HostData::I32(vec![2, 2]), HostData::F32(vec![1.0, 1.5, 2.0, 2.5])]);

    let draw = |seed, dist, dtype| {
        let mut t = Trace::new();
        let r = t.push(Op::Random { seed, dist, shape: shape(&[1000]), dtype }, &[]).unwrap();
        t.outputs = vec![r];
        run1(&t, vec![])
    };
    for dist in [Distribution::Uniform, Distribution::Normal] {
        assert_eq!(draw(7, dist, DType::F32), draw(7, dist, DType::F32));
        assert_ne!(draw(7, dist, DType::F32), draw(8, dist, DType::F32));
    }
    let u = f32s(&draw(1, Distribution::Uniform, DType::F32));
    assert!(u.iter().all(|&v| (0.0..1.0).contains(&v)));
    let mean = u.iter().map(|&v| v as f64).sum::<f64>() / 1000.0;
    assert!((mean - 0.5).abs() < 0.05, "{mean}");
    let z = f32s(&draw(1, Distribution::Normal, DType::F32));
    let mean = z.iter().map(|&v| v as f64).sum::<f64>() / 1000.0;
    let var = z.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 1000.0;
    assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.15, "{mean} {var}");
    // Element i depends on (seed, i) only: a longer draw starts the same.
    let mut t = Trace::new();
    let r = t
        .push(
            Op::Random {
                seed: 1,
                dist: Distribution::Uniform,
                shape: shape(&[10]),
                dtype: DType::F32,
            },
            &[],
        )
        .unwrap();
    t.outputs = vec![r];
    assert_eq!(f32s(&run1(&t, vec![])), u[..10].to_vec());
    if let HostData::BF16(v) = draw(3, Distribution::Uniform, DType::BF16) {
        assert!(v.iter().all(|x| (0.0..1.0).contains(&x.to_f32())));
    } else {
        panic!("bf16 expected");
    }
}

/// Builds the decomposed softmax / layer_norm next to the fused forms: on f32
/// the reference gives identical bits.
#[test]
fn fused_row_ops_match_their_decomposition() {
    let (rows, cols) = (5, 7);
    let x = noise(rows * cols, 11).iter().map(|v| v * 4.0).collect::<Vec<_>>();
    let mut t = Trace::new();
    let p = t.push_parameter(meta(&[rows, cols], DType::F32));
    let eps = t.push(Op::Full { value: 1e-5, shape: shape(&[]), dtype: DType::F32 }, &[]).unwrap();
    let red = |t: &mut Trace, kind, x: NodeId| {
        t.push(Op::Reduce { kind, axes: ax(&[1]), keepdim: true }, &[x]).unwrap()
    };
    let bin =
        |t: &mut Trace, kind, a: NodeId, b: NodeId| t.push(Op::Binary { kind }, &[a, b]).unwrap();
    let un = |t: &mut Trace, kind, a: NodeId| t.push(Op::Unary { kind }, &[a]).unwrap();
    // softmax
    let m = red(&mut t, ReduceOp::Max, p);
    let d = bin(&mut t, BinaryOp::Sub, p, m);
    let e = un(&mut t, UnaryOp::Exp, d);
    let s = red(&mut t, ReduceOp::Sum, e);
    let sm = bin(&mut t, BinaryOp::Div, e, s);
    let fsm = t.push(Op::Softmax { axis: 1 }, &[p]).unwrap();
    // log_softmax
    let ls = un(&mut t, UnaryOp::Log, s);
    let lsm = bin(&mut t, BinaryOp::Sub, d, ls);
    let flsm = t.push(Op::LogSoftmax { axis: 1 }, &[p]).unwrap();
    // layer_norm
    let mu = red(&mut t, ReduceOp::Mean, p);
    let c = bin(&mut t, BinaryOp::Sub, p, mu);
    let c2 = bin(&mut t, BinaryOp::Mul, c, c);
    let var = red(&mut t, ReduceOp::Mean, c2);
    let ve = bin(&mut t, BinaryOp::Add, var, eps);
    let r = un(&mut t, UnaryOp::Rsqrt, ve);
    let ln = bin(&mut t, BinaryOp::Mul, c, r);
    let fln = t.push(Op::LayerNorm { axes: ax(&[1]) }, &[p, eps]).unwrap();
    // rms_norm
    let sq = bin(&mut t, BinaryOp::Mul, p, p);
    let ms = red(&mut t, ReduceOp::Mean, sq);
    let mse = bin(&mut t, BinaryOp::Add, ms, eps);
    let rr = un(&mut t, UnaryOp::Rsqrt, mse);
    let rms = bin(&mut t, BinaryOp::Mul, p, rr);
    let frms = t.push(Op::RmsNorm { axes: ax(&[1]) }, &[p, eps]).unwrap();
    t.outputs = vec![sm, fsm, lsm, flsm, ln, fln, rms, frms];
    let out = run(&t, vec![HostData::F32(x)]).unwrap();
    for pair in out.chunks(2) {
        assert_same_f32(&f32s(&pair[1]), &f32s(&pair[0]));
    }
    let soft = f32s(&out[0]);
    for row in soft.chunks(cols) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}

#[test]
fn chain_of_unary_ops_reuses_memory() {
    let n = 1 << 20;
    let tracker = MemoryTracker::new();
    let be = CpuBackend::new(tracker.clone());
    let mut t = Trace::new();
    let mut x = t.push_parameter(meta(&[n], DType::F32));
    for kind in [UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Sqrt, UnaryOp::Log, UnaryOp::Abs] {
        x = t.push(Op::Unary { kind }, &[x]).unwrap();
    }
    t.outputs = vec![x];
    let exe = be.compile(&Program::unfused(&t)).unwrap();
    let input = be.upload(meta(&[n], DType::F32), HostData::F32(noise(n, 5))).unwrap();
    let bytes = n * 4;
    tracker.reset_peak();
    let out = exe.run(vec![input]).unwrap();
    let stats = tracker.stats();
    assert!(stats.peak_bytes <= 3 * bytes, "peak {} > 3 x {}", stats.peak_bytes, bytes);
    // In fact every op overwrote the input in place: nothing else was allocated.
    assert_eq!(stats.peak_bytes, bytes);
    assert_eq!(stats.live_bytes, bytes);
    // And the values are right: |log(sqrt(exp(-x)))| = |x| / 2 up to rounding.
    let x0 = noise(n, 5);
    let got = f32s(&be.download(&out[0]).unwrap());
    for i in (0..n).step_by(4099) {
        assert!((got[i] - x0[i].abs() / 2.0).abs() < 1e-6, "{i}: {} vs {}", got[i], x0[i]);
    }
    drop(out);
    assert_eq!(tracker.stats().live_bytes, 0);
}

#[test]
fn in_place_binary_is_right_even_with_aliases() {
    let be = backend();
    // x * x with x at its last use twice: no reuse may corrupt the product.
    let mut t = Trace::new();
    let p = t.push_parameter(meta(&[3], DType::F32));
    let q = t.push_parameter(meta(&[2, 3], DType::F32));
    let e = t.push(Op::Unary { kind: UnaryOp::Neg }, &[p]).unwrap();
    let sq = t.push(Op::Binary { kind: BinaryOp::Mul }, &[e, e]).unwrap();
    // q - sq broadcasts sq; q (right size, last use) is overwritten.
    let d = t.push(Op::Binary { kind: BinaryOp::Sub }, &[q, sq]).unwrap();
    // A parameter that is also an output comes back as the same buffer.
    t.outputs = vec![d, sq, p, d];
    let exe = be.compile(&Program::unfused(&t)).unwrap();
    let pb = be.upload(meta(&[3], DType::F32), HostData::F32(vec![1.0, 2.0, 3.0])).unwrap();
    let qb = be.upload(meta(&[2, 3], DType::F32), HostData::F32(vec![10.0; 6])).unwrap();
    let out = exe.run(vec![pb.clone(), qb]).unwrap();
    assert_eq!(f32s(&be.download(&out[0]).unwrap()), vec![9.0, 6.0, 1.0, 9.0, 6.0, 1.0]);
    assert_eq!(f32s(&be.download(&out[1]).unwrap()), vec![1.0, 4.0, 9.0]);
    assert!(Arc::ptr_eq(&out[2], &pb));
    assert!(Arc::ptr_eq(&out[0], &out[3]));
}

#[test]
fn input_mismatches_are_errors() {
    let be = backend();
    let t = unary_trace(meta(&[3], DType::F32), Op::Unary { kind: UnaryOp::Exp });
    let exe = be.compile(&Program::unfused(&t)).unwrap();
    assert!(exe.run(vec![]).is_err());
    let good = be.upload(meta(&[3], DType::F32), HostData::F32(vec![0.0; 3])).unwrap();
    assert!(exe.run(vec![good.clone(), good]).is_err());
    let wrong_shape = be.upload(meta(&[1, 3], DType::F32), HostData::F32(vec![0.0; 3])).unwrap();
    assert!(exe.run(vec![wrong_shape]).is_err());
    let wrong_dtype = be.upload(meta(&[3], DType::I32), HostData::I32(vec![0; 3])).unwrap();
    assert!(exe.run(vec![wrong_dtype]).is_err());
    assert!(be.upload(meta(&[2], DType::F32), HostData::F32(vec![0.0; 3])).is_err());
    assert!(be.upload(meta(&[3], DType::F32), HostData::I32(vec![0; 3])).is_err());
    assert_eq!(be.name(), "cpu");
}

/// Random shapes (including zero and one dims) against naive index arithmetic.
mod props {
    use super::*;
    use proptest::prelude::*;

    fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
        let mut idx = vec![0; shape.len()];
        for d in (0..shape.len()).rev() {
            idx[d] = i % shape[d];
            i /= shape[d];
        }
        idx
    }

    fn ravel(idx: &[usize], shape: &[usize]) -> usize {
        idx.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
    }

    /// A suffix of `out` with some dims set to 1, chosen by `bits`.
    fn broadcastable(out: &[usize], bits: u64) -> Vec<usize> {
        let drop = (bits % (out.len() as u64 + 1)) as usize;
        out[drop..]
            .iter()
            .enumerate()
            .map(|(d, &n)| if bits >> (8 + d) & 1 == 1 { 1 } else { n })
            .collect()
    }

    fn read_broadcast(data: &[f32], shape: &[usize], out_idx: &[usize]) -> f32 {
        let off = out_idx.len() - shape.len();
        let idx: Vec<usize> = shape
            .iter()
            .enumerate()
            .map(|(d, &n)| if n == 1 { 0 } else { out_idx[off + d] })
            .collect();
        data[ravel(&idx, shape)]
    }

    fn numel(s: &[usize]) -> usize {
        s.iter().product()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn binary_broadcast(out in prop::collection::vec(0usize..4, 0..=4), ba in any::<u64>(), bb in any::<u64>()) {
            let (sa, sb) = (broadcastable(&out, ba), broadcastable(&out, bb));
            let t = binary_trace(meta(&sa, DType::F32), meta(&sb, DType::F32), BinaryOp::Sub);
            let os = t.meta(2).shape.to_vec();
            let a: Vec<f32> = (0..numel(&sa)).map(|i| i as f32).collect();
            let b: Vec<f32> = (0..numel(&sb)).map(|i| (i * 7) as f32).collect();
            let got = f32s(&run1(&t, vec![HostData::F32(a.clone()), HostData::F32(b.clone())]));
            let want: Vec<f32> = (0..numel(&os))
                .map(|i| { let idx = unravel(i, &os); read_broadcast(&a, &sa, &idx) - read_broadcast(&b, &sb, &idx) })
                .collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn reduce_any_axes(shape in prop::collection::vec(0usize..4, 0..=4), bits in any::<u64>(), keepdim in any::<bool>()) {
            let axes: Vec<usize> = (0..shape.len()).filter(|d| bits >> d & 1 == 1).collect();
            let x: Vec<f32> = (0..numel(&shape)).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
            let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
            let kshape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
            let r: usize = axes.iter().map(|&d| shape[d]).product();
            let mut sums = vec![0.0f32; numel(&kshape)];
            let mut maxs = vec![f32::NEG_INFINITY; numel(&kshape)];
            for (i, &v) in x.iter().enumerate() {
                let idx = unravel(i, &shape);
                let k = ravel(&kept.iter().map(|&d| idx[d]).collect::<Vec<_>>(), &kshape);
                sums[k] += v;
                maxs[k] = maxs[k].max(v);
            }
            let t = unary_trace(meta(&shape, DType::F32), Op::Reduce { kind: ReduceOp::Sum, axes: ax(&axes), keepdim });
            prop_assert_eq!(f32s(&run1(&t, vec![HostData::F32(x.clone())])), sums);
            let mut t = Trace::new();
            let p = t.push_parameter(meta(&shape, DType::F32));
            let max = t.push(Op::Reduce { kind: ReduceOp::Max, axes: ax(&axes), keepdim }, &[p]);
            if r == 0 {
                prop_assert!(max.is_err());
            } else {
                t.outputs = vec![max.unwrap()];
                prop_assert_eq!(f32s(&run1(&t, vec![HostData::F32(x)])), maxs);
            }
        }

        #[test]
        fn permute_and_slice(shape in prop::collection::vec(0usize..5, 1..=4), bits in any::<u64>()) {
            let rank = shape.len();
            let mut perm: Vec<usize> = (0..rank).collect();
            let mut b = bits;
            for i in (1..rank).rev() {
                perm.swap(i, (b % (i as u64 + 1)) as usize);
                b /= 7;
            }
            let x: Vec<i64> = (0..numel(&shape) as i64).collect();
            let t = unary_trace(meta(&shape, DType::I64), Op::Permute { perm: ax(&perm) });
            let os: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let want: Vec<i64> = (0..numel(&os)).map(|i| {
                let oi = unravel(i, &os);
                let mut ii = vec![0; rank];
                for (j, &p) in perm.iter().enumerate() { ii[p] = oi[j]; }
                x[ravel(&ii, &shape)]
            }).collect();
            prop_assert_eq!(run1(&t, vec![HostData::I64(x.clone())]), HostData::I64(want));

            let axis = (bits % rank as u64) as usize;
            let dim = shape[axis];
            let start = ((bits >> 8) as usize) % (dim + 1);
            let stop = start + ((bits >> 16) as usize) % (dim - start + 1);
            let step = 1 + ((bits >> 24) as usize) % 3;
            let t = unary_trace(meta(&shape, DType::I64), Op::Slice { axis, start, stop, step });
            let os = t.meta(1).shape.to_vec();
            let want: Vec<i64> = (0..numel(&os)).map(|i| {
                let mut idx = unravel(i, &os);
                idx[axis] = start + idx[axis] * step;
                x[ravel(&idx, &shape)]
            }).collect();
            prop_assert_eq!(run1(&t, vec![HostData::I64(x)]), HostData::I64(want));
        }
    }
}
