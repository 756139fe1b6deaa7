//! Differential checking: run one trace two ways and compare the results
//! within a tolerance per dtype. The tests, the fuzz targets and users who
//! bisect a numerical difference all use this one definition of "agree".
//!
//! Tolerances (|a - b| ≤ atol + rtol·|b|, NaN equals NaN, infinities must
//! match in sign):
//!
//! | dtype | rtol | atol | why |
//! | --- | --- | --- | --- |
//! | f32 | 1e-5 | 1e-6 | fused kernels use polynomial transcendentals (≤ a few ulp) and other summation orders |
//! | f16 | 2e-3 | 1e-3 | one f16 rounding (2^-11) of slightly different f32 values, twice |
//! | bf16 | 1.6e-2 | 1e-2 | one bf16 rounding (2^-8) of slightly different f32 values, twice |
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
        DType::F32 => Tolerance { rtol: 1e-5, atol: 1e-6 },
        DType::F16 => Tolerance { rtol: 2e-3, atol: 1e-3 },
        DType::BF16 => Tolerance { rtol: 1.6e-2, atol: 1e-2 },
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

/// Compares two result sets; the error names the output, the index and both values.
pub fn compare(actual: &[HostData], expected: &[HostData], tolerance_scale: f64) -> Result<(), String> {
    if actual.len() != expected.len() {
        return Err(format!("{} outputs, expected {}", actual.len(), expected.len()));
    }
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        if a.dtype() != e.dtype() || a.len() != e.len() {
            return Err(format!("output {i}: {} x {} vs {} x {}", a.dtype(), a.len(), e.dtype(), e.len()));
        }
        let base = tolerance(e.dtype());
        let tol = Tolerance { rtol: base.rtol * tolerance_scale, atol: base.atol * tolerance_scale };
        let (av, ev) = (a.to_f64_vec(), e.to_f64_vec());
        if let Some(j) = (0..av.len()).find(|&j| !close(av[j], ev[j], tol)) {
            return Err(format!("output {i} ({}), element {j}: {} vs {} (tolerance {tol:?})", e.dtype(), av[j], ev[j]));
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
            let unit: Vec<f64> = (0..n).map(|_| (next() >> 11) as f64 / (1u64 << 53) as f64).collect();
            match m.dtype {
                DType::F32 => HostData::F32(unit.iter().map(|u| (u * 4.0 - 2.0) as f32).collect()),
                DType::BF16 => HostData::BF16(unit.iter().map(|u| half::bf16::from_f64(u * 4.0 - 2.0)).collect()),
                DType::F16 => HostData::F16(unit.iter().map(|u| half::f16::from_f64(u * 4.0 - 2.0)).collect()),
                DType::I32 => HostData::I32(unit.iter().map(|u| (u * 9.0) as i32 - 4).collect()),
                DType::I64 => HostData::I64(unit.iter().map(|u| (u * 9.0) as i64 - 4).collect()),
                DType::Bool => HostData::Bool(unit.iter().map(|u| *u < 0.5).collect()),
            }
        })
        .collect()
}

/// Runs `trace` op by op on a fresh native CPU backend: the reference every
/// optimized or fused result is compared with.
pub fn run_reference(trace: &trace_ir::Trace, inputs: &[HostData]) -> trace_ir::Result<Vec<HostData>> {
    use runtime::{Backend, CpuBackend, MemoryTracker};
    let backend = CpuBackend::new(MemoryTracker::new());
    let params = trace.parameters();
    let buffers = params
        .iter()
        .zip(inputs)
        .map(|(&p, data)| backend.upload(trace.meta(p).clone(), data.clone()))
        .collect::<trace_ir::Result<Vec<_>>>()?;
    let exe = backend.compile(trace)?;
    exe.run(buffers)?.iter().map(|b| backend.download(b)).collect()
}
