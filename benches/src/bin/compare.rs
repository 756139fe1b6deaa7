//! Side-by-side comparison of DeferAndFuse against Strict on the benchmark
//! workloads, in one process, medians of several runs, with peak memory.
//!
//! `cargo run --release -p benches --bin compare [-- --quick] [--json]`

use std::time::Instant;

use benches::{workload, Size, NAMES};
use clap::Parser;
use deferfuse::{Config, Context, Mode, Result};

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
}

struct Measured {
    /// Rules that fired on the first (cold) flush, and its kernel count.
    rules: String,
    cold_ms: f64,
    warm_ms: f64,
    peak_bytes: usize,
    /// Peak bytes above what was live before the step (the inputs): the
    /// memory the computation itself needed.
    extra_bytes: usize,
}

fn measure(mode: Mode, name: &str, size: Size, runs: usize) -> Result<Measured> {
    // TORCH_TPU_FUSION_DUMP works here too, to look at a workload's flushes
    // with fusion-debug (dumps cost time: do not compare timings taken with it).
    let fusion_dump = std::env::var_os(deferfuse::config::ENV_FUSION_DUMP).map(Into::into);
    let ctx = Context::new(Config { fusion_dump, ..Config::with_mode(mode) })?;
    let w = workload(&ctx, name, size)?;
    let step = || -> Result<f64> {
        let start = Instant::now();
        let outputs = (w.step)(&w.inputs)?;
        ctx.sync()?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        drop(outputs);
        Ok(ms)
    };
    let cold_ms = step()?;
    let rules = match ctx.last_flush() {
        Some(f) => format!("{} kernels for {} trace nodes; rules: {:?}", f.kernels, f.trace_nodes, f.rules_fired.unwrap_or_default()),
        None => String::new(),
    };
    let before = ctx.memory().live_bytes;
    ctx.reset_peak_memory();
    let mut times = (0..runs).map(|_| step()).collect::<Result<Vec<_>>>()?;
    times.sort_by(f64::total_cmp);
    let peak_bytes = ctx.memory().peak_bytes;
    Ok(Measured { rules, cold_ms, warm_ms: times[times.len() / 2], peak_bytes, extra_bytes: peak_bytes - before })
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

fn main() -> Result<()> {
    let args = Args::parse();
    let size = if args.quick { Size::Quick } else { Size::Full };
    let runs = args.runs.unwrap_or(if args.quick { 3 } else { 7 });
    let names: Vec<&str> = if args.workload.is_empty() {
        NAMES.to_vec()
    } else {
        NAMES.iter().copied().filter(|n| args.workload.iter().any(|w| w == n)).collect()
    };
    if !args.json {
        println!(
            "{:<18} {:>10} {:>10} {:>13} {:>8} {:>17} {:>17} {:>12}",
            "workload", "strict_ms", "fused_ms", "fused_cold_ms", "speedup", "strict_peak_bytes", "fused_peak_bytes", "extra_ratio"
        );
    }
    let mut log_speedup = 0.0;
    for name in &names {
        let strict = measure(Mode::Strict, name, size, runs)?;
        let fused = measure(Mode::DeferAndFuse, name, size, runs)?;
        let speedup = strict.warm_ms / fused.warm_ms;
        log_speedup += speedup.ln();
        if args.json {
            println!(
                "{{\"workload\":\"{name}\",\"strict_ms\":{:.3},\"fused_ms\":{:.3},\"fused_cold_ms\":{:.3},\"speedup\":{:.3},\"strict_peak_bytes\":{},\"fused_peak_bytes\":{},\"strict_extra_bytes\":{},\"fused_extra_bytes\":{}}}",
                strict.warm_ms, fused.warm_ms, fused.cold_ms, speedup, strict.peak_bytes, fused.peak_bytes, strict.extra_bytes, fused.extra_bytes
            );
        } else {
            println!(
                "{:<18} {:>10.2} {:>10.2} {:>13.2} {:>8.2} {:>17} {:>17} {:>12.2}",
                name,
                strict.warm_ms,
                fused.warm_ms,
                fused.cold_ms,
                speedup,
                strict.peak_bytes,
                fused.peak_bytes,
                fused.extra_bytes as f64 / strict.extra_bytes.max(1) as f64
            );
        }
        if args.rules && !args.json {
            println!("  {}", fused.rules);
        }
        if *name == "gelu_tanh" && !args.json {
            let elements = if args.quick { 1 << 20 } else { 4 << 20 };
            let bytes = elements * 4;
            let fused_gbs = 2.0 * bytes as f64 / (fused.warm_ms / 1e3) / 1e9;
            println!(
                "  gelu_tanh fused throughput {:.1} GB/s vs copy bandwidth {:.1} GB/s ({:.0}%)",
                fused_gbs,
                copy_bandwidth(bytes, runs),
                100.0 * fused_gbs / copy_bandwidth(bytes, runs)
            );
        }
    }
    if !args.json {
        println!("geometric-mean speedup: {:.2}", (log_speedup / names.len() as f64).exp());
        println!("extra_ratio: fused / strict peak bytes above the inputs held before the step");
    }
    Ok(())
}
