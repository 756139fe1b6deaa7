//! One DeferAndFuse context running the same MLP block at several batch
//! sizes, as a server whose batches vary does. Tier 1 of the cache is keyed
//! by the trace's shape class, so on the native backend the first batch is
//! rewritten, planned and compiled, and every later batch of 2 or more is
//! served by resizing that program; batch 1 is another shape class (a size
//! of 1 decides broadcasting) and is planned anew. On PJRT
//! (`TORCH_TPU_BACKEND=pjrt`, `--features pjrt`) every new size compiles.
//!
//! `cargo run --release -p deferfuse --example batch_sizes [-- 2 8 32 1]`
//!
//! The `TORCH_TPU_*` variables apply (the mode is always DeferAndFuse), so
//! `TORCH_TPU_FUSION_DUMP=<dir>` dumps each flush for `fusion-debug` (the
//! weights' flush first, then one per batch; see docs/fusion-debug-tour.sh).

use deferfuse::{Config, Context, DType, GeluApproximation, Mode, Result, Tensor};

const WIDTH: usize = 256;
const HIDDEN: usize = 1024;

/// `LayerNorm(x + W2 · GELU(W1 · x + b1) + b2)`; `w` is W1, b1, W2, b2, gamma, beta.
fn mlp_block(x: &Tensor, w: &[Tensor]) -> Result<Tensor> {
    let h = x.linear(&w[0], Some(&w[1]))?.gelu(GeluApproximation::Tanh)?;
    let y = h.linear(&w[2], Some(&w[3]))?.add(x)?;
    y.layer_norm(&[WIDTH], Some(&w[4]), Some(&w[5]), 1e-5)
}

fn main() -> Result<()> {
    let batches: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let batches = if batches.is_empty() { vec![2, 8, 32, 1] } else { batches };
    let ctx = Context::new(Config { mode: Mode::DeferAndFuse, ..Config::from_env()? })?;
    let w = [
        ctx.randn(&[HIDDEN, WIDTH], DType::F32, 1)?.mul(1.0 / (WIDTH as f64).sqrt())?,
        ctx.randn(&[HIDDEN], DType::F32, 2)?.mul(0.1)?,
        ctx.randn(&[WIDTH, HIDDEN], DType::F32, 3)?.mul(1.0 / (HIDDEN as f64).sqrt())?,
        ctx.randn(&[WIDTH], DType::F32, 4)?.mul(0.1)?,
        ctx.rand(&[WIDTH], DType::F32, 5)?.add(0.5)?,
        ctx.randn(&[WIDTH], DType::F32, 6)?.mul(0.1)?,
    ];
    ctx.sync()?;
    println!("MLP block [batch x {WIDTH}] -> {HIDDEN} -> {WIDTH}, backend {}", ctx.backend_name());
    println!("{:>6}  {:>8}  {:>8}  {:>10}", "batch", "tier 1", "kernels", "prepare_ms");
    for batch in batches {
        let before = ctx.stats().cache;
        let x = ctx.randn(&[batch, WIDTH], DType::F32, 7)?;
        mlp_block(&x, &w)?.to_vec::<f32>()?;
        let after = ctx.stats().cache;
        let outcome = if after.resized > before.resized {
            "resized"
        } else if after.tier1.misses > before.tier1.misses {
            "miss"
        } else {
            "hit"
        };
        let ns = (after.rewrite_ns + after.plan_ns + after.compile_ns)
            - (before.rewrite_ns + before.plan_ns + before.compile_ns);
        let kernels = ctx.last_flush().map_or(0, |f| f.kernels);
        println!("{batch:>6}  {outcome:>8}  {kernels:>8}  {:>10.3}", ns as f64 / 1e6);
    }
    Ok(())
}
