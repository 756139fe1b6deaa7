//! Row kernels against the memory-bandwidth floor, side by side in one run:
//!
//! `cargo run --release -p benches --bin rows [-- --runs N] [--rows R] [--cols C] [--json]`
//!
//! Each figure is the median and the minimum of `--runs` timed runs (default
//! 20, after 3 warm-up runs) on a `[R, C]` f32 input (default 4096x1024):
//!
//! - `copy`: `copy_from_slice` of the input's bytes into a buffer allocated
//!   once, split over rayon's threads as the engine's tiles are: the floor;
//! - `neg`: an elementwise kernel through the engine, the same bytes read
//!   and written plus what a launch costs;
//! - `layer_norm`, `rms_norm`, `softmax`, `log_softmax`: the engine's ops
//!   (the ones the binding calls), and `ln_workload`, `softmax_workload`:
//!   the same written as primitives ([`deferfuse::workloads`]).
//!
//! `--only NAME` runs one of them (and the floor), e.g. under a profiler;
//! `--mode strict` or `--mode defer` one mode. `--accuracy` also prints, for
//! the LayerNorms and softmaxes, the error against the f64 reference
//! ([`benches::reference64`]) on the same inputs (`--offset V` adds `V` to
//! the input first: a mean far from 0 tests the sums).
//!
//! GB/s counts the input read once and the output written once, which is all
//! a fused row kernel must move; the copy moves the same.

use std::time::Instant;

use benches::reference64::{self, error_stats, Array};
use deferfuse::{workloads, Config, Context, DType, Mode, Result, Tensor};
use rayon::prelude::*;

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Median and minimum of `runs` timings of `f`, in seconds, after 3 untimed runs.
fn time(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    for _ in 0..3 {
        f()?;
    }
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok((t[t.len() / 2], t[0]))
}

/// The floor: the same bytes copied by rayon's threads into memory that is
/// already mapped (chunks of 8192 floats, the engine's tile size).
fn copy_floor(runs: usize, n: usize) -> Result<(f64, f64)> {
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut dst = vec![0.0f32; n];
    time(runs, || {
        dst.par_chunks_mut(8192).zip(src.par_chunks(8192)).for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&dst);
        Ok(())
    })
}

fn context(mode: Mode) -> Result<Context> {
    let mut config = Config::from_env()?;
    config.mode = mode;
    config.cache_dir = None;
    Context::new(config)
}

type Op = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;

const OPS: [(&str, Op); 7] = [
    ("neg", |x, _, _| x.neg()),
    ("layer_norm", |x, g, b| x.layer_norm(&[x.shape()[1]], Some(g), Some(b), 1e-5)),
    ("rms_norm", |x, g, _| x.rms_norm(&[x.shape()[1]], Some(g), 1e-6)),
    ("softmax", |x, _, _| x.softmax(-1)),
    ("log_softmax", |x, _, _| x.log_softmax(-1)),
    ("ln_workload", |x, g, b| workloads::layer_norm(x, g, b)),
    ("softmax_workload", |x, _, _| workloads::softmax(x)),
];

/// The f64 reference of kernel `name`, if it has one (the engine's LayerNorm
/// multiplies by an rsqrt where the reference divides by a sqrt: the same
/// value within f32 rounding).
fn reference(name: &str, x: &Array, g: &Array, b: &Array) -> Option<Array> {
    match name {
        "layer_norm" | "ln_workload" => Some(reference64::layer_norm(x, g, b)),
        "softmax" | "softmax_workload" => Some(reference64::softmax(x)),
        _ => None,
    }
}

/// `t`'s values and shape in f64.
fn array(t: &Tensor) -> Result<Array> {
    Ok(Array::new(t.shape(), t.host_data()?.to_f64_vec()))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let runs = arg(&args, "--runs", 20usize).max(1);
    let rows = arg(&args, "--rows", 4096usize);
    let cols = arg(&args, "--cols", 1024usize);
    let json = args.iter().any(|a| a == "--json");
    let only: Option<String> =
        args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let accuracy = args.iter().any(|a| a == "--accuracy");
    let offset = arg(&args, "--offset", 0.0f64);
    let mode_arg: Option<String> =
        args.iter().position(|a| a == "--mode").and_then(|i| args.get(i + 1)).cloned();
    let bytes = (2 * rows * cols * 4) as f64;
    let mut table: Vec<(String, &str, (f64, f64))> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    table.push(("-".into(), "copy", copy_floor(runs, rows * cols)?));
    let modes = [("defer", Mode::DeferAndFuse), ("strict", Mode::Strict)];
    for (_, mode) in modes.into_iter().filter(|(m, _)| mode_arg.as_deref().is_none_or(|a| a == *m))
    {
        let ctx = context(mode)?;
        let x = ctx.randn(&[rows, cols], DType::F32, 1)?.add(offset)?;
        let g = ctx.randn(&[cols], DType::F32, 2)?;
        let b = ctx.randn(&[cols], DType::F32, 3)?;
        ctx.sync()?;
        for (name, op) in OPS {
            if only.as_deref().is_some_and(|o| o != name) {
                continue;
            }
            let t = time(runs, || {
                let y = op(&x, &g, &b)?;
                ctx.sync()?;
                drop(y);
                Ok(())
            })?;
            table.push((format!("{mode:?}"), name, t));
            if accuracy {
                let (xa, ga, ba) = (array(&x)?, array(&g)?, array(&b)?);
                if let Some(want) = reference(name, &xa, &ga, &ba) {
                    let e = error_stats(&array(&op(&x, &g, &b)?)?.data, &want.data);
                    errors.push(format!(
                        "{mode:?} {name}: max abs {:.3e}, max rel {:.3e}, rms {:.3e}",
                        e.max_abs, e.max_rel, e.rms
                    ));
                }
            }
        }
    }
    let threads = rayon::current_num_threads();
    if !json {
        println!("[{rows}, {cols}] f32, {threads} threads, median (min) of {runs}");
    }
    for (mode, what, (med, min)) in &table {
        let (gbs, gbs_best) = (bytes / med / 1e9, bytes / min / 1e9);
        if json {
            println!(
                r#"{{"mode":"{mode}","kernel":"{what}","median_ms":{:.4},"min_ms":{:.4},"gbps":{gbs:.2}}}"#,
                med * 1e3,
                min * 1e3
            );
        } else {
            println!(
                "{mode:<13} {what:<17} {:>8.3} ms ({:>7.3}) {gbs:>7.2} GB/s ({gbs_best:>6.2})",
                med * 1e3,
                min * 1e3
            );
        }
    }
    for e in &errors {
        println!("{e}");
    }
    Ok(())
}
