//! Side-by-side comparison of DeferAndFuse against Strict on the benchmark
//! workloads, in one process, medians of several runs, with peak memory.
//!
//! `cargo run --release -p benches --bin compare [-- --quick] [--json]`
//!
//! `--backend pjrt` (build with `--features pjrt`) runs both modes through a
//! PJRT plugin instead of the native backend; the JSON keys stay the same.
//! `--peers` also runs `jax.jit` of the same six workloads
//! (`benches/peers/jax_workloads.py` in the bench venv that
//! `benches/peers/setup_jax.sh` creates) and adds `jax_ms`, `jax_min_ms`,
//! `fused_min_ms`, `jax_compile_ms` and `fused_compile_ms` (our compile time
//! of the fused step) per workload. jax runs on the PJRT plugin deferfuse
//! runs on (jaxlib's own CPU client with the native backend), with the same
//! shapes and the same step: the Adam state carried and donated on both
//! sides, every step synchronized. The two sides' warm steps are
//! interleaved in rounds, so that both see the same load on the machine.

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
    /// Skip Strict (its columns print 0): for profiling DeferAndFuse alone.
    #[arg(long)]
    fused_only: bool,
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
    min_ms: f64,
    peak_bytes: usize,
    /// Peak bytes above what was live before the step (the inputs): the
    /// memory the computation itself needed.
    extra_bytes: usize,
}

/// A workload in one context, its cold step done, ready for warm steps.
struct Runner {
    ctx: Context,
    inputs: Vec<deferfuse::Tensor>,
    step: fn(&[deferfuse::Tensor]) -> Result<Vec<deferfuse::Tensor>>,
    carried: usize,
    cold: Measured,
    live_before: usize,
    times: Vec<f64>,
}

impl Runner {
    fn start(mode: Mode, backend: BackendKind, name: &str, size: Size) -> Result<Runner> {
        // TORCH_TPU_FUSION_DUMP works here too, to look at a workload's flushes
        // with fusion-debug (dumps cost time: do not compare timings taken with it).
        let fusion_dump = std::env::var_os(deferfuse::config::ENV_FUSION_DUMP).map(Into::into);
        let ctx = Context::new(Config { mode, backend, fusion_dump, ..Config::default() })?;
        let w = workload(&ctx, name, size)?;
        let cold = Measured {
            compile_ms: 0.0,
            prepare_ms: 0.0,
            rules: String::new(),
            cold_ms: 0.0,
            warm_ms: 0.0,
            min_ms: 0.0,
            peak_bytes: 0,
            extra_bytes: 0,
        };
        let mut r = Runner {
            ctx,
            inputs: w.inputs,
            step: w.step,
            carried: w.carried,
            cold,
            live_before: 0,
            times: Vec::new(),
        };
        let cache_before = r.ctx.stats().cache;
        r.cold.cold_ms = r.step()?;
        let cache = r.ctx.stats().cache;
        r.cold.compile_ms = (cache.compile_ns - cache_before.compile_ns) as f64 / 1e6;
        r.cold.prepare_ms = r.cold.compile_ms
            + (cache.rewrite_ns - cache_before.rewrite_ns + cache.plan_ns - cache_before.plan_ns)
                as f64
                / 1e6;
        if let Some(f) = r.ctx.last_flush() {
            r.cold.rules = format!(
                "{} kernels for {} trace nodes; rules: {:?}",
                f.kernels,
                f.trace_nodes,
                f.rules_fired.unwrap_or_default()
            );
        }
        r.live_before = r.ctx.memory().live_bytes;
        r.ctx.reset_peak_memory();
        Ok(r)
    }

    /// One step, timed: record, replace carried state, synchronize.
    fn step(&mut self) -> Result<f64> {
        let start = Instant::now();
        let mut outputs = (self.step)(&self.inputs)?;
        // Carried state replaces the old before the read, as in a training
        // loop, so the old buffers are free (Strict) or donated (DeferAndFuse).
        for (old, new) in self.inputs.iter_mut().zip(outputs.drain(..self.carried)) {
            *old = new;
        }
        self.ctx.sync()?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        drop(outputs);
        Ok(ms)
    }

    fn run(&mut self, n: usize) -> Result<()> {
        for _ in 0..n {
            let ms = self.step()?;
            self.times.push(ms);
        }
        Ok(())
    }

    fn finish(mut self) -> Measured {
        self.times.sort_by(f64::total_cmp);
        let peak_bytes = self.ctx.memory().peak_bytes;
        Measured {
            warm_ms: self.times[self.times.len() / 2],
            min_ms: self.times[0],
            peak_bytes,
            extra_bytes: peak_bytes.saturating_sub(self.live_before),
            ..self.cold
        }
    }
}

fn measure(
    mode: Mode,
    backend: BackendKind,
    name: &str,
    size: Size,
    runs: usize,
) -> Result<Measured> {
    let mut r = Runner::start(mode, backend, name, size)?;
    r.run(runs)?;
    Ok(r.finish())
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
    jax_min_ms: f64,
    jax_compile_ms: f64,
}

/// Steps each side runs per round when interleaving with the jax peer.
const STEPS_PER_ROUND: usize = 5;

/// The jax peer (`benches/peers/jax_workloads.py --serve` in `.venv-bench`),
/// on the PJRT plugin deferfuse runs on, answering one request at a time.
struct JaxPeer {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    log: std::path::PathBuf,
}

impl JaxPeer {
    fn start(
        quick: bool,
        plugin: Option<&std::path::Path>,
        donate: bool,
    ) -> std::result::Result<JaxPeer, String> {
        use std::process::{Command, Stdio};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let python = root.join(".venv-bench/bin/python");
        if !python.is_file() {
            return Err(format!(
                "{} is missing: run `bash benches/peers/setup_jax.sh` first",
                python.display()
            ));
        }
        let log =
            std::env::temp_dir().join(format!("deferfuse-jax-peer-{}.log", std::process::id()));
        let stderr = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let mut cmd = Command::new(&python);
        cmd.arg(root.join("benches/peers/jax_workloads.py")).arg("--serve");
        if quick {
            cmd.arg("--quick");
        }
        if let Some(p) = plugin {
            cmd.arg("--plugin").arg(p);
        }
        if donate {
            cmd.arg("--donate");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(JaxPeer { child, stdin, stdout, log })
    }

    /// Sends one request and reads its JSON line.
    fn ask(&mut self, request: &str) -> std::result::Result<String, String> {
        use std::io::{BufRead, Write};
        let failed = |this: &Self, what: String| {
            let log = std::fs::read_to_string(&this.log).unwrap_or_default();
            let tail: Vec<&str> =
                log.lines().filter(|l| !l.contains("Unsupported fusion type")).collect();
            format!(
                "the jax peer failed ({what}): {}",
                tail[tail.len().saturating_sub(20)..].join("\n")
            )
        };
        writeln!(self.stdin, "{request}")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| failed(self, e.to_string()))?;
        let mut line = String::new();
        loop {
            line.clear();
            match self.stdout.read_line(&mut line) {
                Ok(0) => return Err(failed(self, format!("no answer to `{request}`"))),
                Ok(_) if line.starts_with('{') => return Ok(line.trim().to_string()),
                Ok(_) => continue,
                Err(e) => return Err(failed(self, e.to_string())),
            }
        }
    }

    /// Compiles and warms up `name`; returns its compile time.
    fn prepare(&mut self, name: &str) -> std::result::Result<f64, String> {
        let line = self.ask(&format!("prepare {name}"))?;
        number(&line, "jax_compile_ms")
            .ok_or_else(|| format!("unreadable answer from the jax peer: {line}"))
    }

    /// `n` timed steps of the prepared workload.
    fn run(&mut self, n: usize) -> std::result::Result<Vec<f64>, String> {
        let line = self.ask(&format!("run {n}"))?;
        let list = line.split('[').nth(1).and_then(|r| r.split(']').next()).unwrap_or_default();
        list.split(',')
            .map(|v| {
                v.trim().parse().map_err(|_| format!("unreadable answer from the jax peer: {line}"))
            })
            .collect()
    }
}

impl Drop for JaxPeer {
    fn drop(&mut self) {
        let _ = self.ask("quit");
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The number after `"key":` in a JSON line.
fn number(line: &str, key: &str) -> Option<f64> {
    let rest = &line[line.find(&format!("\"{key}\":"))? + key.len() + 3..];
    rest.trim_start().split([',', '}']).next()?.trim().parse().ok()
}

/// DeferAndFuse and jax.jit on one workload, their warm steps interleaved
/// (rounds of [`STEPS_PER_ROUND`] steps each, `runs` rounds), so that both
/// see the same machine load; medians over all steps.
fn measure_with_peer(
    peer: &mut JaxPeer,
    backend: BackendKind,
    name: &str,
    size: Size,
    runs: usize,
) -> Result<(Measured, Peer)> {
    let peer_err = |e: String| deferfuse::Error::backend("jax peer", e);
    let jax_compile_ms = peer.prepare(name).map_err(peer_err)?;
    let mut ours = Runner::start(Mode::DeferAndFuse, backend, name, size)?;
    let mut jax = Vec::new();
    for _ in 0..runs {
        jax.extend(peer.run(STEPS_PER_ROUND).map_err(peer_err)?);
        ours.run(STEPS_PER_ROUND)?;
    }
    jax.sort_by(f64::total_cmp);
    Ok((ours.finish(), Peer { jax_ms: jax[jax.len() / 2], jax_min_ms: jax[0], jax_compile_ms }))
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
    let mut peer = match args.peers {
        true => {
            // jax runs on the plugin deferfuse runs on (the native backend
            // has none: jax then uses jaxlib's own CPU client). DeferAndFuse
            // donates the Adam step's old state (on both backends), so jax
            // donates it too.
            let plugin = Context::new(Config { backend: args.backend, ..Config::default() })?
                .backend_plugin();
            if let Some(p) = &plugin {
                println!("jax peer on the PJRT plugin {}", p.display());
            }
            Some(
                JaxPeer::start(args.quick, plugin.as_deref(), true)
                    .map_err(|e| deferfuse::Error::backend("jax peer", e))?,
            )
        }
        false => None,
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
        let strict = match args.fused_only {
            false => measure(Mode::Strict, args.backend, name, size, runs)?,
            true => Measured {
                compile_ms: 0.0,
                prepare_ms: 0.0,
                rules: String::new(),
                cold_ms: 0.0,
                warm_ms: 0.0,
                min_ms: 0.0,
                peak_bytes: 0,
                extra_bytes: 0,
            },
        };
        let (fused, peer) = match &mut peer {
            Some(p) => {
                let (fused, jax) = measure_with_peer(p, args.backend, name, size, runs)?;
                (fused, Some(jax))
            }
            None => (measure(Mode::DeferAndFuse, args.backend, name, size, runs)?, None),
        };
        let peer = peer.as_ref();
        if let Some(p) = peer {
            log_vs_jax.push((fused.warm_ms / p.jax_ms).ln());
        }
        let speedup = strict.warm_ms / fused.warm_ms;
        log_speedup += speedup.ln();
        if args.json {
            let peer_keys = peer.map_or(String::new(), |p| {
                format!(
                    ",\"jax_ms\":{:.3},\"jax_min_ms\":{:.3},\"fused_min_ms\":{:.3},\"jax_compile_ms\":{:.3},\"fused_compile_ms\":{:.3}",
                    p.jax_ms, p.jax_min_ms, fused.min_ms, p.jax_compile_ms, fused.compile_ms
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
                "  jax.jit {:.2} ms (fused / jax {:.2}; best runs {:.2} / {:.2} ms); compile: jax {:.1} ms, fused {:.1} ms",
                p.jax_ms,
                fused.warm_ms / p.jax_ms,
                fused.min_ms,
                p.jax_min_ms,
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
