//! Differential checking: run one trace two ways and compare the results
//! within a tolerance per dtype. The tests, the fuzz targets and users who
//! bisect a numerical difference all use this one definition of "agree".
//!
//! Tolerances (|a - b| ≤ atol + rtol·|b|, NaN equals NaN, infinities must
//! match in sign):
//!
//! | dtype | rtol | atol | why |
//! | --- | --- | --- | --- |
//! | f32 | 1e-5 | 1e-5 | fused kernels use polynomial transcendentals (≤ a few ulp) and other summation orders |
//! | f16 | 8e-3 | 8e-3 | eager rounds every op to f16 (2^-11), fused rounds once; a later exp or division amplifies the difference |
//! | bf16 | 6.25e-2 | 6.25e-2 | the same with bf16 (2^-8) |
//!
//! An f32 output computed from bf16 or f16 values is held to the looser
//! tolerance (see [`compare`]).
//! | i32, i64, bool | 0 | 0 | exact |

use runtime::HostData;
use trace_ir::{DType, Meta};

/// How close two values of a dtype must be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

/// The written tolerance of a dtype (see the module table).
pub fn tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance { rtol: 1e-5, atol: 1e-5 },
        DType::F16 => Tolerance { rtol: 8e-3, atol: 8e-3 },
        DType::BF16 => Tolerance { rtol: 6.25e-2, atol: 6.25e-2 },
        DType::I32 | DType::I64 | DType::Bool => Tolerance { rtol: 0.0, atol: 0.0 },
    }
}

/// True when `a` and `b` agree within `tol`.
pub fn close(a: f64, b: f64, tol: Tolerance) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    if a.is_infinite() || b.is_infinite() {
        return a == b;
    }
    (a - b).abs() <= tol.atol + tol.rtol * b.abs()
}

/// Compares two result sets; the error names the output, the index and both
/// values. Each output is held to its dtype's tolerance, or to `loosest`'s
/// when that is looser: a fused f32 output computed from bf16 values differs
/// from the eager one by bf16 roundings the fused kernel did not do.
pub fn compare(
    actual: &[HostData],
    expected: &[HostData],
    loosest: Option<DType>,
) -> Result<(), String> {
    if actual.len() != expected.len() {
        return Err(format!("{} outputs, expected {}", actual.len(), expected.len()));
    }
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        if a.dtype() != e.dtype() || a.len() != e.len() {
            return Err(format!(
                "output {i}: {} x {} vs {} x {}",
                a.dtype(),
                a.len(),
                e.dtype(),
                e.len()
            ));
        }
        let own = tolerance(e.dtype());
        let tol = match loosest.map(tolerance) {
            Some(l) if e.dtype().is_float() && l.rtol > own.rtol => l,
            _ => own,
        };
        let (av, ev) = (a.to_f64_vec(), e.to_f64_vec());
        if let Some(j) = (0..av.len()).find(|&j| !close(av[j], ev[j], tol)) {
            return Err(format!(
                "output {i} ({}), element {j}: {} vs {} (tolerance {tol:?})",
                e.dtype(),
                av[j],
                ev[j]
            ));
        }
    }
    Ok(())
}

/// Deterministic random data for parameters: floats uniform in [-2, 2),
/// integers in [-4, 4], bools half true.
pub fn random_inputs(params: &[Meta], seed: u64) -> Vec<HostData> {
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    params
        .iter()
        .map(|m| {
            let n = m.numel();
            let unit: Vec<f64> =
                (0..n).map(|_| (next() >> 11) as f64 / (1u64 << 53) as f64).collect();
            match m.dtype {
                DType::F32 => HostData::F32(unit.iter().map(|u| (u * 4.0 - 2.0) as f32).collect()),
                DType::BF16 => HostData::BF16(
                    unit.iter().map(|u| half::bf16::from_f64(u * 4.0 - 2.0)).collect(),
                ),
                DType::F16 => {
                    HostData::F16(unit.iter().map(|u| half::f16::from_f64(u * 4.0 - 2.0)).collect())
                }
                DType::I32 => HostData::I32(unit.iter().map(|u| (u * 9.0) as i32 - 4).collect()),
                DType::I64 => HostData::I64(unit.iter().map(|u| (u * 9.0) as i64 - 4).collect()),
                DType::Bool => HostData::Bool(unit.iter().map(|u| *u < 0.5).collect()),
            }
        })
        .collect()
}

/// Runs `trace` op by op on a fresh native CPU backend: the reference every
/// optimized or fused result is compared with.
pub fn run_reference(
    trace: &trace_ir::Trace,
    inputs: &[HostData],
) -> trace_ir::Result<Vec<HostData>> {
    use runtime::{Backend, CpuBackend, MemoryTracker};
    let backend = CpuBackend::new(MemoryTracker::new());
    let params = trace.parameters();
    let buffers = params
        .iter()
        .zip(inputs)
        .map(|(&p, data)| backend.upload(trace.meta(p).clone(), data.clone()))
        .collect::<trace_ir::Result<Vec<_>>>()?;
    let exe = backend.compile(&rewrite_rules::program::Program::unfused(trace))?;
    exe.run(buffers)?.iter().map(|b| backend.download(b)).collect()
}

/// Runs `trace` the way DeferAndFuse does (e-graph rewrites, the kernel
/// planner, fused kernels on the native CPU backend), without any cache.
pub fn run_fused(
    trace: &trace_ir::Trace,
    inputs: &[HostData],
    config: &crate::Config,
) -> trace_ir::Result<Vec<HostData>> {
    use runtime::{CpuBackend, MemoryTracker};
    run_fused_on(trace, inputs, config, &CpuBackend::new(MemoryTracker::new()))
}

/// Runs `trace` the way DeferAndFuse does on `backend`: e-graph rewrites,
/// then the kernel planner, or one unfused module for a backend that fuses
/// itself (PJRT), without any cache.
pub fn run_fused_on(
    trace: &trace_ir::Trace,
    inputs: &[HostData],
    config: &crate::Config,
    backend: &dyn runtime::Backend,
) -> trace_ir::Result<Vec<HostData>> {
    let optimized = rewrite_rules::optimize(trace, &config.effective_rewrite())?.trace;
    let program = if backend.fuses_itself() {
        rewrite_rules::program::Program::unfused(&optimized)
    } else {
        let plan_config = rewrite_rules::planner::PlanConfig {
            rounding: config.fused_rounding,
            ..Default::default()
        };
        rewrite_rules::planner::plan(&optimized, &plan_config)?
    };
    let buffers = trace
        .parameters()
        .iter()
        .zip(inputs)
        .map(|(&p, data)| backend.upload(trace.meta(p).clone(), data.clone()))
        .collect::<trace_ir::Result<Vec<_>>>()?;
    let exe = backend.compile(&program)?;
    exe.run(buffers)?.iter().map(|b| backend.download(b)).collect()
}

/// The differential check the fuzz target and the property tests share: a
/// trace generated from `bytes` (made well conditioned, see below) runs fused
/// (with per-op rounding) and op by op on random inputs, and the results must
/// agree.
///
/// Ops with discontinuities (comparisons, floor, sign, casts to integers,
/// arg-reductions) are left out of these traces: a 1-ulp difference from a
/// fused transcendental may legitimately flip them, which would hide real
/// bugs behind noise. They are covered by exact tests elsewhere.
pub fn check_generated(bytes: &[u8]) -> Result<(), String> {
    check_generated_on(bytes, &runtime::CpuBackend::new(runtime::MemoryTracker::new()))
}

/// [`check_generated`] with the fused side run on `backend` (see [`run_fused_on`]).
pub fn check_generated_on(bytes: &[u8], backend: &dyn runtime::Backend) -> Result<(), String> {
    let mut source = trace_ir::generate::Bytes::new(bytes);
    let generated = trace_ir::generate::random_trace(&mut source, 12);
    let trace = continuous_only(&generated.trace);
    let seed = trace_ir::signature::stable_hash64(bytes);
    let inputs = random_inputs(&generated.params, seed);
    let expected = run_reference(&trace, &inputs).map_err(|e| format!("reference failed: {e}"))?;
    // Per-op rounding makes fused bf16/f16 kernels round where eager does, so
    // the check sees kernel errors rather than the (documented, intended)
    // difference of rounding once, which ill-conditioned ops like sin of a
    // large argument amplify without bound.
    let config =
        crate::Config { fused_rounding: crate::FusedRounding::PerOp, ..crate::Config::default() };
    let actual = run_fused_on(&trace, &inputs, &config, backend)
        .map_err(|e| format!("fused run failed: {e}\n{}", trace.to_json()))?;
    compare(&actual, &expected, loosest_float(&trace))
        .map_err(|e| format!("{e}\ntrace: {}", trace.to_json()))?;
    if backend.fuses_itself() {
        return Ok(()); // its executables are compiled per size
    }
    check_resized(&trace, &config, seed)
}

/// The shape-polymorphism half of [`check_generated`]: the program planned
/// for `trace` and its compiled executable, resized to other sizes of the
/// same shape class (every size `d ≥ 2` becomes `2d + 1`), must compute what
/// the op-by-op reference computes on a trace recorded at those sizes. Traces
/// that are invalid or of another class at those sizes are skipped, as are
/// programs that are not resizable (they are planned anew in the engine).
fn check_resized(trace: &trace_ir::Trace, config: &crate::Config, seed: u64) -> Result<(), String> {
    use runtime::{Backend, CpuBackend, MemoryTracker};
    let grow = |d: usize| if d >= 2 { 2 * d + 1 } else { d };
    let Some(resized) = resize_trace(trace, grow) else { return Ok(()) };
    let optimized = rewrite_rules::optimize(trace, &config.effective_rewrite())
        .map_err(|e| e.to_string())?
        .trace;
    let plan_config = rewrite_rules::planner::PlanConfig {
        rounding: config.fused_rounding,
        ..Default::default()
    };
    let program =
        rewrite_rules::planner::plan(&optimized, &plan_config).map_err(|e| e.to_string())?;
    let (from, to) = (trace_ir::ShapeClass::of(trace), trace_ir::ShapeClass::of(&resized));
    if from.signature != to.signature {
        // Sizes that do not follow the map (a slice's length, a merged
        // reshape dimension): another class, which the engine plans anew.
        return Ok(());
    }
    let Some(program2) = program.resized(from.size_map(&to)) else { return Ok(()) };
    let backend = CpuBackend::new(MemoryTracker::new());
    let exe = backend.compile(&program).map_err(|e| e.to_string())?;
    let exe2 = exe.resized(&program2).ok_or("the native backend refused a resized program")?;
    let inputs = random_inputs(
        &resized.parameters().iter().map(|&p| resized.meta(p).clone()).collect::<Vec<_>>(),
        seed ^ 1,
    );
    let expected =
        run_reference(&resized, &inputs).map_err(|e| format!("reference failed: {e}"))?;
    let buffers = resized
        .parameters()
        .iter()
        .zip(&inputs)
        .map(|(&p, data)| backend.upload(resized.meta(p).clone(), data.clone()))
        .collect::<trace_ir::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    let actual = exe2
        .run(buffers)
        .and_then(|outs| {
            outs.iter().map(|b| backend.download(b)).collect::<trace_ir::Result<Vec<_>>>()
        })
        .map_err(|e| format!("resized run failed: {e}\ntrace: {}", trace.to_json()))?;
    compare(&actual, &expected, loosest_float(&resized))
        .map_err(|e| format!("resized: {e}\ntrace: {}", trace.to_json()))
}

/// `trace` recorded again with every size `d` of its shapes and shape
/// attributes replaced by `map(d)`; `None` when that is not a valid trace.
pub fn resize_trace(
    trace: &trace_ir::Trace,
    map: impl Fn(usize) -> usize,
) -> Option<trace_ir::Trace> {
    let mut out = trace_ir::Trace::new();
    for node in &trace.nodes {
        let mut op = node.op.clone();
        if let Some(shape) = op.shape_attr_mut() {
            shape.iter_mut().for_each(|d| *d = map(*d));
        }
        match op {
            trace_ir::Op::Parameter { shape, dtype, .. } => {
                out.push_parameter(Meta::new(shape, dtype));
            }
            op => {
                out.push(op, &node.inputs).ok()?;
            }
        }
    }
    out.outputs = trace.outputs.clone();
    Some(out)
}

/// The least precise float dtype any node of `trace` has.
pub fn loosest_float(trace: &trace_ir::Trace) -> Option<DType> {
    trace
        .nodes
        .iter()
        .map(|n| n.meta.dtype)
        .filter(|d| d.is_float())
        .max_by(|a, b| tolerance(*a).rtol.total_cmp(&tolerance(*b).rtol))
}

/// `trace` made well conditioned for a differential check: it stops before
/// the first discontinuous op, and every operand at a pole or domain edge
/// (the input of sqrt, rsqrt, log and reciprocal, and every divisor) is replaced by `|x| + 1`. Each unconsumed value is an output.
fn continuous_only(trace: &trace_ir::Trace) -> trace_ir::Trace {
    use trace_ir::{BinaryOp, Op, UnaryOp};
    let discontinuous = |op: &Op| match op {
        Op::Unary { kind } => matches!(kind, UnaryOp::Floor | UnaryOp::Sign),
        // Powers of random bases and exponents are too ill-conditioned for a
        // fixed tolerance; pow has exact tests of its own.
        Op::Binary { kind } => kind.returns_bool() || *kind == BinaryOp::Pow,
        Op::Cast { to } => !to.is_float(),
        Op::ArgReduce { .. } | Op::Where => true,
        // Products of many random values amplify ulp differences beyond any
        // fixed tolerance; sums and means are well conditioned.
        Op::Reduce { kind, .. } => matches!(kind, trace_ir::ReduceOp::Prod),
        _ => false,
    };
    let guarded = |op: &Op, input: usize| match op {
        Op::Unary { kind } => {
            matches!(kind, UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Log | UnaryOp::Reciprocal)
        }
        Op::Binary { kind: BinaryOp::Div } => input == 1,
        _ => false,
    };
    let mut out = trace_ir::Trace::new();
    let mut remap = Vec::with_capacity(trace.len());
    for node in &trace.nodes {
        if discontinuous(&node.op) {
            break;
        }
        let mut inputs: Vec<usize> = Vec::with_capacity(node.inputs.len());
        for (k, &i) in node.inputs.iter().enumerate() {
            let mut id = remap[i];
            if guarded(&node.op, k) {
                let dtype = out.meta(id).dtype;
                let abs =
                    out.push(Op::Unary { kind: UnaryOp::Abs }, &[id]).expect("abs of a float");
                let one = out
                    .push(Op::Full { value: 1.0, shape: Default::default(), dtype }, &[])
                    .expect("a literal");
                id = out.push(Op::Binary { kind: BinaryOp::Add }, &[abs, one]).expect("same dtype");
            }
            inputs.push(id);
        }
        let id = match &node.op {
            Op::Parameter { .. } => out.push_parameter(node.meta.clone()),
            op => out.push(op.clone(), &inputs).expect("the same op on inputs of the same metas"),
        };
        remap.push(id);
    }
    let uses = out.use_counts();
    out.outputs = (0..out.len())
        .filter(|&i| uses[i] == 0 && !matches!(out.nodes[i].op, Op::Parameter { .. }))
        .collect();
    if out.outputs.is_empty() {
        out.outputs.push(out.len() - 1);
    }
    out
}
