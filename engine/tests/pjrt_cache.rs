//! Tier 3 on the PJRT backend: serialized executables on disk, shared by
//! processes, rebuilt when corrupt, forged or unloadable, and never loaded
//! by another plugin build.
//! The second plugin is the `lammps-jax-pjrt-cpu` wheel (XLA's CPU plugin
//! built from jax 0.11.2), which `.ci/setup_python` installs beside
//! `xla-cpu-pjrt`.

#![cfg(feature = "pjrt")]

use std::path::{Path, PathBuf};
use std::process::Command;

use deferfuse::differential::compare;
use deferfuse::disk_cache::{DiskCache, DiskCacheLimits};
use deferfuse::{BackendKind, BackendStats, Config, Context, DType, HostData, Mode, Result};
use sha2::{Digest, Sha256};
use trace_ir::signature::stable_hash64;

const CHILD_VAR: &str = "DEFERFUSE_TEST_PJRT_CHILD";

/// A few flushes and Strict ops: four distinct modules at least.
fn workload(ctx: &Context) -> Result<Vec<f32>> {
    let x = ctx.from_vec((0..256).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect(), &[16, 16])?;
    let h = x.matmul(&x)?.tanh()?.add(&x)?;
    let s = h.softmax(-1)?.mul(&h)?.sum(&[-1], false)?;
    let mut out = s.to_vec::<f32>()?;
    out.extend(h.layer_norm(&[16], None, None, 1e-5)?.to_vec::<f32>()?);
    Ok(out)
}

fn reference() -> Vec<f32> {
    workload(&Context::with_mode(Mode::Strict).unwrap()).unwrap()
}

/// The plugin named by `TORCH_TPU_PJRT_PLUGIN` (what `Config::from_env`
/// would read); `None` searches.
fn plugin_from_env() -> Option<PathBuf> {
    std::env::var_os(deferfuse::config::ENV_PJRT_PLUGIN).filter(|p| !p.is_empty()).map(Into::into)
}

/// A context on `plugin`, else the one `TORCH_TPU_PJRT_PLUGIN` names, else
/// the one discovery finds.
fn on_pjrt(mode: Mode, cache_dir: &Path, plugin: Option<PathBuf>) -> Context {
    let config = Config {
        mode,
        backend: BackendKind::Pjrt,
        cache_dir: Some(cache_dir.into()),
        pjrt_plugin: plugin.or_else(plugin_from_env),
        ..Config::default()
    };
    Context::new(config)
        .unwrap_or_else(|e| panic!("run .ci/setup_python to install the PJRT plugins: {e}"))
}

/// Runs the workload in DeferAndFuse and Strict on one cache directory and
/// returns what the backends counted; the results must match the native backend.
fn run_workload(cache_dir: &Path, plugin: Option<PathBuf>) -> BackendStats {
    let want = HostData::F32(reference());
    let mut total = BackendStats::default();
    for mode in [Mode::DeferAndFuse, Mode::Strict] {
        let ctx = on_pjrt(mode, cache_dir, plugin.clone());
        let got = HostData::F32(workload(&ctx).unwrap());
        compare(&[got], std::slice::from_ref(&want), None)
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        let s = ctx.stats().backend;
        total.compiled += s.compiled;
        total.loaded += s.loaded;
        total.load_failures += s.load_failures;
        total.store_rejected += s.store_rejected;
    }
    total
}

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("deferfuse-pjrt-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn executable_entries(cache_dir: &Path) -> Vec<PathBuf> {
    let dir = cache_dir.join(deferfuse::backend_select::PJRT_EXECUTABLES_DIR);
    deferfuse::disk_cache::entry_files(&dir)
}

/// The `lammps-jax-pjrt-cpu` plugin in the project's `.venv`.
fn second_plugin() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv");
    let found = ["lib", "lib64"]
        .iter()
        .flat_map(|lib| std::fs::read_dir(venv.join(lib)).into_iter().flatten().flatten())
        .map(|py| py.path().join("site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "the second CPU plugin (lammps-jax-pjrt-cpu) is not in {}: run .ci/setup_python",
            venv.display()
        )
    })
}

/// Run in child processes by the tests below: runs the workload on the
/// cache directory and plugin the parent names, and prints the counters.
#[test]
fn child_runs_the_workload() {
    let Ok(dir) = std::env::var(CHILD_VAR) else { return };
    let plugin = std::env::var_os("DEFERFUSE_TEST_PJRT_PLUGIN").map(PathBuf::from);
    let s = run_workload(Path::new(&dir), plugin);
    println!("STATS compiled={} loaded={} load_failures={}", s.compiled, s.loaded, s.load_failures);
}

/// Runs [`child_runs_the_workload`] in a new process; returns its counters.
fn in_child(cache_dir: &Path, plugin: Option<&Path>) -> BackendStats {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_runs_the_workload", "--nocapture", "--test-threads", "1"])
        .env(CHILD_VAR, cache_dir);
    if let Some(p) = plugin {
        cmd.env("DEFERFUSE_TEST_PJRT_PLUGIN", p);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("STATS ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no STATS line in:\n{stdout}"));
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    BackendStats {
        compiled: field("compiled"),
        loaded: field("loaded"),
        load_failures: field("load_failures"),
        ..Default::default()
    }
}

#[test]
fn a_second_process_loads_every_executable_and_compiles_nothing() {
    let dir = temp_dir("second-process");
    let first = in_child(&dir, None);
    assert!(first.compiled >= 4 && first.loaded == 0, "{first:?}");
    assert_eq!(executable_entries(&dir).len() as u64, first.compiled);
    let second = in_child(&dir, None);
    assert_eq!((second.compiled, second.loaded), (0, first.compiled), "{second:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The second run after every entry was damaged: every executable compiled
/// again, none loaded, `rejected` of them refused by the store, and a third
/// run loads what the second rebuilt.
fn assert_rebuilt(dir: &Path, first: &BackendStats, load_failures: u64, rejected: u64) {
    let second = run_workload(dir, None);
    assert_eq!(second.compiled, first.compiled, "every bad entry compiled again: {second:?}");
    assert_eq!(second.loaded, 0, "{second:?}");
    assert_eq!(second.load_failures, load_failures, "{second:?}");
    assert_eq!(second.store_rejected, rejected, "{second:?}");
    let third = run_workload(dir, None);
    assert_eq!(
        (third.compiled, third.loaded, third.store_rejected),
        (0, first.compiled, 0),
        "the rebuilt entries load: {third:?}"
    );
}

#[test]
fn corrupt_and_forged_entries_are_rejected_and_rebuilt() {
    let dir = temp_dir("corrupt");
    let first = run_workload(&dir, None);
    let entries = executable_entries(&dir);
    assert_eq!(entries.len() as u64, first.compiled);
    // Half the entries get a flipped byte; the other half a well-formed
    // entry whose executable is garbage, with a checksum anyone can compute
    // (the old unkeyed one, or a SHA-256). The MAC catches both.
    for (k, path) in entries.iter().enumerate() {
        let mut bytes = std::fs::read(path).unwrap();
        if k % 2 == 0 {
            let last = bytes.len() - 1;
            bytes[last] ^= 0x40;
        } else {
            let (key, _) = split_entry(&bytes);
            bytes = forged(&key, b"not a serialized executable", k % 4 == 1);
        }
        std::fs::write(path, bytes).unwrap();
    }
    assert_rebuilt(&dir, &first, 0, entries.len() as u64);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn another_modules_executable_under_a_key_is_rejected_and_the_results_stay_right() {
    // One module's executable (a multiply, say) stored under another's key
    // (an add) with a recomputed public checksum: before the MAC it loaded
    // and ran silently. Here every entry gets its neighbour's payload.
    let dir = temp_dir("swapped");
    let first = run_workload(&dir, None);
    let entries = executable_entries(&dir);
    assert!(entries.len() >= 2);
    let parts: Vec<(Vec<u8>, Vec<u8>)> =
        entries.iter().map(|p| split_entry(&std::fs::read(p).unwrap())).collect();
    for (k, path) in entries.iter().enumerate() {
        let (key, _) = &parts[k];
        let (_, other) = &parts[(k + 1) % parts.len()];
        std::fs::write(path, forged(key, other, k % 2 == 0)).unwrap();
    }
    // run_workload checks the numbers against the native backend.
    assert_rebuilt(&dir, &first, 0, entries.len() as u64);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_authentic_entry_that_does_not_load_is_rejected_and_rebuilt() {
    let dir = temp_dir("unloadable");
    let first = run_workload(&dir, None);
    let entries = executable_entries(&dir);
    // Written through the cache itself, under its key: it verifies, and the
    // plugin refuses to deserialize it.
    let store = DiskCache::open(
        dir.join(deferfuse::backend_select::PJRT_EXECUTABLES_DIR),
        DiskCacheLimits::default(),
    )
    .unwrap();
    for path in &entries {
        let (key, _) = split_entry(&std::fs::read(path).unwrap());
        store.put(&key, b"not a serialized executable");
        assert!(store.get(&key).is_some());
    }
    let n = entries.len() as u64;
    assert_rebuilt(&dir, &first, n, n);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An entry's key and payload (see `disk_cache.rs`: magic line, MAC line,
/// key length line, key, payload).
fn split_entry(entry: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut lines = entry.splitn(4, |&b| b == b'\n');
    let _magic = lines.next().unwrap();
    let _mac = lines.next().unwrap();
    let key_len: usize = std::str::from_utf8(lines.next().unwrap()).unwrap().parse().unwrap();
    let body = lines.next().unwrap();
    (body[..key_len].to_vec(), body[key_len..].to_vec())
}

/// A well-formed entry with a tag that needs no secret: the unkeyed
/// checksum of before (`old_checksum`), or a SHA-256 of the body.
fn forged(key: &[u8], payload: &[u8], old_checksum: bool) -> Vec<u8> {
    let mut body = key.to_vec();
    body.extend_from_slice(payload);
    let tag = match old_checksum {
        true => format!("{:064x}", stable_hash64(&body)),
        false => Sha256::digest(&body).iter().map(|b| format!("{b:02x}")).collect(),
    };
    let mut out = format!("deferfuse-cache v2\n{tag}\n{}\n", key.len()).into_bytes();
    out.extend_from_slice(&body);
    out
}

#[test]
fn another_plugin_build_never_loads_our_executables() {
    let dir = temp_dir("two-plugins");
    let ours = in_child(&dir, None);
    assert!(ours.compiled >= 4, "{ours:?}");
    let theirs = in_child(&dir, Some(&second_plugin()));
    assert_eq!(
        (theirs.compiled, theirs.loaded, theirs.load_failures),
        (ours.compiled, 0, 0),
        "{theirs:?}"
    );
    // Each build reads back its own entries.
    let again = in_child(&dir, Some(&second_plugin()));
    assert_eq!((again.compiled, again.loaded), (0, ours.compiled), "{again:?}");
    assert_eq!(executable_entries(&dir).len() as u64, 2 * ours.compiled);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn both_cpu_plugins_run_and_name_different_identities() {
    use runtime::pjrt::PjrtBackend;
    let first = match plugin_from_env() {
        Some(path) => PjrtBackend::with_plugin(&path, runtime::MemoryTracker::new()),
        None => PjrtBackend::new(runtime::MemoryTracker::new()),
    }
    .unwrap();
    let second = PjrtBackend::with_plugin(&second_plugin(), runtime::MemoryTracker::new()).unwrap();
    eprintln!("plugin 1: {}\nplugin 2: {}", first.describe(), second.describe());
    let (a, b) = (first.identity().unwrap(), second.identity().unwrap());
    assert_ne!(a, b);
    assert!(a.contains("plugin file") && a.contains("pjrt api 0."), "{a}");
    // The second plugin runs the engine too.
    let ctx = on_pjrt(Mode::DeferAndFuse, &temp_dir("second-runs"), Some(second_plugin()));
    let x = ctx.arange(0.0, 8.0, 1.0, DType::F32).unwrap();
    assert_eq!(x.mul(2.0).unwrap().sum_all().unwrap().item::<f32>().unwrap(), 56.0);
}
