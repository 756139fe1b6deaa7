//! Shared by the fusion-debug tests: the benchmark workloads
//! ([`deferfuse::workloads`]) at small sizes, run in DeferAndFuse with dumps
//! on, and the CLI.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

use deferfuse::dump::FlushDump;
pub use deferfuse::workloads::{
    adam_step, gelu_tanh, layer_norm, mlp_block, softmax, transformer_block,
    transformer_weight_shapes,
};
use deferfuse::{Config, Context, Mode, Tensor};

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
            vec![mlp_block(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6]).unwrap()]
        }
        "adam_step" => {
            let n = batch * 256;
            let t: Vec<Tensor> = (0..4).map(|i| input(ctx, &[n], 13 + i, 0.01)).collect();
            adam_step(&t[0], &t[1], &t[2], &t[3], 3).unwrap()
        }
        "transformer_block" => {
            let (seq, width) = (16, 64);
            let mut t = vec![input(ctx, &[batch, seq, width], 20, 1.0)];
            for (i, shape) in transformer_weight_shapes(width).iter().enumerate() {
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
