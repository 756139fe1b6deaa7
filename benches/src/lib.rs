//! The benchmark workloads of deferfuse, shared by the criterion benches
//! (`benches/`) and the side-by-side comparison runner (`src/bin/compare.rs`).
//!
//! Each workload is written the way a user writes it with the public API,
//! decomposed into primitives (GELU with tanh, LayerNorm with mean and var,
//! softmax with max/exp/sum/div), so DeferAndFuse has to find the fusions.

use deferfuse::{Context, DType, Result, Tensor};

pub mod reference64;

/// How large to make each workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// The sizes the fusion issue names.
    Full,
    /// Smaller sizes, for a quick run.
    Quick,
    /// An eighth of the quick sizes (at least 1), for tests.
    Tiny,
}

/// A workload: inputs built once, and a step that records the computation
/// and returns the tensors a user would keep.
pub struct Workload {
    pub name: &'static str,
    pub inputs: Vec<Tensor>,
    pub step: fn(&[Tensor]) -> Result<Vec<Tensor>>,
    /// The step's first `carried` outputs replace its first `carried` inputs
    /// (an optimizer step's new state replaces the old, as in a training loop).
    pub carried: usize,
}

pub const NAMES: [&str; 6] =
    ["gelu_tanh", "layer_norm", "softmax", "mlp_block", "adam_step", "transformer_block"];

/// Builds workload `name` in `ctx`.
pub fn workload(ctx: &Context, name: &str, size: Size) -> Result<Workload> {
    let pick = |full: usize, small: usize| match size {
        Size::Full => full,
        Size::Quick => small,
        Size::Tiny => (small / 8).max(1),
    };
    let randn =
        |shape: &[usize], seed: u64, scale: f64| ctx.randn(shape, DType::F32, seed)?.mul(scale);
    let (inputs, step): (Vec<Tensor>, fn(&[Tensor]) -> Result<Vec<Tensor>>) = match name {
        "gelu_tanh" => {
            (vec![randn(&[pick(4 << 20, 1 << 20)], 1, 1.0)?], |t| Ok(vec![gelu_tanh(&t[0])?]))
        }
        "layer_norm" => {
            let rows = pick(8192, 2048);
            (
                vec![
                    randn(&[rows, 1024], 2, 1.0)?,
                    randn(&[1024], 3, 1.0)?,
                    randn(&[1024], 4, 1.0)?,
                ],
                |t| Ok(vec![layer_norm(&t[0], &t[1], &t[2])?]),
            )
        }
        "softmax" => {
            (vec![randn(&[pick(8192, 2048), 1024], 5, 2.0)?], |t| Ok(vec![softmax(&t[0])?]))
        }
        "mlp_block" => {
            let (rows, width, hidden) = (256, pick(1024, 512), pick(4096, 2048));
            let inputs = vec![
                randn(&[rows, width], 6, 1.0)?,
                randn(&[hidden, width], 7, 1.0 / (width as f64).sqrt())?,
                randn(&[hidden], 8, 0.1)?,
                randn(&[width, hidden], 9, 1.0 / (hidden as f64).sqrt())?,
                randn(&[width], 10, 0.1)?,
                randn(&[width], 11, 1.0)?,
                randn(&[width], 12, 0.1)?,
            ];
            (inputs, |t| Ok(vec![mlp_block(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6])?]))
        }
        "adam_step" => {
            let n = pick(10_000_000, 2_000_000);
            // p, m, v (a second moment: non-negative), g.
            let inputs = vec![
                randn(&[n], 13, 1.0)?,
                randn(&[n], 14, 0.01)?,
                ctx.rand(&[n], DType::F32, 16)?.mul(1e-4)?,
                randn(&[n], 15, 0.01)?,
            ];
            (inputs, |t| adam_step(&t[0], &t[1], &t[2], &t[3], 3))
        }
        "transformer_block" => {
            let (batch, seq, width) = (pick(8, 2), 128, 256);
            let s = 1.0 / (width as f64).sqrt();
            let mut inputs = vec![randn(&[batch, seq, width], 20, 1.0)?];
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
                inputs.push(randn(shape, 21 + i as u64, s)?);
            }
            for i in 0..4 {
                inputs.push(randn(&[width], 30 + i, 0.1)?.add(if i % 2 == 0 {
                    1.0
                } else {
                    0.0
                })?);
            }
            (inputs, |t| Ok(vec![transformer_block(t)?]))
        }
        other => {
            return Err(deferfuse::Error::attr(
                "workload",
                format!("unknown workload {other:?}; known: {NAMES:?}"),
            ))
        }
    };
    ctx.sync()?;
    let carried = if name == "adam_step" { 3 } else { 0 };
    let name = NAMES.iter().find(|n| **n == name).copied().unwrap_or("unknown");
    Ok(Workload { name, inputs, step, carried })
}

/// `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`, elementwise.
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    let cube = x.mul(x)?.mul(x)?;
    let inner = x.add(&cube.mul(0.044715)?)?.mul(0.7978845608028654)?;
    x.mul(0.5)?.mul(&inner.tanh()?.add(1.0)?)
}

/// LayerNorm over the last axis written with mean and variance.
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<Tensor> {
    let mean = x.mean(&[-1], true)?;
    let centered = x.sub(&mean)?;
    let var = centered.mul(&centered)?.mean(&[-1], true)?;
    centered.div(&var.add(1e-5)?.sqrt()?)?.mul(gamma)?.add(beta)
}

/// Softmax over the last axis written with max, exp, sum and div.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let shifted = x.sub(&x.max(&[-1], true)?)?;
    let e = shifted.exp()?;
    e.div(&e.sum(&[-1], true)?)
}

/// `LayerNorm(x + W2 · GELU(W1 · x + b1) + b2)`.
pub fn mlp_block(
    x: &Tensor,
    w1: &Tensor,
    b1: &Tensor,
    w2: &Tensor,
    b2: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
) -> Result<Tensor> {
    let h = gelu_tanh(&x.matmul(&w1.t()?)?.add(b1)?)?;
    let y = h.matmul(&w2.t()?)?.add(b2)?.add(x)?;
    layer_norm(&y, gamma, beta)
}

/// One Adam step (PyTorch's formulation, no weight decay); returns the new
/// parameters and both moments, which replace the old ones (see
/// [`Workload::carried`]).
pub fn adam_step(p: &Tensor, m: &Tensor, v: &Tensor, g: &Tensor, t: i32) -> Result<Vec<Tensor>> {
    let (lr, beta1, beta2, eps): (f64, f64, f64, f64) = (1e-3, 0.9, 0.999, 1e-8);
    let m = m.mul(beta1)?.add(&g.mul(1.0 - beta1)?)?;
    let v = v.mul(beta2)?.add(&g.mul(g)?.mul(1.0 - beta2)?)?;
    let m_hat = m.div(1.0 - beta1.powi(t))?;
    let v_hat = v.div(1.0 - beta2.powi(t))?;
    let p = p.sub(&m_hat.div(&v_hat.sqrt()?.add(eps)?)?.mul(lr)?)?;
    Ok(vec![p, m, v])
}

/// A pre-norm transformer block: `x + Attn(LN(x))`, then `+ MLP(LN(.))`,
/// with four heads. Inputs: x, Wq, Wk, Wv, Wo, W1, W2, ln1 (g, b), ln2 (g, b).
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
