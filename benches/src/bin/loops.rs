//! What DeferAndFuse costs in steady-state loops, measured side by side with
//! Strict in one run:
//!
//! `cargo run --release -p benches --bin loops [-- --runs N] [--json]`
//!
//! - `record`: recording one small elementwise op (no flush), per op;
//! - `tiny_kernels`: a cache-hit flush of 200 kernels on 4 KB tensors (a
//!   chain of 32x32 matmuls, each with a tanh epilogue), per kernel;
//! - `mlp_train`: a training step of a 2-layer MLP (the backward written out,
//!   SGD), 256x64 -> 256 -> 64, with and without reading the loss each step;
//!   it also counts tier-1 misses after the third step (0 is steady state).
//!
//! Each figure is the median of `--runs` runs (default 5).

use std::time::Instant;

use deferfuse::{Config, Context, DType, Mode, Result, Tensor};

fn context(mode: Mode) -> Result<Context> {
    let mut config = Config::from_env()?;
    config.mode = mode;
    config.cache_dir = None;
    Context::new(config)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Microseconds per recorded op: `y = y * a` on 8 floats, 2000 times.
fn record(mode: Mode) -> Result<f64> {
    let ctx = context(mode)?;
    let a = ctx.ones(&[8], DType::F32)?;
    let mut y = ctx.ones(&[8], DType::F32)?;
    let n = 2000;
    let start = Instant::now();
    for _ in 0..n {
        y = y.mul(&a)?;
    }
    let took = start.elapsed().as_secs_f64();
    ctx.sync()?;
    Ok(took / n as f64 * 1e6)
}

/// Microseconds per kernel of a cache-hit flush of 200 small kernels.
fn tiny_kernels(mode: Mode) -> Result<f64> {
    let ctx = context(mode)?;
    let w = ctx.randn(&[32, 32], DType::F32, 1)?.mul(0.2)?;
    let x0 = ctx.randn(&[32, 32], DType::F32, 2)?;
    ctx.sync()?;
    let mut times = Vec::new();
    for _ in 0..6 {
        let start = Instant::now();
        let mut x = x0.clone();
        for _ in 0..200 {
            x = x.matmul(&w)?.tanh()?;
        }
        x.host_data()?;
        times.push(start.elapsed().as_secs_f64());
    }
    // The first runs rewrite and compile; the steady state is what is left.
    Ok(median(times[3..].to_vec()) / 200.0 * 1e6)
}

/// The MLP's parameters.
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

/// One SGD step of `relu(x w1 + b1) w2 + b2` against `y` with the mean
/// squared error; returns the new parameters and the loss.
fn sgd_step(m: &Mlp, x: &Tensor, y: &Tensor, lr: f64) -> Result<(Mlp, Tensor)> {
    let batch = x.shape()[0] as f64;
    let pre = x.matmul(&m.w1)?.add(&m.b1)?;
    let h = pre.relu()?;
    let out = h.matmul(&m.w2)?.add(&m.b2)?;
    let diff = out.sub(y)?;
    let loss = diff.mul(&diff)?.mean(&[0, 1], false)?;
    // d loss / d out = 2 diff / numel
    let g_out = diff.mul(2.0 / (batch * y.shape()[1] as f64))?;
    let g_w2 = h.t()?.matmul(&g_out)?;
    let g_b2 = g_out.sum(&[0], false)?;
    let g_h = g_out.matmul(&m.w2.t()?)?;
    let mask = pre.gt(0.0)?.to_dtype(DType::F32)?;
    let g_pre = g_h.mul(&mask)?;
    let g_w1 = x.t()?.matmul(&g_pre)?;
    let g_b1 = g_pre.sum(&[0], false)?;
    let step = |p: &Tensor, g: &Tensor| p.sub(&g.mul(lr)?);
    let next = Mlp {
        w1: step(&m.w1, &g_w1)?,
        b1: step(&m.b1, &g_b1)?,
        w2: step(&m.w2, &g_w2)?,
        b2: step(&m.b2, &g_b2)?,
    };
    Ok((next, loss))
}

/// Milliseconds per training step after the third, and tier-1 misses then.
fn mlp_train(mode: Mode, read_each_step: bool) -> Result<(f64, u64)> {
    let ctx = context(mode)?;
    let (d, hidden, batch) = (64, 256, 256);
    let x = ctx.randn(&[batch, d], DType::F32, 3)?;
    let y = x.tanh()?;
    let mut m = Mlp {
        w1: ctx.randn(&[d, hidden], DType::F32, 4)?.mul(1.0 / (d as f64).sqrt())?,
        b1: ctx.zeros(&[hidden], DType::F32)?,
        w2: ctx.randn(&[hidden, d], DType::F32, 5)?.mul(1.0 / (hidden as f64).sqrt())?,
        b2: ctx.zeros(&[d], DType::F32)?,
    };
    ctx.sync()?;
    let (steps, warm) = (40, 3);
    let (mut start, mut misses) = (Instant::now(), 0);
    let mut loss = None;
    for i in 0..steps {
        if i == warm {
            ctx.sync()?;
            start = Instant::now();
            misses = ctx.stats().cache.tier1.misses;
        }
        let (next, l) = sgd_step(&m, &x, &y, 0.05)?;
        if read_each_step {
            l.item::<f32>()?;
        }
        m = next;
        loss = Some(l);
    }
    if let Some(l) = loss {
        l.item::<f32>()?;
    }
    ctx.sync()?;
    let per_step = start.elapsed().as_secs_f64() / (steps - warm) as f64 * 1e3;
    Ok((per_step, ctx.stats().cache.tier1.misses - misses))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let runs = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(5);
    let json = args.iter().any(|a| a == "--json");
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let modes = [Mode::Strict, Mode::DeferAndFuse];
    let mut rows: Vec<(String, &str, f64, String)> = Vec::new();
    for mode in modes {
        let name = format!("{mode:?}");
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let us = median((0..runs).map(|_| record(mode)).collect::<Result<Vec<_>>>()?);
        rows.push((name.clone(), "record", us, "us/op".into()));
        let us = median((0..runs).map(|_| tiny_kernels(mode)).collect::<Result<Vec<_>>>()?);
        rows.push((name.clone(), "tiny_kernels", us, "us/kernel".into()));
        for (read, what) in [(false, "mlp_train"), (true, "mlp_train_read")] {
            let results = (0..runs).map(|_| mlp_train(mode, read)).collect::<Result<Vec<_>>>()?;
            let worst_misses = results.iter().map(|r| r.1).max().unwrap_or(0);
            let ms = median(results.iter().map(|r| r.0).collect());
            rows.push((name.clone(), what, ms, format!("ms/step, {worst_misses} late misses")));
        }
    }
    for (mode, what, value, unit) in &rows {
        if json {
            println!(
                r#"{{"mode":"{mode}","workload":"{what}","value":{value:.4},"unit":"{unit}"}}"#
            );
        } else {
            println!("{mode:<13} {what:<15} {value:>10.3} {unit}");
        }
    }
    Ok(())
}
