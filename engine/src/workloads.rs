//! The benchmark workloads as op sequences (feature `workloads`): written the
//! way a user writes them with the public API, decomposed into primitives
//! (GELU with tanh, LayerNorm with mean and variance, softmax with max, exp,
//! sum and div), so that DeferAndFuse has to find the fusions. The benches
//! build inputs for them at full size; the engine's tests at small sizes.

use crate::{Result, Tensor};

/// The workloads' names, in the order the benches report them.
pub const NAMES: [&str; 6] =
    ["gelu_tanh", "layer_norm", "softmax", "mlp_block", "adam_step", "transformer_block"];

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
/// parameters and both moments, which replace the old ones (a training loop carries them).
pub fn adam_step(p: &Tensor, m: &Tensor, v: &Tensor, g: &Tensor, t: i32) -> Result<Vec<Tensor>> {
    let (lr, beta1, beta2, eps): (f64, f64, f64, f64) = (1e-3, 0.9, 0.999, 1e-8);
    let m = m.mul(beta1)?.add(&g.mul(1.0 - beta1)?)?;
    let v = v.mul(beta2)?.add(&g.mul(g)?.mul(1.0 - beta2)?)?;
    let m_hat = m.div(1.0 - beta1.powi(t))?;
    let v_hat = v.div(1.0 - beta2.powi(t))?;
    let p = p.sub(&m_hat.div(&v_hat.sqrt()?.add(eps)?)?.mul(lr)?)?;
    Ok(vec![p, m, v])
}

/// The shapes of [`transformer_block`]'s weights after `x`, for a model
/// `width` wide: Wq, Wk, Wv, Wo, then the MLP's W1 and W2.
pub fn transformer_weight_shapes(width: usize) -> [[usize; 2]; 6] {
    let w = [width, width];
    [w, w, w, w, [4 * width, width], [width, 4 * width]]
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
