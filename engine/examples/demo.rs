//! The main job: an MLP block with LayerNorm, run in the three eager modes.
//!
//! `cargo run --release -p deferfuse --example demo [-- --json]`
//!
//! The `TORCH_TPU_*` variables apply (the mode is set per run), so
//! `TORCH_TPU_BACKEND=pjrt cargo run --release -p deferfuse --features pjrt
//! --example demo` runs it through a PJRT plugin.
//!
//! Per mode it prints the wall time of the block (after one warm-up run that
//! fills the caches), the peak bytes the context held, and the largest
//! absolute difference from Strict's result.
//!
//! Exit codes: 0 success; 1 the engine failed (the error is printed); 4 the
//! report could not be written (standard output closed, as by `| head -1`,
//! or full, as `> /dev/full`).

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use deferfuse::{Config, Context, DType, GeluApproximation, Mode, Result, Tensor};

const BATCH: usize = 256;
const WIDTH: usize = 512;
const HIDDEN: usize = 2048;
const RUNS: usize = 5;

struct Weights {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
    gamma: Tensor,
    beta: Tensor,
}

fn weights(ctx: &Context) -> Result<Weights> {
    let scale = |t: Tensor, fan_in: usize| t.mul(1.0 / (fan_in as f64).sqrt());
    let w = Weights {
        w1: scale(ctx.randn(&[HIDDEN, WIDTH], DType::F32, 1)?, WIDTH)?,
        b1: ctx.randn(&[HIDDEN], DType::F32, 2)?.mul(0.1)?,
        w2: scale(ctx.randn(&[WIDTH, HIDDEN], DType::F32, 3)?, HIDDEN)?,
        b2: ctx.randn(&[WIDTH], DType::F32, 4)?.mul(0.1)?,
        gamma: ctx.rand(&[WIDTH], DType::F32, 5)?.add(0.5)?,
        beta: ctx.randn(&[WIDTH], DType::F32, 6)?.mul(0.1)?,
    };
    ctx.sync()?;
    Ok(w)
}

/// `LayerNorm(x + W2 · GELU(W1 · x + b1) + b2)`.
fn mlp_block(x: &Tensor, w: &Weights) -> Result<Tensor> {
    let h = x.linear(&w.w1, Some(&w.b1))?.gelu(GeluApproximation::Tanh)?;
    let y = h.linear(&w.w2, Some(&w.b2))?.add(x)?;
    y.layer_norm(&[WIDTH], Some(&w.gamma), Some(&w.beta), 1e-5)
}

struct Report {
    mode: Mode,
    backend: &'static str,
    time_ms: f64,
    peak_bytes: usize,
    output: Vec<f32>,
}

fn run(mode: Mode) -> Result<Report> {
    let ctx = Context::new(Config { mode, ..Config::from_env()? })?;
    let w = weights(&ctx)?;
    let x = ctx.randn(&[BATCH, WIDTH], DType::F32, 7)?;
    ctx.sync()?;
    let mut output = mlp_block(&x, &w)?.to_vec::<f32>()?; // warm-up: fills the caches
    let mut times = Vec::new();
    ctx.reset_peak_memory();
    for _ in 0..RUNS {
        let start = Instant::now();
        output = mlp_block(&x, &w)?.to_vec::<f32>()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(Report {
        mode,
        backend: ctx.backend_name(),
        time_ms: times[RUNS / 2],
        peak_bytes: ctx.memory().peak_bytes,
        output,
    })
}

/// The exit code of a report that could not be written.
const EXIT_OUTPUT: u8 = 4;

fn main() -> ExitCode {
    let json = std::env::args().any(|a| a == "--json");
    let reports = match Mode::ALL.into_iter().map(run).collect::<Result<Vec<_>>>() {
        Ok(reports) => reports,
        Err(e) => return fail(1, &e.to_string()),
    };
    // Through a locked handle with `writeln!`, not `println!`, which panics
    // when standard output is closed or full.
    match print_reports(&mut std::io::stdout().lock(), &reports, json) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(EXIT_OUTPUT, &format!("standard output: cannot write: {e}")),
    }
}

fn fail(code: u8, message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "demo: {message}");
    ExitCode::from(code)
}

fn print_reports(out: &mut impl Write, reports: &[Report], json: bool) -> std::io::Result<()> {
    let strict = &reports[0].output;
    if !json {
        writeln!(out, "MLP block [{BATCH}x{WIDTH}] -> {HIDDEN} -> {WIDTH} + residual + LayerNorm, median of {RUNS} runs")?;
        writeln!(out, "backend: {}", reports[0].backend)?;
        writeln!(
            out,
            "{:<16} {:>10} {:>14} {:>22}",
            "mode", "time_ms", "peak_bytes", "max_abs_diff_vs_strict"
        )?;
    }
    for r in reports {
        let diff = r.output.iter().zip(strict).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        if json {
            writeln!(
                out,
                "{{\"mode\":\"{}\",\"backend\":\"{}\",\"time_ms\":{:.3},\"peak_bytes\":{},\"max_abs_diff_vs_strict\":{:e}}}",
                r.mode, r.backend, r.time_ms, r.peak_bytes, diff
            )?;
        } else {
            writeln!(
                out,
                "{:<16} {:>10.3} {:>14} {:>22e}",
                r.mode.name(),
                r.time_ms,
                r.peak_bytes,
                diff
            )?;
        }
    }
    out.flush()
}
