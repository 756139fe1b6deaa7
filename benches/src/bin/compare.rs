//! Side-by-side comparison of DeferAndFuse against Strict on the benchmark
//! workloads, in one process, medians of several runs, with peak memory.
//!
//! `cargo run --release -p benches --bin compare [-- --quick] [--json]`
//!
//! `--backend pjrt` (build with `--features pjrt`) runs both modes through a
//! PJRT plugin instead of the native backend; the JSON keys stay the same.
//! `--peers` also runs `jax.jit` of the same six workloads on XLA's CPU
//! backend (`benches/peers/jax_workloads.py` in the bench venv that
//! `benches/peers/setup_jax.sh` creates) and adds `jax_ms`, `jax_compile_ms`
//! and `fused_compile_ms` (our compile time of the fused step) per workload.

use std::time::Instant;

use benches::{workload, Size, NAMES};
use clap::Parser;
use deferfuse::{BackendKind, Config, Context, Mode, Result};

#[derive(Parser)]
#[command(about = "DeferAndFuse vs Strict on the benchmark workloads")]
struct Args {
    /// Smaller sizes and fewer runs: the whole run fits in about a minute.
    #[arg(long)]
    quick: bool,
    /// One JSON object per workload instead of a table.
    #[arg(long)]
    json: bool,
    /// Runs per measurement (the median is reported).
    #[arg(long)]
    runs: Option<usize>,
    /// Only these workloads (repeatable).
    #[arg(long)]
    workload: Vec<String>,
    /// Also print, per workload, the rewrite rules that fired and the kernel count.
    #[arg(long)]
    rules: bool,
    /// The backend both modes run on: cpu (native) or pjrt (needs `--features pjrt`).
    #[arg(long, default_value = "cpu")]
    backend: BackendKind,
    /// Also run jax.jit of the same workloads on XLA's CPU backend (needs
    /// `bash benches/peers/setup_jax.sh` once).
    #[arg(long)]
    peers: bool,
    /// Keep glibc's default malloc thresholds. By default they are raised so
    /// that large temporaries are reused instead of being mapped afresh (and
    /// page-faulted) on every op: Strict's best case, which DeferAndFuse's
    /// own buffer cache does not need.
    #[arg(long)]
    system_malloc: bool,
}

/// Raises glibc's mmap and trim thresholds (the tuning PyTorch users apply
/// with `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_`).
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt only changes allocator settings, before any thread starts.
        unsafe {
            // 32 MiB is the largest threshold glibc accepts on 64-bit.
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}

struct Measured {
    /// Backend compile time of the first (cold) step.
    compile_ms: f64,
    /// Rewrite, plan and compile time of the first (cold) step: what the
    /// cold call costs above a warm one.
    prepare_ms: f64,
    /// Rules that fired on the first (cold) flush, and its kernel count.
    rules: String,
    cold_ms: f64,
    warm_ms: f64,
    peak_bytes: usize,
    /// Peak bytes above what was live before the step (the inputs): the
    /// memory the computation itself needed.
    extra_bytes: usize,
}

fn measure(mode: Mode, backend: BackendKind, name: &str, size: Size, runs: usize) -> Result<Measured> {
    // TORCH_TPU_FUSION_DUMP works here too, to look at a workload's flushes
    // with fusion-debug (dumps cost time: do not compare timings taken with it).
    let fusion_dump = std::env::var_os(deferfuse::config::ENV_FUSION_DUMP).map(Into::into);
    let ctx = Context::new(Config { mode, backend, fusion_dump, ..Config::default() })?;
    let w = workload(&ctx, name, size)?;
    let inputs = std::cell::RefCell::new(w.inputs);
    let step = || -> Result<f64> {
        let start = Instant::now();
        let mut outputs = (w.step)(&inputs.borrow())?;
        // Carried state replaces the old before the read, as in a training
        // loop, so the old buffers are free (Strict) or donated (DeferAndFuse).
        for (old, new) in inputs.borrow_mut().iter_mut().zip(outputs.drain(..w.carried)) {
            *old = new;
        }
        ctx.sync()?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        drop(outputs);
        Ok(ms)
    };
    let (cache_before, cold_ms) = (ctx.stats().cache, step()?);
    let cache = ctx.stats().cache;
    let compile_ms = (cache.compile_ns - cache_before.compile_ns) as f64 / 1e6;
    let prepare_ms = compile_ms + (cache.rewrite_ns - cache_before.rewrite_ns + cache.plan_ns - cache_before.plan_ns) as f64 / 1e6;
    let rules = match ctx.last_flush() {
        Some(f) => {
            format!("{} kernels for {} trace nodes; rules: {:?}", f.kernels, f.trace_nodes, f.rules_fired.unwrap_or_default())
        }
        None => String::new(),
    };
    let before = ctx.memory().live_bytes;
    ctx.reset_peak_memory();
    let mut times = (0..runs).map(|_| step()).collect::<Result<Vec<_>>>()?;
    times.sort_by(f64::total_cmp);
    let peak_bytes = ctx.memory().peak_bytes;
    Ok(Measured { compile_ms, prepare_ms, rules, cold_ms, warm_ms: times[times.len() / 2], peak_bytes, extra_bytes: peak_bytes - before })
}

/// Host copy bandwidth in GB/s (read + write), the ceiling for elementwise work.
fn copy_bandwidth(bytes: usize, runs: usize) -> f64 {
    let src = vec![1.0f32; bytes / 4];
    let mut dst = vec![0.0f32; bytes / 4];
    let mut times: Vec<f64> = (0..runs.max(3))
        .map(|_| {
            let start = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    2.0 * bytes as f64 / times[times.len() / 2] / 1e9
}

/// What `jax.jit` measured for one workload.
struct Peer {
    jax_ms: f64,
    jax_compile_ms: f64,
}

/// Runs the jax peer script in `.venv-bench` and reads its JSON lines.
fn run_peers(quick: bool, runs: usize, names: &[&str]) -> std::result::Result<Vec<(String, Peer)>, String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv-bench/bin/python");
    if !python.is_file() {
        return Err(format!("{} is missing: run `bash benches/peers/setup_jax.sh` first", python.display()));
    }
    let mut cmd = std::process::Command::new(&python);
    cmd.arg(root.join("benches/peers/jax_workloads.py")).args(["--runs", &runs.to_string()]);
    if quick {
        cmd.arg("--quick");
    }
    for n in names {
        cmd.args(["--workload", n]);
    }
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!("the jax peer failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let number = |line: &str, key: &str| -> Option<f64> {
        let rest = &line[line.find(&format!("\"{key}\":"))? + key.len() + 3..];
        rest.trim_start().split([',', '}']).next()?.trim().parse().ok()
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let name = l.split("\"workload\": \"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_default();
            match (number(l, "jax_ms"), number(l, "jax_compile_ms")) {
                (Some(jax_ms), Some(jax_compile_ms)) => Ok((name.to_string(), Peer { jax_ms, jax_compile_ms })),
                _ => Err(format!("unreadable line from the jax peer: {l}")),
            }
        })
        .collect()
}

fn main() -> Result<()> {
    let args = Args::parse();
    if !args.system_malloc {
        tune_malloc();
    }
    let size = if args.quick { Size::Quick } else { Size::Full };
    let runs = args.runs.unwrap_or(if args.quick { 3 } else { 7 });
    let names: Vec<&str> = if args.workload.is_empty() {
        NAMES.to_vec()
    } else {
        NAMES.iter().copied().filter(|n| args.workload.iter().any(|w| w == n)).collect()
    };
    let peers = match args.peers {
        true => run_peers(args.quick, runs, &names).map_err(|e| deferfuse::Error::backend("jax peer", e))?,
        false => Vec::new(),
    };
    if !args.json {
        println!("backend: {}", args.backend);
        println!(
            "{:<18} {:>10} {:>10} {:>13} {:>10} {:>8} {:>17} {:>17} {:>12}",
            "workload",
            "strict_ms",
            "fused_ms",
            "fused_cold_ms",
            "prepare_ms",
            "speedup",
            "strict_peak_bytes",
            "fused_peak_bytes",
            "extra_ratio"
        );
    }
    let mut log_speedup = 0.0;
    let mut log_vs_jax = Vec::new();
    for name in &names {
        let strict = measure(Mode::Strict, args.backend, name, size, runs)?;
        let fused = measure(Mode::DeferAndFuse, args.backend, name, size, runs)?;
        let peer = peers.iter().find(|(n, _)| n == name).map(|(_, p)| p);
        if let Some(p) = peer {
            log_vs_jax.push((fused.warm_ms / p.jax_ms).ln());
        }
        let speedup = strict.warm_ms / fused.warm_ms;
        log_speedup += speedup.ln();
        if args.json {
            let peer_keys = peer.map_or(String::new(), |p| {
                format!(
                    ",\"jax_ms\":{:.3},\"jax_compile_ms\":{:.3},\"fused_compile_ms\":{:.3}",
                    p.jax_ms, p.jax_compile_ms, fused.compile_ms
                )
            });
            println!(
                "{{\"workload\":\"{name}\",\"strict_ms\":{:.3},\"fused_ms\":{:.3},\"fused_cold_ms\":{:.3},\"fused_prepare_ms\":{:.3},\"speedup\":{:.3},\"strict_peak_bytes\":{},\"fused_peak_bytes\":{},\"strict_extra_bytes\":{},\"fused_extra_bytes\":{}{peer_keys}}}",
                strict.warm_ms, fused.warm_ms, fused.cold_ms, fused.prepare_ms, speedup, strict.peak_bytes, fused.peak_bytes, strict.extra_bytes, fused.extra_bytes
            );
        } else {
            println!(
                "{:<18} {:>10.2} {:>10.2} {:>13.2} {:>10.2} {:>8.2} {:>17} {:>17} {:>12.2}",
                name,
                strict.warm_ms,
                fused.warm_ms,
                fused.cold_ms,
                fused.prepare_ms,
                speedup,
                strict.peak_bytes,
                fused.peak_bytes,
                fused.extra_bytes as f64 / strict.extra_bytes.max(1) as f64
            );
        }
        if let (Some(p), false) = (peer, args.json) {
            println!(
                "  jax.jit {:.2} ms (fused / jax {:.2}); compile: jax {:.1} ms, fused {:.1} ms",
                p.jax_ms,
                fused.warm_ms / p.jax_ms,
                p.jax_compile_ms,
                fused.compile_ms
            );
        }
        if args.rules && !args.json {
            println!("  {}", fused.rules);
        }
        if *name == "gelu_tanh" && !args.json {
            let elements = if args.quick { 1 << 20 } else { 4 << 20 };
            let bytes = elements * 4;
            let fused_gbs = 2.0 * bytes as f64 / (fused.warm_ms / 1e3) / 1e9;
            let copy_gbs = copy_bandwidth(bytes, runs);
            println!(
                "  gelu_tanh fused throughput {:.1} GB/s vs copy bandwidth {:.1} GB/s ({:.0}%)",
                fused_gbs,
                copy_gbs,
                100.0 * fused_gbs / copy_gbs
            );
        }
    }
    if !args.json {
        println!("geometric-mean speedup: {:.2}", (log_speedup / names.len() as f64).exp());
        if !log_vs_jax.is_empty() {
            println!(
                "geometric-mean execute ratio fused / jax.jit: {:.2}",
                (log_vs_jax.iter().sum::<f64>() / log_vs_jax.len() as f64).exp()
            );
        }
        println!("extra_ratio: fused / strict peak bytes above the inputs held before the step");
    }
    Ok(())
}
