//! Shared by the fusion-debug tests: the benchmark workloads at small sizes
//! (the same op sequences as `benches/src/lib.rs`, which the engine's tests
//! cannot depend on), run in DeferAndFuse with dumps on, and the CLI.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

use deferfuse::dump::FlushDump;
use deferfuse::{Config, Context, Mode, Result, Tensor};

/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("deferfuse-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A DeferAndFuse context that dumps every flush into `dir`.
pub fn dumping_context(dir: &Path) -> Context {
    let config =
        Config { fusion_dump: Some(dir.to_path_buf()), ..Config::with_mode(Mode::DeferAndFuse) };
    Context::new(config).unwrap()
}

/// Deterministic values in [-scale, scale), uploaded as they are (no ops, so
/// no flush of their own).
pub fn input(ctx: &Context, shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let data = (0..n)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect();
    ctx.from_vec::<f32>(data, shape).unwrap()
}

pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    let cube = x.mul(x)?.mul(x)?;
    let inner = x.add(&cube.mul(0.044715)?)?.mul(0.7978845608028654)?;
    x.mul(0.5)?.mul(&inner.tanh()?.add(1.0)?)
}

pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<Tensor> {
    let mean = x.mean(&[-1], true)?;
    let centered = x.sub(&mean)?;
    let var = centered.mul(&centered)?.mean(&[-1], true)?;
    centered.div(&var.add(1e-5)?.sqrt()?)?.mul(gamma)?.add(beta)
}

pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let shifted = x.sub(&x.max(&[-1], true)?)?;
    let e = shifted.exp()?;
    e.div(&e.sum(&[-1], true)?)
}

pub fn mlp_block(t: &[Tensor]) -> Result<Tensor> {
    let (x, w1, b1, w2, b2) = (&t[0], &t[1], &t[2], &t[3], &t[4]);
    let h = gelu_tanh(&x.matmul(&w1.t()?)?.add(b1)?)?;
    let y = h.matmul(&w2.t()?)?.add(b2)?.add(x)?;
    layer_norm(&y, &t[5], &t[6])
}

pub fn adam_step(p: &Tensor, m: &Tensor, v: &Tensor, g: &Tensor) -> Result<Vec<Tensor>> {
    let (lr, beta1, beta2, eps, t): (f64, f64, f64, f64, i32) = (1e-3, 0.9, 0.999, 1e-8, 3);
    let m = m.mul(beta1)?.add(&g.mul(1.0 - beta1)?)?;
    let v = v.mul(beta2)?.add(&g.mul(g)?.mul(1.0 - beta2)?)?;
    let m_hat = m.div(1.0 - beta1.powi(t))?;
    let v_hat = v.div(1.0 - beta2.powi(t))?;
    let p = p.sub(&m_hat.div(&v_hat.sqrt()?.add(eps)?)?.mul(lr)?)?;
    Ok(vec![p, m, v])
}

pub fn transformer_block(t: &[Tensor]) -> Result<Tensor> {
    let (x, wq, wk, wv, wo, w1, w2) = (&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6]);
    let (batch, seq, width) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let heads = 4;
    let head_dim = width / heads;
    let split = |y: Tensor| y.reshape(&[batch, seq, heads, head_dim])?.permute(&[0, 2, 1, 3]);
    let h = layer_norm(x, &t[7], &t[8])?;
    let q = split(h.matmul(&wq.t()?)?)?;
    let k = split(h.matmul(&wk.t()?)?)?;
    let v = split(h.matmul(&wv.t()?)?)?;
    let scores = q.matmul(&k.transpose(-2, -1)?)?.mul(1.0 / (head_dim as f64).sqrt())?;
    let attn = softmax(&scores)?.matmul(&v)?;
    let merged = attn.permute(&[0, 2, 1, 3])?.reshape(&[batch, seq, width])?;
    let x = x.add(&merged.matmul(&wo.t()?)?)?;
    let h = layer_norm(&x, &t[9], &t[10])?;
    let mlp = gelu_tanh(&h.matmul(&w1.t()?)?)?.matmul(&w2.t()?)?;
    x.add(&mlp)
}

/// The six workloads' names, as in `benches`.
pub const WORKLOADS: [&str; 6] =
    ["gelu_tanh", "layer_norm", "softmax", "mlp_block", "adam_step", "transformer_block"];

/// Runs workload `name` once in a fresh dumping context (with `batch` rows
/// where the workload has a batch) and returns the one dump its flush wrote.
pub fn run_workload(dir: &Path, name: &str, batch: usize) -> PathBuf {
    run_workload_in(&dumping_context(dir), dir, name, batch)
}

/// [`run_workload`] in `ctx`, which dumps into `dir`: a second call at
/// another batch size finds the first one's program in tier 1.
pub fn run_workload_in(ctx: &Context, dir: &Path, name: &str, batch: usize) -> PathBuf {
    let before = listed(dir);
    let outputs = match name {
        "gelu_tanh" => vec![gelu_tanh(&input(ctx, &[batch, 256], 1, 3.0)).unwrap()],
        "layer_norm" => {
            let (x, g, b) = (
                input(ctx, &[batch, 128], 2, 1.0),
                input(ctx, &[128], 3, 1.0),
                input(ctx, &[128], 4, 0.1),
            );
            vec![layer_norm(&x, &g, &b).unwrap()]
        }
        "softmax" => vec![softmax(&input(ctx, &[batch, 128], 5, 2.0)).unwrap()],
        "mlp_block" => {
            let (width, hidden) = (64, 256);
            let t = [
                input(ctx, &[batch, width], 6, 1.0),
                input(ctx, &[hidden, width], 7, 0.125),
                input(ctx, &[hidden], 8, 0.1),
                input(ctx, &[width, hidden], 9, 0.0625),
                input(ctx, &[width], 10, 0.1),
                input(ctx, &[width], 11, 1.0),
                input(ctx, &[width], 12, 0.1),
            ];
            vec![mlp_block(&t).unwrap()]
        }
        "adam_step" => {
            let n = batch * 256;
            let t: Vec<Tensor> = (0..4).map(|i| input(ctx, &[n], 13 + i, 0.01)).collect();
            adam_step(&t[0], &t[1], &t[2], &t[3]).unwrap()
        }
        "transformer_block" => {
            let (seq, width) = (16, 64);
            let mut t = vec![input(ctx, &[batch, seq, width], 20, 1.0)];
            for (i, shape) in [
                [width, width],
                [width, width],
                [width, width],
                [width, width],
                [4 * width, width],
                [width, 4 * width],
            ]
            .iter()
            .enumerate()
            {
                t.push(input(ctx, shape, 21 + i as u64, 0.125));
            }
            for i in 0..4 {
                t.push(input(ctx, &[width], 30 + i, 0.1));
            }
            vec![transformer_block(&t).unwrap()]
        }
        other => panic!("unknown workload {other}"),
    };
    for o in &outputs {
        o.to_vec::<f32>().unwrap();
    }
    let new: Vec<PathBuf> = listed(dir).into_iter().filter(|p| !before.contains(p)).collect();
    assert_eq!(new.len(), 1, "{name}: one flush, one dump; got {new:?}");
    new.into_iter().next().unwrap()
}

fn listed(dir: &Path) -> Vec<PathBuf> {
    FlushDump::list(dir).unwrap_or_default()
}

/// Runs the `fusion-debug` binary.
pub fn cli(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fusion-debug"))
        .args(args)
        .output()
        .expect("fusion-debug runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
