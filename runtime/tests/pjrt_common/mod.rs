//! Shared helpers of the PJRT tests: the backend on the real plugin, random
//! inputs, and the comparison with the native CPU backend.

#![allow(dead_code, clippy::result_large_err)]

use half::{bf16, f16};
use rewrite_rules::program::Program;
use runtime::pjrt::PjrtBackend;
use runtime::{Backend, CpuBackend, HostData, MemoryTracker};
use trace_ir::shape::shape;
use trace_ir::{DType, Meta, Result, Trace};

pub fn meta(dims: &[usize], dtype: DType) -> Meta {
    Meta::new(shape(dims), dtype)
}

/// The plugin named by `TORCH_TPU_PJRT_PLUGIN`, as the engine's `Config`
/// reads it (the runtime reads no environment itself); `None` searches.
pub fn plugin_from_env() -> Option<std::path::PathBuf> {
    std::env::var_os("TORCH_TPU_PJRT_PLUGIN").filter(|p| !p.is_empty()).map(Into::into)
}

/// The PJRT backend on the plugin `TORCH_TPU_PJRT_PLUGIN` names, else the
/// one discovery finds. Fails the test (never skips it) when there is no
/// plugin.
pub fn pjrt() -> PjrtBackend {
    let backend = match plugin_from_env() {
        Some(path) => PjrtBackend::with_plugin(&path, MemoryTracker::new()),
        None => PjrtBackend::new(MemoryTracker::new()),
    };
    match backend {
        Ok(b) => b,
        Err(e) => panic!(
            "the PJRT tests need a PJRT plugin: run `.ci/setup_python` (installs the xla-cpu-pjrt wheel into .venv) \
             or set TORCH_TPU_PJRT_PLUGIN=/path/to/plugin.so. Error: {e}"
        ),
    }
}

/// Compiles and runs `trace` on `backend` with host inputs.
pub fn run_on(backend: &dyn Backend, trace: &Trace, inputs: &[HostData]) -> Result<Vec<HostData>> {
    let exe = backend.compile(&Program::unfused(trace))?;
    let params = trace.parameters();
    let bufs = inputs
        .iter()
        .zip(params)
        .map(|(d, p)| backend.upload(trace.meta(p).clone(), d.clone()))
        .collect::<Result<Vec<_>>>()?;
    let outs = exe.run(bufs)?;
    outs.iter().map(|b| backend.download(b)).collect()
}

/// Deterministic pseudo-random values in [lo, hi).
pub fn noise(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + ((s >> 40) as f32 / (1u64 << 24) as f32) * (hi - lo)
        })
        .collect()
}

/// Random data of `m`: floats in [lo, hi), integers the floor of those,
/// bools whether the value is above the middle.
pub fn data(m: &Meta, seed: u64, lo: f32, hi: f32) -> HostData {
    let v = noise(m.numel(), seed, lo, hi);
    match m.dtype {
        DType::F32 => HostData::F32(v),
        DType::BF16 => HostData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        DType::F16 => HostData::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
        DType::I32 => HostData::I32(v.iter().map(|&x| x.floor() as i32).collect()),
        DType::I64 => HostData::I64(v.iter().map(|&x| x.floor() as i64).collect()),
        DType::Bool => HostData::Bool(v.iter().map(|&x| x > (lo + hi) / 2.0).collect()),
    }
}

/// Absolute and relative tolerance per dtype (XLA's transcendentals and
/// summation order differ slightly from the native backend's).
pub fn tolerance(d: DType) -> (f64, f64) {
    match d {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (1e-3, 1e-3),
        DType::BF16 => (1e-2, 1e-2),
        _ => (0.0, 0.0),
    }
}

/// Asserts `got` matches `want` within the dtype's tolerance.
pub fn assert_close(what: &str, got: &HostData, want: &HostData) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let (HostData::I64(a), HostData::I64(b)) = (got, want) {
        assert_eq!(a, b, "{what}");
        return;
    }
    let (abs, rel) = tolerance(want.dtype());
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= abs + rel * b.abs();
        assert!(ok, "{what}: element {i}: pjrt {a} vs cpu {b} (tolerance abs {abs} rel {rel})\npjrt {g:?}\ncpu  {w:?}");
    }
}

/// Runs `trace` on both backends and compares every output.
pub fn check(pjrt: &PjrtBackend, what: &str, trace: &Trace, inputs: &[HostData]) {
    let cpu = CpuBackend::new(MemoryTracker::new());
    let want = run_on(&cpu, trace, inputs).unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
    let got = run_on(pjrt, trace, inputs).unwrap_or_else(|e| {
        let module = runtime::pjrt::lower(trace).unwrap_or_else(|e| e.to_string());
        panic!("{what}: pjrt: {e}\n{module}")
    });
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("{what}, output {k}"), g, w);
    }
}
