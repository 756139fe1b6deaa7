//! Fused kernels against the op-by-op reference.
//!
//! Tolerances (`|fused - reference| <= abs + rel * |reference|`), per dtype:
//! - f32: rel 1e-5, abs 1e-6 (fused kernels use f32 approximations of the
//!   transcendentals with ≤ 5e-7 relative error, and sum rows in f32
//!   lanes, at most 32 roundings per block of 1024 values, where the
//!   reference sums in f64);
//! - f16: rel 2e-3, abs 1e-3 × max(1, max |reference|) (one rounding at the
//!   output instead of one per op);
//! - bf16: rel 2e-2, abs 1e-2 × max(1, max |reference|) (likewise, with
//!   bf16's 8-bit mantissa);
//! - bool and integers: exact.
//!
//! Values that are NaN in one are NaN in the other.

use rewrite_rules::planner::{plan, PlanConfig, Rounding};
use rewrite_rules::program::{KernelKind, Program};
use runtime::{Backend, CpuBackend, HostData, MemoryTracker};
use trace_ir::{BinaryOp, DType, Meta, NodeId, Op, ReduceOp, Trace, UnaryOp};

/// A trace under construction; every op must be valid.
#[derive(Default)]
struct B {
    t: Trace,
}

impl B {
    fn param(&mut self, shape: &[usize], dtype: DType) -> NodeId {
        self.t.push_parameter(Meta::new(shape.into(), dtype))
    }
    fn full(&mut self, value: f64, dtype: DType) -> NodeId {
        self.op(Op::Full { value, shape: Default::default(), dtype }, &[])
    }
    fn op(&mut self, op: Op, inputs: &[NodeId]) -> NodeId {
        let name = op.name();
        self.t.push(op, inputs).unwrap_or_else(|e| panic!("test trace: {name}: {e}"))
    }
    fn un(&mut self, kind: UnaryOp, x: NodeId) -> NodeId {
        self.op(Op::Unary { kind }, &[x])
    }
    fn bin(&mut self, kind: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        self.op(Op::Binary { kind }, &[a, b])
    }
    fn reduce(&mut self, kind: ReduceOp, x: NodeId, axes: &[usize], keepdim: bool) -> NodeId {
        self.op(Op::Reduce { kind, axes: axes.into(), keepdim }, &[x])
    }
    fn out(mut self, outputs: &[NodeId]) -> Trace {
        self.t.outputs = outputs.to_vec();
        self.t
    }
}

fn backend() -> CpuBackend {
    CpuBackend::new(MemoryTracker::new())
}

/// Deterministic pseudo-random values in [-2, 2).
fn noise(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f64 / (1u64 << 24) as f64) * 4.0 - 2.0
        })
        .collect()
}

fn random_input(meta: &Meta, seed: u64) -> HostData {
    let v = noise(meta.numel(), seed);
    match meta.dtype {
        DType::F32 => HostData::F32(v.iter().map(|&x| x as f32).collect()),
        DType::BF16 => HostData::BF16(v.iter().map(|&x| half::bf16::from_f64(x)).collect()),
        DType::F16 => HostData::F16(v.iter().map(|&x| half::f16::from_f64(x)).collect()),
        DType::Bool => HostData::Bool(v.iter().map(|&x| x > 0.0).collect()),
        DType::I32 => HostData::I32(v.iter().map(|&x| (x * 4.0) as i32).collect()),
        DType::I64 => HostData::I64(v.iter().map(|&x| (x * 4.0) as i64).collect()),
    }
}

fn run_program(program: &Program, inputs: &[HostData]) -> trace_ir::Result<Vec<HostData>> {
    run_on(&backend(), program, inputs)
}

fn run_on(
    be: &CpuBackend,
    program: &Program,
    inputs: &[HostData],
) -> trace_ir::Result<Vec<HostData>> {
    let exe = be.compile(program)?;
    let bufs = program
        .params
        .iter()
        .zip(inputs)
        .map(|(&p, d)| be.upload(Meta::new(d_shape(program, p, d), d.dtype()), d.clone()))
        .collect::<trace_ir::Result<Vec<_>>>()?;
    exe.run(bufs)?.iter().map(|b| be.download(b)).collect()
}

/// The parameter's compiled shape (tests that change sizes upload their own).
fn d_shape(program: &Program, p: NodeId, _d: &HostData) -> trace_ir::Shape {
    program.values[p].shape.clone()
}

/// (rel, abs) tolerance of a dtype; see the module docs.
fn tolerance(d: DType) -> (f64, f64) {
    match d {
        DType::F32 => (1e-5, 1e-6),
        DType::F16 => (2e-3, 1e-3),
        DType::BF16 => (2e-2, 1e-2),
        _ => (0.0, 0.0),
    }
}

fn assert_close(what: &str, got: &HostData, want: &HostData) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (rel, abs) = tolerance(want.dtype());
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    // Half-precision intermediates of the reference are rounded where the
    // fused kernel keeps f32, so their error scales with the values' size.
    let scale = if want.dtype().size_in_bytes() == 2 {
        w.iter().fold(1.0f64, |m, v| if v.is_finite() { m.max(v.abs()) } else { m })
    } else {
        1.0
    };
    let abs = abs * scale;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= abs + rel * b.abs();
        assert!(ok, "{what}: element {i}: fused {a} vs reference {b} ({} tolerance)", want.dtype());
    }
}

/// Plans `trace`, runs it fused and unfused on the same random inputs, and
/// checks they agree. Returns the plan.
fn check(trace: &Trace, config: &PlanConfig) -> Program {
    let fused = plan(trace, config).unwrap_or_else(|e| panic!("plan: {e}"));
    let unfused = Program::unfused(trace);
    let inputs: Vec<HostData> = trace
        .parameters()
        .iter()
        .enumerate()
        .map(|(i, &p)| random_input(trace.meta(p), 17 + i as u64))
        .collect();
    let want = run_program(&unfused, &inputs).unwrap_or_else(|e| panic!("unfused: {e}"));
    let got =
        run_program(&fused, &inputs).unwrap_or_else(|e| panic!("fused: {e}\n{}", fused.to_json()));
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("output {k}"), g, w);
    }
    fused
}

fn check_default(trace: &Trace) -> Program {
    check(trace, &PlanConfig::default())
}

fn loops(p: &Program) -> usize {
    p.kernels.iter().filter(|k| matches!(k.kind, KernelKind::Loop(_))).count()
}

/// The benchmark's GELU: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
fn gelu(b: &mut B, x: NodeId, dt: DType) -> NodeId {
    let c1 = b.full(0.044715, dt);
    let c2 = b.full(0.7978845608028654, dt);
    let half = b.full(0.5, dt);
    let one = b.full(1.0, dt);
    let x2 = b.bin(BinaryOp::Mul, x, x);
    let x3 = b.bin(BinaryOp::Mul, x2, x);
    let t = b.bin(BinaryOp::Mul, x3, c1);
    let inner = b.bin(BinaryOp::Add, x, t);
    let inner = b.bin(BinaryOp::Mul, inner, c2);
    let th = b.un(UnaryOp::Tanh, inner);
    let hx = b.bin(BinaryOp::Mul, x, half);
    let p1 = b.bin(BinaryOp::Add, th, one);
    b.bin(BinaryOp::Mul, hx, p1)
}

fn softmax(b: &mut B, x: NodeId, axis: usize) -> NodeId {
    let m = b.reduce(ReduceOp::Max, x, &[axis], true);
    let d = b.bin(BinaryOp::Sub, x, m);
    let e = b.un(UnaryOp::Exp, d);
    let s = b.reduce(ReduceOp::Sum, e, &[axis], true);
    b.bin(BinaryOp::Div, e, s)
}

fn layer_norm(b: &mut B, x: NodeId, gamma: NodeId, beta: NodeId, axis: usize) -> NodeId {
    let dt = b.t.meta(x).dtype;
    let mean = b.reduce(ReduceOp::Mean, x, &[axis], true);
    let c = b.bin(BinaryOp::Sub, x, mean);
    let sq = b.bin(BinaryOp::Mul, c, c);
    let var = b.reduce(ReduceOp::Mean, sq, &[axis], true);
    let eps = b.param(&[], dt);
    let ve = b.bin(BinaryOp::Add, var, eps);
    let sd = b.un(UnaryOp::Sqrt, ve);
    let n = b.bin(BinaryOp::Div, c, sd);
    let g = b.bin(BinaryOp::Mul, n, gamma);
    b.bin(BinaryOp::Add, g, beta)
}

fn transpose(b: &mut B, x: NodeId) -> NodeId {
    let r = b.t.meta(x).shape.len();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    b.op(Op::Permute { perm: perm.as_slice().into() }, &[x])
}

fn adam(n: usize) -> Trace {
    let mut b = B::default();
    let p = b.param(&[n], DType::F32);
    let m = b.param(&[n], DType::F32);
    let v = b.param(&[n], DType::F32);
    let g = b.param(&[n], DType::F32);
    let s: Vec<NodeId> = (0..7).map(|_| b.param(&[], DType::F32)).collect();
    let m1 = b.bin(BinaryOp::Mul, m, s[0]);
    let g1 = b.bin(BinaryOp::Mul, g, s[1]);
    let m2 = b.bin(BinaryOp::Add, m1, g1);
    let v1 = b.bin(BinaryOp::Mul, v, s[2]);
    let gg = b.bin(BinaryOp::Mul, g, g);
    let gg1 = b.bin(BinaryOp::Mul, gg, s[3]);
    let v2 = b.bin(BinaryOp::Add, v1, gg1);
    let mh = b.bin(BinaryOp::Div, m2, s[4]);
    let vh = b.bin(BinaryOp::Div, v2, s[5]);
    let vabs = b.un(UnaryOp::Abs, vh);
    let sq = b.un(UnaryOp::Sqrt, vabs);
    let den = b.bin(BinaryOp::Add, sq, s[6]);
    let q = b.bin(BinaryOp::Div, mh, den);
    let p2 = b.bin(BinaryOp::Sub, p, q);
    b.out(&[p2, m2, v2])
}

// ---------------------------------------------------------------- planner rules

#[test]
fn gelu_written_out_is_one_kernel() {
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let mut b = B::default();
        let x = b.param(&[3, 1000], dt);
        let y = gelu(&mut b, x, dt);
        let p = check_default(&b.out(&[y]));
        assert_eq!(p.kernels.len(), 1, "{dt}");
        assert_eq!(loops(&p), 1);
    }
}

#[test]
fn softmax_written_out_is_one_row_kernel() {
    let mut b = B::default();
    let x = b.param(&[37, 300], DType::F32);
    let y = softmax(&mut b, x, 1);
    let p = check_default(&b.out(&[y]));
    assert_eq!(p.kernels.len(), 1);
    let KernelKind::Loop(l) = &p.kernels[0].kind else { panic!("not a loop") };
    assert_eq!(l.row_dims, 1);
}

#[test]
fn layer_norm_written_out_is_one_row_kernel() {
    for dt in [DType::F32, DType::BF16] {
        let mut b = B::default();
        let x = b.param(&[2, 33, 256], dt);
        let g = b.param(&[256], dt);
        let be = b.param(&[256], dt);
        let y = layer_norm(&mut b, x, g, be, 2);
        let p = check_default(&b.out(&[y]));
        assert_eq!(p.kernels.len(), 1, "{dt}");
    }
}

#[test]
fn layer_norm_with_its_statistics_as_outputs_is_one_row_kernel() {
    // PyTorch's native_layer_norm returns the mean and 1/sd beside the
    // result (autograd saves them): they are stored by the pass that
    // computes them, and the normalized rows read them there, so the input
    // is read once.
    let mut b = B::default();
    let x = b.param(&[64, 300], DType::F32);
    let gamma = b.param(&[300], DType::F32);
    let beta = b.param(&[300], DType::F32);
    let mean = b.reduce(ReduceOp::Mean, x, &[1], true);
    let c = b.bin(BinaryOp::Sub, x, mean);
    let sq = b.bin(BinaryOp::Mul, c, c);
    let var = b.reduce(ReduceOp::Mean, sq, &[1], true);
    let eps = b.param(&[], DType::F32);
    let ve = b.bin(BinaryOp::Add, var, eps);
    let rstd = b.un(UnaryOp::Rsqrt, ve);
    let n = b.bin(BinaryOp::Mul, c, rstd);
    let g = b.bin(BinaryOp::Mul, n, gamma);
    let y = b.bin(BinaryOp::Add, g, beta);
    let p = check_default(&b.out(&[y, mean, rstd]));
    assert_eq!(p.kernels.len(), 1, "{}", p.to_json());
    let KernelKind::Loop(l) = &p.kernels[0].kind else { panic!("not a loop") };
    assert_eq!((l.row_dims, l.stores.len()), (1, 3));
}

#[test]
fn broadcast_operands_read_once_per_worker_agree_with_the_reference() {
    // A bias along the rows is read once per worker when every tile starts
    // on its period (rows of a row loop; 8192-element tiles of a flat loop
    // that the period divides) and gathered per tile otherwise: both agree.
    let cases: [(&[usize], &[usize], usize); 6] = [
        (&[40, 1024], &[1024], 0), // flat loop, period divides the tile
        (&[7, 3000], &[3000], 0),  // flat loop, it does not
        (&[9, 4, 512], &[4, 512], 0),
        (&[33, 300], &[300], 1),      // row loop
        (&[6, 3, 700], &[3, 700], 1), // a period longer than a row
        (&[3, 20000], &[20000], 1),   // a row longer than a tile
    ];
    for dt in [DType::F32, DType::BF16] {
        for (xs, bs, row) in cases {
            let mut b = B::default();
            let x = b.param(xs, DType::F32);
            let bias = b.param(bs, dt);
            let bias =
                if dt == DType::F32 { bias } else { b.op(Op::Cast { to: DType::F32 }, &[bias]) };
            let y = b.bin(BinaryOp::Mul, x, bias);
            let y = if row == 1 {
                let m = b.reduce(ReduceOp::Max, y, &[xs.len() - 1], true);
                let z = b.bin(BinaryOp::Sub, y, m);
                b.bin(BinaryOp::Add, z, bias)
            } else {
                b.bin(BinaryOp::Add, y, bias)
            };
            check_default(&b.out(&[y]));
        }
    }
}

#[test]
fn fused_row_ops_are_single_row_kernels() {
    for op in [Op::Softmax { axis: 1 }, Op::LogSoftmax { axis: 1 }] {
        let mut b = B::default();
        let x = b.param(&[40, 129], DType::F32);
        let y = b.op(op, &[x]);
        let z = b.un(UnaryOp::Neg, y);
        let p = check_default(&b.out(&[z]));
        assert_eq!(p.kernels.len(), 1);
    }
    for op in [
        Op::LayerNorm { axes: [1, 2].into_iter().collect() },
        Op::RmsNorm { axes: [2].into_iter().collect() },
    ] {
        let mut b = B::default();
        let x = b.param(&[5, 6, 70], DType::F32);
        let eps = b.param(&[], DType::F32);
        let y = b.op(op, &[x, eps]);
        let p = check_default(&b.out(&[y]));
        assert_eq!(p.kernels.len(), 1);
    }
}

#[test]
fn linear_bias_gelu_is_one_matmul_with_epilogue() {
    let mut b = B::default();
    let x = b.param(&[64, 96], DType::F32);
    let w = b.param(&[128, 96], DType::F32);
    let bias = b.param(&[128], DType::F32);
    let wt = transpose(&mut b, w);
    let h = b.op(Op::MatMul, &[x, wt]);
    let hb = b.bin(BinaryOp::Add, h, bias);
    let y = gelu(&mut b, hb, DType::F32);
    let p = check_default(&b.out(&[y]));
    assert_eq!(p.kernels.len(), 1, "{}", p.to_json());
    let KernelKind::MatMul(mm) = &p.kernels[0].kind else { panic!("not a matmul") };
    assert!(mm.epilogue.is_some());
    assert_eq!(mm.rhs, rewrite_rules::program::View::Transposed);
}

#[test]
fn backend_stats_count_each_kernel_by_kind_with_the_products_flops() {
    let mut b = B::default();
    let x = b.param(&[3, 64, 96], DType::F32);
    let w = b.param(&[128, 96], DType::F32);
    let wt = transpose(&mut b, w);
    let h = b.op(Op::MatMul, &[x, wt]);
    let y = softmax(&mut b, h, 2);
    let trace = b.out(&[y]);
    let fused = plan(&trace, &PlanConfig::default()).unwrap();
    let unfused = Program::unfused(&trace);
    let inputs = [random_input(trace.meta(x), 1), random_input(trace.meta(w), 2)];
    let be = backend();
    assert_eq!(be.stats().kernels, runtime::KernelStats::default());
    run_on(&be, &fused, &inputs).unwrap();
    let after_fused = be.stats().kernels;
    assert_eq!(after_fused.matmul.runs, 1);
    assert_eq!(after_fused.loops.runs as usize, loops(&fused));
    assert_eq!(after_fused.single.runs as usize, fused.kernels.len() - 1 - loops(&fused));
    assert_eq!(after_fused.matmul_flops, 2 * 3 * 64 * 96 * 128);
    // Unfused, every op is a single kernel; the backend's counts add up over
    // its executables.
    run_on(&be, &unfused, &inputs).unwrap();
    let total = be.stats().kernels;
    assert_eq!(total.single.runs - after_fused.single.runs, unfused.kernels.len() as u64);
    assert_eq!((total.matmul.runs, total.matmul_flops), (1, after_fused.matmul_flops));
    assert!(total.matmul.ns > 0 && total.single.ns > after_fused.single.ns);
}

#[test]
fn adam_is_one_kernel_with_three_outputs() {
    let p = check_default(&adam(5000));
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].outputs.len(), 3);
}

#[test]
fn matmul_and_reductions_are_never_duplicated() {
    // A matmul and a reduction each read by two consumers in different iteration spaces.
    let mut b = B::default();
    let x = b.param(&[16, 32], DType::F32);
    let w = b.param(&[32, 24], DType::F32);
    let h = b.op(Op::MatMul, &[x, w]);
    let e = b.un(UnaryOp::Exp, h);
    let s = b.reduce(ReduceOp::Sum, h, &[1], false);
    let t = b.un(UnaryOp::Tanh, s);
    let big = b.reduce(ReduceOp::Sum, e, &[0], true);
    let p = check_default(&b.out(&[e, t, big]));
    for n in [h, s] {
        assert_eq!(p.kernels_of(n).len(), 1, "node {n} computed in {:?}", p.kernels_of(n));
    }
}

#[test]
fn cuts_say_why() {
    let mut b = B::default();
    let x = b.param(&[8, 8], DType::F32);
    let e = b.un(UnaryOp::Exp, x);
    let s = b.reduce(ReduceOp::Sum, e, &[0], false);
    let y = b.un(UnaryOp::Neg, s);
    let p = check_default(&b.out(&[y]));
    assert!(p.why_cut(x, e).is_some());
    assert!(p.why_cut(e, s).is_some(), "{:?}", p.cuts);
    assert_eq!(p.kernels.len(), 3);
    let back = Program::from_json(&p.to_json()).unwrap();
    assert_eq!(back.fingerprint(), p.fingerprint());
}

// ---------------------------------------------------------------- agreement

#[test]
fn broadcasting_and_scalars() {
    let mut b = B::default();
    let x = b.param(&[4, 1, 30], DType::F32);
    let y = b.param(&[5, 1], DType::F32);
    let s = b.param(&[], DType::F32);
    let a = b.bin(BinaryOp::Mul, x, y);
    let c = b.bin(BinaryOp::Sub, a, s);
    let e = b.op(Op::Expand { shape: [2, 4, 5, 30].into_iter().collect() }, &[c]);
    let d = b.bin(BinaryOp::Maximum, e, x);
    let lt = b.bin(BinaryOp::Lt, d, y);
    let w = b.op(Op::Where, &[lt, d, x]);
    let p = check_default(&b.out(&[w, lt]));
    assert_eq!(p.kernels.len(), 1);
}

#[test]
fn reductions_over_every_axis() {
    for kind in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
        for axes in [vec![0], vec![1], vec![2], vec![1, 2], vec![0, 1, 2], vec![0, 2]] {
            for keepdim in [true, false] {
                let mut b = B::default();
                let x = b.param(&[3, 7, 11], DType::F32);
                let h = b.full(0.5, DType::F32);
                let xs = b.bin(BinaryOp::Mul, x, h);
                let e = b.un(UnaryOp::Exp, xs);
                let r = b.reduce(kind, e, &axes, keepdim);
                let y = b.un(UnaryOp::Log, r);
                check_default(&b.out(&[y, r]));
            }
        }
    }
}

#[test]
fn long_rows_reduce_in_chunks() {
    for kind in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
        for axes in [vec![1], vec![0, 1]] {
            let mut b = B::default();
            let x = b.param(&[3, 50_001], DType::F32);
            let c = b.full(1e-5, DType::F32);
            let xs = b.bin(BinaryOp::Mul, x, c);
            let e = b.un(UnaryOp::Exp, xs);
            let r = b.reduce(kind, e, &axes, false);
            let y = b.un(UnaryOp::Log, r);
            let p = check_default(&b.out(&[y, e]));
            assert!(p.kernels.len() <= 2);
        }
    }
}

#[test]
fn reduction_results_feed_row_consumers() {
    // keepdim=false results combined with other per-row values.
    let mut b = B::default();
    let x = b.param(&[12, 50], DType::F32);
    let r = b.param(&[12], DType::F32);
    let s = b.reduce(ReduceOp::Sum, x, &[1], false);
    let m = b.reduce(ReduceOp::Max, x, &[1], false);
    let a = b.bin(BinaryOp::Mul, s, r);
    let y = b.bin(BinaryOp::Add, a, m);
    let p = check_default(&b.out(&[y]));
    assert_eq!(p.kernels.len(), 1);
}

#[test]
fn matmuls_with_transposes_and_batches() {
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let mut b = B::default();
        let x = b.param(&[2, 3, 20, 16], dt);
        let y = b.param(&[3, 24, 16], dt);
        let yt = transpose(&mut b, y);
        let z = b.op(Op::MatMul, &[x, yt]);
        let xt = transpose(&mut b, x);
        let w = b.op(Op::MatMul, &[xt, x]);
        let r = b.param(&[24], dt);
        let zr = b.bin(BinaryOp::Add, z, r);
        check_default(&b.out(&[zr, w]));
    }
}

#[test]
fn linear_layers_over_a_batch_match_folded_or_not() {
    // `x @ w.t() + bias` with x of rank 3 and w of rank 2: every batch reads
    // the same weight, so the CPU backend runs one product over the batch's
    // rows when the lhs rows follow one another, and one per batch when not.
    for dt in [DType::F32, DType::BF16] {
        let mut b = B::default();
        let w = b.param(&[24, 16], dt);
        let wt = transpose(&mut b, w);
        let bias = b.param(&[24], dt);
        let mut outs = Vec::new();
        // Contiguous rows: folded.
        let x = b.param(&[3, 5, 16], dt);
        outs.push(b.op(Op::MatMul, &[x, wt]));
        // Batch-major view of a [5, 3, 16] tensor: the batches interleave.
        let y = b.param(&[5, 3, 16], dt);
        let yp = b.op(Op::Permute { perm: [1, 0, 2].into_iter().collect() }, &[y]);
        outs.push(b.op(Op::MatMul, &[yp, wt]));
        // Rows at stride 1, columns at stride 15: folded, with that column stride.
        let z = b.param(&[16, 15], dt);
        let zr = b.op(Op::Reshape { shape: [16, 3, 5].into_iter().collect() }, &[z]);
        let zp = b.op(Op::Permute { perm: [1, 2, 0].into_iter().collect() }, &[zr]);
        outs.push(b.op(Op::MatMul, &[zp, wt]));
        // Five of six rows per batch: a gap between the batches.
        let v = b.param(&[3, 6, 16], dt);
        let vs = b.op(Op::Slice { axis: 1, start: 0, stop: 5, step: 1 }, &[v]);
        outs.push(b.op(Op::MatMul, &[vs, wt]));
        // More rows than the gemm crate's register block.
        let u = b.param(&[2, 20, 16], dt);
        outs.push(b.op(Op::MatMul, &[u, wt]));
        let with_bias: Vec<NodeId> = outs.iter().map(|&o| b.bin(BinaryOp::Add, o, bias)).collect();
        check_default(&b.out(&with_bias));
    }
}

#[test]
fn a_large_linear_layer_splits_its_columns_and_matches() {
    // Enough multiply-adds for the product to run on every core, and an
    // output width (200) that splits into column blocks with a ragged last.
    let mut b = B::default();
    let x = b.param(&[130, 64], DType::F32);
    let w = b.param(&[200, 64], DType::F32);
    let wt = transpose(&mut b, w);
    let y = b.op(Op::MatMul, &[x, wt]);
    check_default(&b.out(&[y]));
}

#[test]
fn attention_head_split_is_read_in_place() {
    let (bt, s, h, d) = (2, 16, 4, 8);
    let mut b = B::default();
    let q = b.param(&[bt, s, h * d], DType::F32);
    let k = b.param(&[bt, s, h * d], DType::F32);
    let split = |b: &mut B, t: NodeId| {
        let r = b.op(Op::Reshape { shape: [bt, s, h, d].into_iter().collect() }, &[t]);
        b.op(Op::Permute { perm: [0, 2, 1, 3].into_iter().collect() }, &[r])
    };
    let qh = split(&mut b, q);
    let kh = split(&mut b, k);
    let kt = transpose(&mut b, kh);
    let sc = b.op(Op::MatMul, &[qh, kt]);
    let sm = softmax(&mut b, sc, 3);
    let p = check_default(&b.out(&[sm]));
    assert_eq!(p.kernels.len(), 2, "{}", p.to_json());
}

#[test]
fn casts_and_mixed_dtypes() {
    let mut b = B::default();
    let x = b.param(&[100], DType::F32);
    let i = b.param(&[100], DType::I32);
    let xb = b.op(Op::Cast { to: DType::BF16 }, &[x]);
    let xf = b.op(Op::Cast { to: DType::F32 }, &[xb]);
    let fi = b.op(Op::Cast { to: DType::F32 }, &[i]);
    let s = b.bin(BinaryOp::Add, xf, fi);
    let gt = b.bin(BinaryOp::Gt, s, x);
    let gf = b.op(Op::Cast { to: DType::F16 }, &[gt]);
    let nb = b.op(Op::Cast { to: DType::Bool }, &[s]);
    let ni = b.op(Op::Cast { to: DType::I32 }, &[s]);
    let p = check_default(&b.out(&[s, gf, nb, ni]));
    assert!(p.kernels.len() <= 2, "{}", p.to_json());
}

#[test]
fn slices_permutes_and_int_work() {
    let mut b = B::default();
    let x = b.param(&[6, 10], DType::F32);
    let sl = b.op(Op::Slice { axis: 1, start: 1, stop: 9, step: 2 }, &[x]);
    let pe = b.op(Op::Permute { perm: [1, 0].into_iter().collect() }, &[sl]);
    let e = b.un(UnaryOp::Exp, pe);
    let c = b.op(Op::Concat { axis: 0 }, &[e, pe]);
    let am =
        b.op(Op::ArgReduce { kind: trace_ir::ArgReduceOp::Argmax, axis: 1, keepdim: false }, &[c]);
    let i2 = b.bin(BinaryOp::Add, am, am);
    let r = b.op(Op::Reshape { shape: [2, 30].into_iter().collect() }, &[x]);
    let t = b.un(UnaryOp::Tanh, r);
    check_default(&b.out(&[c, i2, t]));
}

#[test]
fn every_unary_and_binary_op() {
    for kind in UnaryOp::ALL {
        if kind == UnaryOp::LogicalNot {
            continue;
        }
        for dt in [DType::F32, DType::BF16] {
            let mut b = B::default();
            let x = b.param(&[257], dt);
            let y = b.un(kind, x);
            let z = b.bin(BinaryOp::Add, y, x);
            check_default(&b.out(&[z]));
        }
    }
    for kind in BinaryOp::ALL {
        let dt = if kind.is_logical() { DType::Bool } else { DType::F32 };
        let mut b = B::default();
        let x = b.param(&[9, 31], dt);
        let y = b.param(&[31], dt);
        let z = b.bin(kind, x, y);
        let w = b.bin(kind, y, x);
        check_default(&b.out(&[z, w]));
    }
}

#[test]
fn per_op_rounding_is_bit_identical_on_bf16_arithmetic() {
    let mut b = B::default();
    let x = b.param(&[3000], DType::BF16);
    let y = b.param(&[3000], DType::BF16);
    let mut v = x;
    for k in [
        BinaryOp::Mul,
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
    ] {
        v = b.bin(k, v, y);
    }
    let v = b.un(UnaryOp::Sqrt, v);
    let t = b.out(&[v]);
    let cfg = PlanConfig { rounding: Rounding::PerOp, ..PlanConfig::default() };
    let fused = plan(&t, &cfg).unwrap();
    assert_eq!(fused.kernels.len(), 1);
    let inputs: Vec<HostData> =
        t.parameters().iter().map(|&p| random_input(t.meta(p), p as u64 + 3)).collect();
    let got = run_program(&fused, &inputs).unwrap();
    let want = run_program(&Program::unfused(&t), &inputs).unwrap();
    assert_eq!(
        got[0].to_f64_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want[0].to_f64_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn limit_splits_long_chains() {
    let mut b = B::default();
    let x = b.param(&[1000], DType::F32);
    let mut v = x;
    for i in 0..40 {
        v = b.un(if i % 2 == 0 { UnaryOp::Sin } else { UnaryOp::Tanh }, v);
    }
    let cfg = PlanConfig { max_kernel_ops: 16, ..PlanConfig::default() };
    let p = check(&b.out(&[v]), &cfg);
    assert!(p.kernels.len() >= 3, "{} kernels", p.kernels.len());
    assert!(p.cuts.iter().any(|c| c.reason == rewrite_rules::program::CutReason::Limit));
}

// ---------------------------------------------------------------- memory and sizes

#[test]
fn fused_chain_allocates_only_its_output() {
    let n = 1 << 20;
    let tracker = MemoryTracker::new();
    let be = CpuBackend::new(tracker.clone());
    let mut b = B::default();
    let x = b.param(&[n], DType::F32);
    let mut v = x;
    for kind in [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Sqrt,
        UnaryOp::Log,
        UnaryOp::Abs,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
    ] {
        v = b.un(kind, v);
    }
    let v = b.bin(BinaryOp::Add, v, x);
    let t = b.out(&[v]);
    let p = plan(&t, &PlanConfig::default()).unwrap();
    assert_eq!(p.kernels.len(), 1);
    let exe = be.compile(&p).unwrap();
    let input = be
        .upload(Meta::new([n].into_iter().collect(), DType::F32), random_input(t.meta(x), 1))
        .unwrap();
    tracker.reset_peak();
    let out = exe.run(vec![input.clone()]).unwrap();
    let stats = tracker.stats();
    assert!(
        stats.peak_bytes <= 2 * n * 4,
        "peak {} > input + output {}",
        stats.peak_bytes,
        2 * n * 4
    );
    drop((out, input));
    assert_eq!(tracker.stats().live_bytes, 0);
}

#[test]
fn loop_kernels_run_on_new_sizes() {
    // Compiled for [4, 100] rows of 100; run on [7, 64].
    let mut b = B::default();
    let x = b.param(&[4, 100], DType::F32);
    let g = b.param(&[100], DType::F32);
    let be_ = b.param(&[100], DType::F32);
    let y = layer_norm(&mut b, x, g, be_, 1);
    let e = gelu(&mut b, y, DType::F32);
    let t = b.out(&[e]);
    let fused = plan(&t, &PlanConfig::default()).unwrap();
    assert_eq!(fused.kernels.len(), 1);
    let be = backend();
    let exe = be.compile(&fused).unwrap();
    let metas = [
        Meta::new([7, 64].into_iter().collect(), DType::F32),
        Meta::new([64].into_iter().collect(), DType::F32),
        Meta::new([64].into_iter().collect(), DType::F32),
        Meta::new(Default::default(), DType::F32),
    ];
    let data: Vec<HostData> =
        metas.iter().enumerate().map(|(i, m)| random_input(m, i as u64 + 9)).collect();
    let bufs =
        metas.iter().zip(&data).map(|(m, d)| be.upload(m.clone(), d.clone()).unwrap()).collect();
    let out = exe.run(bufs).unwrap();
    assert_eq!(out[0].meta().shape.as_slice(), &[7, 64]);
    // The same trace built for the new sizes, unfused, is the reference.
    let mut b = B::default();
    let x = b.param(&[7, 64], DType::F32);
    let g = b.param(&[64], DType::F32);
    let be_ = b.param(&[64], DType::F32);
    let y = layer_norm(&mut b, x, g, be_, 1);
    let e = gelu(&mut b, y, DType::F32);
    let want = run_program(&Program::unfused(&b.out(&[e])), &data).unwrap();
    assert_close("resized", &be.download(&out[0]).unwrap(), &want[0]);
}

// ---------------------------------------------------------------- SIMD off

/// A backend built `with_simd(false)` runs the fused kernels' portable
/// code. Its results match the reference within the fused tolerances, as
/// the default backend's do, and match the default's within them too (the
/// paths differ only where one fuses a multiply-add); exactly rounded
/// arithmetic (Adam: +, -, *, /, sqrt) is bit-identical on both.
#[test]
fn fused_kernels_without_simd_agree_with_the_default() {
    let simd = backend();
    let portable = backend().with_simd(false);
    let mut traces = Vec::new();
    // Many rows of elementwise and row work (parallel tiles).
    let mut b = B::default();
    let x = b.param(&[96, 400], DType::F32);
    let g = gelu(&mut b, x, DType::F32);
    let s = softmax(&mut b, g, 1);
    traces.push(("gelu then softmax", b.out(&[s, g])));
    // Rows longer than a tile (walked in chunks).
    let mut b = B::default();
    let x = b.param(&[2, 20_000], DType::F32);
    let c = b.full(1e-3, DType::F32);
    let xs = b.bin(BinaryOp::Mul, x, c);
    let e = b.un(UnaryOp::Exp, xs);
    let r = b.reduce(ReduceOp::Sum, e, &[1], false);
    let y = b.un(UnaryOp::Log, r);
    traces.push(("long rows", b.out(&[y, e])));
    // A matmul epilogue.
    let mut b = B::default();
    let x = b.param(&[64, 96], DType::F32);
    let w = b.param(&[128, 96], DType::F32);
    let bias = b.param(&[128], DType::F32);
    let wt = transpose(&mut b, w);
    let h = b.op(Op::MatMul, &[x, wt]);
    let hb = b.bin(BinaryOp::Add, h, bias);
    let y = gelu(&mut b, hb, DType::F32);
    traces.push(("linear, bias, gelu", b.out(&[y])));
    // Half-precision storage.
    let mut b = B::default();
    let x = b.param(&[32, 300], DType::BF16);
    let gamma = b.param(&[300], DType::BF16);
    let beta = b.param(&[300], DType::BF16);
    let y = layer_norm(&mut b, x, gamma, beta, 1);
    traces.push(("bf16 layer_norm", b.out(&[y])));
    traces.push(("adam", adam(50_000)));

    let mut differing = 0;
    for (what, t) in &traces {
        let fused = plan(t, &PlanConfig::default()).unwrap_or_else(|e| panic!("{what}: plan: {e}"));
        assert!(
            fused.kernels.iter().any(|k| !matches!(k.kind, KernelKind::Single { .. })),
            "{what}: nothing fused"
        );
        let inputs: Vec<HostData> = t
            .parameters()
            .iter()
            .enumerate()
            .map(|(i, &p)| random_input(t.meta(p), 31 + i as u64))
            .collect();
        let want = run_on(&simd, &Program::unfused(t), &inputs).unwrap();
        let got = run_on(&simd, &fused, &inputs).unwrap();
        let scalar = run_on(&portable, &fused, &inputs).unwrap();
        for (k, ((g, s), w)) in got.iter().zip(&scalar).zip(&want).enumerate() {
            assert_close(&format!("{what}, output {k}, default"), g, w);
            assert_close(&format!("{what}, output {k}, without simd"), s, w);
            assert_close(&format!("{what}, output {k}, without simd vs default"), s, g);
            let (g, s) = (g.to_f64_vec(), s.to_f64_vec());
            let same = |(a, b): (&f64, &f64)| a.to_bits() == b.to_bits();
            if *what == "adam" {
                assert!(g.iter().zip(&s).all(same), "{what}, output {k}: not bit-identical");
            }
            differing += g.iter().zip(&s).filter(|&p| !same(p)).count();
        }
    }
    // Where this CPU has the AVX2 path, the portable one (no FMA on
    // x86-64) rounds some transcendental differently: the flag reaches the
    // kernels.
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        assert!(differing > 0, "the portable path gave bit-identical results everywhere");
    }
    let _ = differing;
}

// ---------------------------------------------------------------- random traces

mod props {
    use super::*;
    use proptest::prelude::*;

    /// One step of a random trace: an op kind and picks among existing nodes.
    #[derive(Debug, Clone)]
    enum Step {
        Unary(u8, usize),
        Binary(u8, usize, usize),
        Reduce(u8, usize, u8, bool),
        Expand(usize),
        Reverse(usize),
        Flatten(usize),
        MatMul(usize, usize),
        Where(usize, usize),
        Softmax(usize),
        Output(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        let i = 0usize..64;
        prop_oneof![
            3 => (0u8..6, i.clone()).prop_map(|(k, a)| Step::Unary(k, a)),
            4 => (0u8..5, i.clone(), i.clone()).prop_map(|(k, a, b)| Step::Binary(k, a, b)),
            2 => (0u8..3, i.clone(), 0u8..8, any::<bool>()).prop_map(|(k, a, ax, kd)| Step::Reduce(k, a, ax, kd)),
            1 => i.clone().prop_map(Step::Expand),
            1 => i.clone().prop_map(Step::Reverse),
            1 => i.clone().prop_map(Step::Flatten),
            1 => (i.clone(), i.clone()).prop_map(|(a, b)| Step::MatMul(a, b)),
            1 => (i.clone(), i.clone()).prop_map(|(a, b)| Step::Where(a, b)),
            1 => i.clone().prop_map(Step::Softmax),
            2 => i.prop_map(Step::Output),
        ]
    }

    /// Builds a trace from the steps, skipping the ones that do not apply.
    fn build(steps: &[Step]) -> Trace {
        let mut t = Trace::new();
        let mut floats = Vec::new();
        for s in [vec![4, 6], vec![6], vec![1, 6], vec![4, 1], vec![], vec![2, 4, 6], vec![6, 4]] {
            floats.push(t.push_parameter(Meta::new(s.as_slice().into(), DType::F32)));
        }
        let cond = t.push_parameter(Meta::new([4, 6].into_iter().collect(), DType::Bool));
        let mut outputs = Vec::new();
        for s in steps {
            let pick = |i: usize| floats[i % floats.len()];
            let rank = |t: &Trace, n: NodeId| t.meta(n).shape.len();
            let r = match *s {
                Step::Unary(k, a) => {
                    let kind = [
                        UnaryOp::Neg,
                        UnaryOp::Abs,
                        UnaryOp::Tanh,
                        UnaryOp::Sigmoid,
                        UnaryOp::Relu,
                        UnaryOp::Sin,
                    ][k as usize];
                    t.push(Op::Unary { kind }, &[pick(a)])
                }
                Step::Binary(k, a, b) => {
                    let kind = [
                        BinaryOp::Add,
                        BinaryOp::Sub,
                        BinaryOp::Mul,
                        BinaryOp::Maximum,
                        BinaryOp::Minimum,
                    ][k as usize];
                    t.push(Op::Binary { kind }, &[pick(a), pick(b)])
                }
                Step::Reduce(k, a, ax, keepdim) => {
                    let x = pick(a);
                    let axes: Vec<usize> =
                        (0..rank(&t, x)).filter(|d| ax & (1 << d) != 0).collect();
                    let kind = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Mean][k as usize];
                    t.push(Op::Reduce { kind, axes: axes.as_slice().into(), keepdim }, &[x])
                }
                Step::Expand(a) => {
                    let x = pick(a);
                    let mut shape: trace_ir::Shape = [3].into_iter().collect();
                    shape.extend_from_slice(&t.meta(x).shape);
                    t.push(Op::Expand { shape }, &[x])
                }
                Step::Reverse(a) => {
                    let x = pick(a);
                    let perm: trace_ir::Axes = (0..rank(&t, x)).rev().collect();
                    t.push(Op::Permute { perm }, &[x])
                }
                Step::Flatten(a) => {
                    let x = pick(a);
                    t.push(Op::Reshape { shape: [t.meta(x).numel()].into_iter().collect() }, &[x])
                }
                Step::MatMul(a, b) => t.push(Op::MatMul, &[pick(a), pick(b)]),
                Step::Where(a, b) => t.push(Op::Where, &[cond, pick(a), pick(b)]),
                Step::Softmax(a) => {
                    let x = pick(a);
                    match rank(&t, x) {
                        0 => continue,
                        r => t.push(Op::Softmax { axis: r - 1 }, &[x]),
                    }
                }
                Step::Output(a) => {
                    outputs.push(pick(a));
                    continue;
                }
            };
            if let Ok(n) = r {
                if t.meta(n).numel() <= 4096 {
                    floats.push(n);
                }
            }
        }
        outputs.extend(floats.iter().rev().take(2));
        t.outputs = outputs;
        t
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Fused and unfused runs of random traces agree (within 1e-4
        /// relative to 1 + |reference|: random chains may cancel).
        #[test]
        fn fused_matches_unfused(steps in proptest::collection::vec(step(), 1..24)) {
            let t = build(&steps);
            let fused = plan(&t, &PlanConfig::default()).map_err(|e| TestCaseError::fail(format!("plan: {e}")))?;
            let inputs: Vec<HostData> = t.parameters().iter().enumerate().map(|(i, &p)| random_input(t.meta(p), 5 + i as u64)).collect();
            let want = run_program(&Program::unfused(&t), &inputs).map_err(|e| TestCaseError::fail(format!("unfused: {e}")))?;
            let got = run_program(&fused, &inputs).map_err(|e| TestCaseError::fail(format!("fused: {e}\n{}", fused.to_json())))?;
            prop_assert_eq!(got.len(), want.len());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                prop_assert_eq!(g.dtype(), w.dtype());
                let (g, w) = (g.to_f64_vec(), w.to_f64_vec());
                prop_assert_eq!(g.len(), w.len());
                for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                    let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-4 * (1.0 + b.abs());
                    prop_assert!(ok, "output {} element {}: fused {} vs reference {}\n{:?}", k, i, a, b, t);
                }
            }
        }
    }
}
