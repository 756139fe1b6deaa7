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
    compare_within(actual, expected, loosest, None)
}

/// How many times its measured sensitivity to rounding (see
/// [`check_conditioned`]) a float element may differ beyond the tolerance.
pub const SENSITIVITY_FACTOR: f64 = 4.0;

/// [`compare`], where a float element may also differ by
/// [`SENSITIVITY_FACTOR`] times its `sensitivity`: how far it moved when
/// rounding-size errors were put into the reference
/// ([`trace_ir::generate::perturbed`]).
fn compare_within(
    actual: &[HostData],
    expected: &[HostData],
    loosest: Option<DType>,
    sensitivity: Option<&[Vec<f64>]>,
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
        let sensitivity: Vec<f64> = match sensitivity.and_then(|p| p.get(i)) {
            Some(d) if d.len() == ev.len() => d.clone(),
            _ => vec![0.0; ev.len()],
        };
        let within = |j: usize| {
            close(av[j], ev[j], tol) || (av[j] - ev[j]).abs() <= SENSITIVITY_FACTOR * sensitivity[j]
        };
        if let Some(j) = (0..av.len()).find(|&j| !within(j)) {
            return Err(format!(
                "output {i} ({}), element {j}: {} vs {} (tolerance {tol:?}, sensitivity {})",
                e.dtype(),
                av[j],
                ev[j],
                sensitivity[j]
            ));
        }
    }
    Ok(())
}

/// Compares `actual` with `expected`, the reference of `trace` on `inputs`,
/// within the written tolerances; where that fails, within
/// [`SENSITIVITY_FACTOR`] times each element's sensitivity to rounding too,
/// measured by running [`trace_ir::generate::perturbed`] on the same inputs.
///
/// A fixed tolerance cannot hold for an ill-conditioned output: a matmul
/// whose terms cancel keeps their absolute error, which a later product or
/// rsqrt turns into any relative error. The perturbed run measures that
/// amplification for this trace and these inputs, so only differences that
/// rounding alone cannot explain remain mismatches.
pub fn check_conditioned(
    trace: &trace_ir::Trace,
    inputs: &[HostData],
    actual: &[HostData],
    expected: &[HostData],
    seed: u64,
) -> Result<(), String> {
    let loosest = loosest_float(trace);
    let Err(plain) = compare(actual, expected, loosest) else { return Ok(()) };
    // One draw of the errors may happen to leave an element nearly where it
    // was; the largest move over a few draws is a steadier estimate.
    let mut sensitivity: Vec<Vec<f64>> = expected.iter().map(|e| vec![0.0; e.len()]).collect();
    for draw in 0..SENSITIVITY_DRAWS {
        let perturbed =
            trace_ir::generate::perturbed(trace, seed.wrapping_add(draw), |op| match op {
                trace_ir::Op::Unary { kind } => runtime::cpu::fused::math::rel_error_bound(*kind),
                _ => None,
            });
        let Ok(moved) = run_reference(&perturbed, inputs) else { return Err(plain) };
        for ((s, m), e) in sensitivity.iter_mut().zip(&moved).zip(expected) {
            if !e.dtype().is_float() || m.len() != e.len() {
                continue; // exact outputs get no allowance
            }
            for ((s, m), e) in s.iter_mut().zip(m.to_f64_vec()).zip(e.to_f64_vec()) {
                let d = (m - e).abs();
                if d.is_finite() {
                    *s = s.max(d);
                }
            }
        }
    }
    compare_within(actual, expected, loosest, Some(&sensitivity))
}

/// How many perturbed runs [`check_conditioned`] measures sensitivity with.
const SENSITIVITY_DRAWS: u64 = 3;

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
    use runtime::{CpuBackend, MemoryTracker};
    let backend = CpuBackend::new(MemoryTracker::new());
    run_program(&rewrite_rules::program::Program::unfused(trace), trace, inputs, &backend)
}

/// Runs `program`, planned from `trace`, on `backend` with `inputs` as the
/// trace's parameters, and downloads its outputs.
pub fn run_program(
    program: &rewrite_rules::program::Program,
    trace: &trace_ir::Trace,
    inputs: &[HostData],
    backend: &dyn runtime::Backend,
) -> trace_ir::Result<Vec<HostData>> {
    let buffers = trace
        .parameters()
        .iter()
        .zip(inputs)
        .map(|(&p, data)| backend.upload(trace.meta(p).clone(), data.clone()))
        .collect::<trace_ir::Result<Vec<_>>>()?;
    let exe = backend.compile(program)?;
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
    run_program(&program, trace, inputs, backend)
}

/// The differential check the fuzz target and the property tests share: a
/// trace generated from `bytes` and made well conditioned
/// ([`checked_trace`]) runs fused (with per-op rounding) and op by op on
/// random inputs, and the results must agree.
pub fn check_generated(bytes: &[u8]) -> Result<(), String> {
    check_generated_on(bytes, &runtime::CpuBackend::new(runtime::MemoryTracker::new()))
}

/// [`check_generated`] with the fused side run on `backend` (see [`run_fused_on`]).
pub fn check_generated_on(bytes: &[u8], backend: &dyn runtime::Backend) -> Result<(), String> {
    check_trace(&checked_trace(bytes), trace_ir::signature::stable_hash64(bytes), backend)
}

/// The trace [`check_generated`] checks for `bytes`: the shared generator's
/// trace, made well conditioned.
pub fn checked_trace(bytes: &[u8]) -> trace_ir::Trace {
    let mut source = trace_ir::generate::Bytes::new(bytes);
    trace_ir::generate::well_conditioned(&trace_ir::generate::random_trace(&mut source, 12).trace)
}

/// Runs `trace` fused on `backend` and op by op, on random inputs drawn from
/// `seed`, and compares; then the same for the program resized to other
/// sizes of its shape class. Both sides failing (a reduction over an empty
/// axis that has no identity) is agreement; one failing is not.
pub fn check_trace(
    trace: &trace_ir::Trace,
    seed: u64,
    backend: &dyn runtime::Backend,
) -> Result<(), String> {
    let params: Vec<Meta> = trace.parameters().iter().map(|&p| trace.meta(p).clone()).collect();
    let inputs = random_inputs(&params, seed);
    // Per-op rounding makes fused bf16/f16 kernels round where eager does, so
    // the check sees kernel errors rather than the (documented, intended)
    // difference of rounding once, which ill-conditioned ops like sin of a
    // large argument amplify without bound.
    let config =
        crate::Config { fused_rounding: crate::FusedRounding::PerOp, ..crate::Config::default() };
    let expected = run_reference(trace, &inputs);
    let actual = run_fused_on(trace, &inputs, &config, backend);
    let (actual, expected) = match (actual, expected) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(_), Err(_)) => return Ok(()),
        (Err(e), Ok(_)) => return Err(format!("fused run failed: {e}\n{}", trace.to_json())),
        (Ok(_), Err(e)) => {
            return Err(format!("reference failed, fused did not: {e}\n{}", trace.to_json()))
        }
    };
    check_conditioned(trace, &inputs, &actual, &expected, seed)
        .map_err(|e| format!("{e}\ntrace: {}", trace.to_json()))?;
    if backend.fuses_itself() {
        return Ok(()); // its executables are compiled per size
    }
    check_resized(trace, &config, seed)
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
    let Ok(expected) = run_reference(&resized, &inputs) else {
        return Ok(()); // as above, at the original sizes
    };
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
    check_conditioned(&resized, &inputs, &actual, &expected, seed)
        .map_err(|e| format!("resized: {e}\ntrace: {}", trace.to_json()))
}

/// `trace` recorded again with every size `d` of its shapes and size
/// attributes replaced by `map(d)`; `None` when that is not a valid trace.
pub fn resize_trace(
    trace: &trace_ir::Trace,
    map: impl Fn(usize) -> usize,
) -> Option<trace_ir::Trace> {
    let mut out = trace_ir::Trace::new();
    for node in &trace.nodes {
        let mut op = node.op.clone();
        op.size_attrs_mut().into_iter().for_each(|d| *d = map(*d));
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

/// The generator's bytes of trace `i` of a differential run: 300 bytes that
/// depend only on `i`.
pub fn trace_bytes(i: u64) -> Vec<u8> {
    let mut state = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xd1b5_4a32_d192_ed03;
    (0..300)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}
