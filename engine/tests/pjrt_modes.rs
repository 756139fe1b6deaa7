//! The engine on the PJRT backend (XLA's CPU plugin from the `xla-cpu-pjrt`
//! wheel; `.ci/setup_python` installs it), compared with the native CPU
//! backend within the written tolerances of `deferfuse::differential`: every
//! op and dtype, the three modes, the random-trace generator, the cache
//! counters, device-resident results and the plugin errors.

#![cfg(feature = "pjrt")]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use deferfuse::differential::{check_generated_on, compare};
use deferfuse::{
    bf16, f16, BackendKind, Config, Context, DType, GeluApproximation, HostData, Mode, Result,
    Tensor,
};
use runtime::pjrt::PjrtBackend;
use runtime::MemoryTracker;

/// The plugin named by `TORCH_TPU_PJRT_PLUGIN` (what `Config::from_env`
/// would read); `None` searches.
fn plugin_from_env() -> Option<PathBuf> {
    std::env::var_os(deferfuse::config::ENV_PJRT_PLUGIN).filter(|p| !p.is_empty()).map(Into::into)
}

fn context(mode: Mode, backend: BackendKind) -> Context {
    let config = Config { mode, backend, pjrt_plugin: plugin_from_env(), ..Config::default() };
    Context::new(config).unwrap_or_else(|e| {
        panic!(
            "the PJRT tests need a PJRT plugin: run `.ci/setup_python` (installs the xla-cpu-pjrt wheel into .venv) \
             or set TORCH_TPU_PJRT_PLUGIN=/path/to/plugin.so. Error: {e}"
        )
    })
}

fn pjrt(mode: Mode) -> Context {
    context(mode, BackendKind::Pjrt)
}

/// A tensor of `dtype` holding `values` (cast as `to_dtype` would).
fn tensor(ctx: &Context, values: &[f32], shape: &[usize], dtype: DType) -> Tensor {
    let t = match dtype {
        DType::F32 => ctx.from_slice(values, shape),
        DType::BF16 => ctx.from_vec(values.iter().map(|&v| bf16::from_f32(v)).collect(), shape),
        DType::F16 => ctx.from_vec(values.iter().map(|&v| f16::from_f32(v)).collect(), shape),
        DType::I32 => ctx.from_vec(values.iter().map(|&v| v.floor() as i32).collect(), shape),
        DType::I64 => ctx.from_vec(values.iter().map(|&v| v.floor() as i64).collect(), shape),
        DType::Bool => ctx.from_vec(values.iter().map(|&v| v > 0.0).collect(), shape),
    };
    t.unwrap()
}

fn values(n: usize, seed: u32, lo: f32, hi: f32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| lo + (hi - lo) * (((i * 7919 + seed * 104729) % 1000) as f32 / 1000.0))
        .collect()
}

/// Every public op of `Tensor` on inputs of `dtype`. An op the dtype does not
/// support is an error, raised at the call on every backend alike.
fn every_op(ctx: &Context, dtype: DType) -> Vec<Result<Tensor>> {
    let x = tensor(ctx, &values(12, 1, -3.0, 3.0), &[3, 4], dtype);
    let y = tensor(ctx, &values(4, 2, -2.0, 2.0), &[4], dtype);
    let pos = tensor(ctx, &values(12, 3, 0.5, 4.0), &[3, 4], dtype);
    let m = tensor(ctx, &values(20, 4, -1.0, 1.0), &[4, 5], dtype);
    let mut out = vec![
        x.neg(),
        x.abs(),
        x.exp(),
        pos.log(),
        pos.sqrt(),
        pos.rsqrt(),
        pos.reciprocal(),
        x.tanh(),
        x.sigmoid(),
        x.relu(),
        x.silu(),
        x.sin(),
        x.cos(),
        x.floor(),
        x.sign(),
        x.logical_not(),
        x.gelu(GeluApproximation::None),
        x.gelu(GeluApproximation::Tanh),
        x.add(&y),
        x.sub(&y),
        x.mul(&y),
        x.div(&pos),
        pos.pow(&y),
        x.maximum(&y),
        x.minimum(&y),
        x.eq(&y),
        x.ne(&y),
        x.lt(&y),
        x.le(&y),
        x.gt(&y),
        x.ge(&y),
        x.logical_and(&y),
        x.logical_or(&y),
        x.mul(0.25),
        x.add(3),
        x.gt(0.5).and_then(|c| c.where_cond(&x, &y)),
        x.sum(&[-1], false),
        x.sum(&[0], true),
        x.mean(&[-1], false),
        x.max(&[0], false),
        x.min(&[-1], true),
        pos.prod(&[-1], false),
        x.sum_all(),
        x.argmax(Some(-1), false),
        x.argmin(Some(0), true),
        x.argmax(None, false),
        x.reshape(&[4, 3]),
        y.expand(&[2, 3, 4]),
        x.permute(&[1, 0]),
        x.transpose(0, 1),
        x.t(),
        x.unsqueeze(1),
        x.slice(1, 1, 4, 2),
        Tensor::cat(&[&x, &pos], 0),
        x.matmul(&m),
        x.softmax(-1),
        x.log_softmax(0),
        x.layer_norm(&[4], Some(&y), Some(&y), 1e-5),
        x.rms_norm(&[4], Some(&y), 1e-5),
        x.linear(&m.t().unwrap(), None),
        ctx.full(1.5, &[2, 3], dtype),
        ctx.arange(0.0, 6.0, 1.0, dtype),
        ctx.rand(&[3, 5], dtype, 11),
        ctx.randn(&[3, 5], dtype, 12),
    ];
    for to in [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::Bool] {
        out.push(x.to_dtype(to));
    }
    out
}

/// Reads every tensor; errors stay errors (as their message).
fn read_all(ts: Vec<Result<Tensor>>) -> Vec<std::result::Result<HostData, String>> {
    ts.into_iter().map(|t| t.and_then(|t| t.host_data()).map_err(|e| e.to_string())).collect()
}

#[test]
fn every_op_and_dtype_matches_the_native_backend() {
    let reference = context(Mode::Strict, BackendKind::Cpu);
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let ctx = pjrt(mode);
        let mut checked = 0;
        for dtype in [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::Bool] {
            let want = read_all(every_op(&reference, dtype));
            let got = read_all(every_op(&ctx, dtype));
            assert_eq!(got.len(), want.len());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                match (g, w) {
                    (Ok(g), Ok(w)) => {
                        compare(std::slice::from_ref(g), std::slice::from_ref(w), Some(dtype))
                            .unwrap_or_else(|e| panic!("{mode} {dtype} op #{k}: pjrt vs cpu: {e}"));
                        checked += 1;
                    }
                    (Err(g), Err(w)) => {
                        assert_eq!(g, w, "{mode} {dtype} op #{k}: the errors differ")
                    }
                    _ => panic!("{mode} {dtype} op #{k}: pjrt {g:?} vs cpu {w:?}"),
                }
            }
        }
        // Most ops apply to most dtypes; bool arithmetic is the main refusal.
        assert!(checked >= 300, "{mode}: only {checked} results compared");
    }
}

fn mlp(ctx: &Context) -> Result<Vec<f32>> {
    let x = ctx.randn(&[32, 64], DType::F32, 1)?;
    let w1 = ctx.randn(&[128, 64], DType::F32, 2)?.mul(0.125)?;
    let w2 = ctx.randn(&[64, 128], DType::F32, 3)?.mul(0.09)?;
    let h = x.linear(&w1, None)?.gelu(GeluApproximation::Tanh)?;
    let y = h.linear(&w2, None)?.add(&x)?;
    y.layer_norm(&[64], None, None, 1e-5)?.softmax(-1)?.to_vec::<f32>()
}

#[test]
fn the_three_modes_on_pjrt_agree_with_the_native_backend() {
    let want = HostData::F32(mlp(&context(Mode::Strict, BackendKind::Cpu)).unwrap());
    for mode in Mode::ALL {
        let ctx = pjrt(mode);
        assert_eq!(ctx.backend_name(), "pjrt");
        let got = HostData::F32(mlp(&ctx).unwrap());
        compare(&[got], std::slice::from_ref(&want), None)
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
    }
}

#[test]
fn defer_and_fuse_compiles_one_unfused_module_per_flush() {
    let ctx = pjrt(Mode::DeferAndFuse);
    let first = mlp(&ctx).unwrap();
    let flush = ctx.last_flush().unwrap();
    // XLA fuses inside the module: the program is the optimized trace, op by op.
    assert!(
        flush
            .program
            .kernels
            .iter()
            .all(|k| matches!(k.kind, rewrite_rules::program::KernelKind::Single { .. })),
        "{:?}",
        flush.program
    );
    let after_first = ctx.stats();
    assert_eq!(
        after_first.backend.compiled, after_first.flushes,
        "one module per flush: {after_first:?}"
    );
    // The same op sequence again compiles nothing.
    assert_eq!(mlp(&ctx).unwrap(), first);
    let after_second = ctx.stats();
    assert_eq!(after_second.backend.compiled, after_first.backend.compiled, "{after_second:?}");
    assert!(after_second.cache.tier1.hits > after_first.cache.tier1.hits, "{after_second:?}");
}

#[test]
fn strict_compiles_each_op_once_per_shape() {
    let ctx = pjrt(Mode::Strict);
    let step = |x: &Tensor, y: &Tensor| y.mul(x).unwrap().tanh().unwrap().add(x).unwrap();
    let x = ctx.rand(&[16], DType::F32, 1).unwrap();
    let mut y = step(&x, &x);
    y.to_vec::<f32>().unwrap();
    let once = ctx.stats().backend.compiled;
    assert!(once >= 3, "rand, mul, tanh, add: {once}");
    for _ in 0..20 {
        y = step(&x, &y);
    }
    y.to_vec::<f32>().unwrap();
    assert_eq!(
        ctx.stats().backend.compiled,
        once,
        "the same ops on the same shapes compiled again"
    );
    // A new shape compiles each op once more.
    let x2 = ctx.rand(&[8, 3], DType::F32, 1).unwrap();
    let mut y2 = step(&x2, &x2);
    for _ in 0..5 {
        y2 = step(&x2, &y2);
    }
    y2.to_vec::<f32>().unwrap();
    assert_eq!(ctx.stats().backend.compiled, 2 * once, "{:?}", ctx.stats());
}

#[test]
fn results_stay_on_the_device_until_read() {
    // Debug mode is left out: it reads every result to check it for NaN and Inf.
    for mode in [Mode::Strict, Mode::DeferAndFuse] {
        let ctx = pjrt(mode);
        let x = ctx.from_vec((0..64).map(|i| i as f32 / 64.0).collect(), &[8, 8]).unwrap();
        let mut y = x.clone();
        for _ in 0..10 {
            y = y.matmul(&x).unwrap().tanh().unwrap();
            ctx.sync().unwrap(); // in DeferAndFuse: one flush each, fed by the last one's output
        }
        let before = ctx.stats().backend;
        assert_eq!((before.host_to_device, before.device_to_host), (1, 0), "{mode}: {before:?}");
        let got = y.to_vec::<f32>().unwrap();
        let after = ctx.stats().backend;
        assert_eq!(after.device_to_host, 1, "{mode}: only the read downloads: {after:?}");
        assert_eq!(got.len(), 64);
        drop((x, y));
        assert_eq!(ctx.memory().live_bytes, 0, "{mode}: device buffers still counted live");
    }
}

/// An optimizer-like step whose new state replaces the old: in DeferAndFuse
/// on PJRT the old state (held by nobody once replaced) is donated to the new
/// state, the results match the native backend step for step, and a tensor
/// the user still holds is never donated and reads back unchanged.
#[test]
fn donated_state_keeps_results_right_and_held_inputs_readable() {
    fn run(ctx: &Context, keep_first: bool) -> (Vec<Vec<f32>>, Vec<f32>) {
        let mut p = ctx.from_vec(values(4096, 1, -1.0, 1.0), &[4096]).unwrap();
        let mut m = ctx.from_vec(values(4096, 2, -0.1, 0.1), &[4096]).unwrap();
        let g = ctx.from_vec(values(4096, 3, -0.01, 0.01), &[4096]).unwrap();
        let first_p = p.clone();
        let held = if keep_first { Some(first_p) } else { None };
        let mut seen = Vec::new();
        for _ in 0..4 {
            let new_m = m.mul(0.9).unwrap().add(g.mul(0.1).unwrap()).unwrap();
            let new_p = p.sub(new_m.mul(0.001).unwrap()).unwrap();
            (p, m) = (new_p, new_m);
            ctx.sync().unwrap();
            seen.push(p.to_vec::<f32>().unwrap());
        }
        let held = held.map(|t| t.to_vec::<f32>().unwrap()).unwrap_or_default();
        (seen, held)
    }
    let (want, _) = run(&context(Mode::DeferAndFuse, BackendKind::Cpu), false);
    let ctx = pjrt(Mode::DeferAndFuse);
    let (got, _) = run(&ctx, false);
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        compare(&[HostData::F32(g.clone())], &[HostData::F32(w.clone())], None)
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
    }
    let donated = ctx.stats().backend.donated;
    assert!(donated >= 6, "p and m are donated from the second step on: {:?}", ctx.stats().backend);

    // Holding the first parameters: that buffer is never donated and still
    // reads back as it was written.
    let ctx = pjrt(Mode::DeferAndFuse);
    let (got, held) = run(&ctx, true);
    assert_eq!(held, values(4096, 1, -1.0, 1.0));
    compare(&[HostData::F32(got[3].clone())], &[HostData::F32(want[3].clone())], None).unwrap();
}

fn shared_backend() -> &'static Arc<PjrtBackend> {
    static BACKEND: OnceLock<Arc<PjrtBackend>> = OnceLock::new();
    BACKEND.get_or_init(|| {
        let backend = match plugin_from_env() {
            Some(path) => PjrtBackend::with_plugin(&path, MemoryTracker::new()),
            None => PjrtBackend::new(MemoryTracker::new()),
        };
        Arc::new(backend.expect("a PJRT plugin (run .ci/setup_python)"))
    })
}

#[test]
fn generated_traces_on_pjrt_agree_with_the_reference() {
    let backend = shared_backend();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for case in 0..48 {
        let bytes: Vec<u8> = (0..160)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        check_generated_on(&bytes, backend.as_ref()).unwrap_or_else(|e| panic!("case {case}: {e}"));
    }
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/fused_vs_unfused");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        check_generated_on(&std::fs::read(&path).unwrap(), backend.as_ref())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        replayed += 1;
    }
    assert!(replayed >= 10, "corpus at {} has {replayed} files", dir.display());
}

fn plugin_error(path: &std::path::Path) -> String {
    let config =
        Config { backend: BackendKind::Pjrt, pjrt_plugin: Some(path.into()), ..Config::default() };
    match Context::new(config) {
        Ok(_) => panic!("{} loaded as a PJRT plugin", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_backend_names_and_plugins_give_clear_errors() {
    let e = Config::from_vars(|k| (k == "TORCH_TPU_BACKEND").then(|| "tpu".to_string()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("TORCH_TPU_BACKEND") && e.contains("cpu, pjrt"), "{e}");
    let config = Config::from_vars(|k| match k {
        "TORCH_TPU_BACKEND" => Some("PJRT".into()),
        "TORCH_TPU_PJRT_PLUGIN" => Some("/opt/plugin.so".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(
        (config.backend, config.pjrt_plugin.as_deref()),
        (BackendKind::Pjrt, Some(std::path::Path::new("/opt/plugin.so")))
    );

    let e = plugin_error(std::path::Path::new("/nonexistent/dir/plugin.so"));
    assert!(e.contains("/nonexistent/dir/plugin.so"), "{e}");

    let dir = std::env::temp_dir().join(format!("deferfuse-pjrt-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("not_a_plugin.so");
    std::fs::write(&junk, b"this is not a shared library").unwrap();
    let e = plugin_error(&junk);
    assert!(e.contains("not_a_plugin.so") && e.contains("cannot load PJRT plugin"), "{e}");

    // A real shared library that speaks PJRT API 0.20: older than ours.
    let old = dir.join("old_api_plugin.so");
    let source = dir.join("old_api_plugin.c");
    std::fs::write(
        &source,
        "struct version { unsigned long size; void *ext; int major, minor; };\n\
         struct api { unsigned long size; void *ext; struct version version; };\n\
         static struct api table = { sizeof(struct api), 0, { sizeof(struct version), 0, 0, 20 } };\n\
         const struct api *GetPjrtApi(void) { return &table; }\n",
    )
    .unwrap();
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&old)
        .arg(&source)
        .status()
        .expect("a C compiler (cc) builds the old-API test plugin");
    assert!(built.success(), "cc failed to build {}", old.display());
    let e = plugin_error(&old);
    assert!(e.contains("old_api_plugin.so") && e.contains("API 0.20") && e.contains("0.81"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
