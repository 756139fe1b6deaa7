//! The benchmark workloads in plain f64, and how far an engine result is from
//! them: the yardstick of the `numerics` runner and its test.
//!
//! Each function repeats the math of its namesake in the crate root formula
//! for formula (the same tanh-GELU coefficients, LayerNorm dividing by
//! `sqrt(var + 1e-5)`, softmax with the max subtracted, Adam's bias
//! correction at step 3, four attention heads scaled by `1/sqrt(head_dim)`),
//! with nested loops over row-major data. Sizes come from the inputs' shapes,
//! so the same code checks tiny and quick runs.

use deferfuse::{Config, Context, DType, Error, HostData, Result, Tensor};

/// A row-major f64 array with its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Array {
    pub fn new(shape: &[usize], data: Vec<f64>) -> Array {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Array { shape: shape.to_vec(), data }
    }

    /// The length of the last axis (1 for a scalar).
    fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
}

/// Runs workload `name` of [`crate::NAMES`] in f64 on `inputs`, which are laid
/// out as [`crate::workload`] builds them; returns its outputs in the same order.
pub fn reference(name: &str, inputs: &[Array]) -> Result<Vec<Array>> {
    let expected = match name {
        "gelu_tanh" => 1,
        "layer_norm" => 3,
        "softmax" => 1,
        "mlp_block" => 7,
        "adam_step" => 4,
        "transformer_block" => 11,
        other => {
            return Err(Error::attr(
                "reference64",
                format!("unknown workload {other:?}; known: {:?}", crate::NAMES),
            ))
        }
    };
    if inputs.len() != expected {
        return Err(Error::attr(
            "reference64",
            format!("workload {name} takes {expected} inputs, got {}", inputs.len()),
        ));
    }
    let i = inputs;
    Ok(match name {
        "gelu_tanh" => vec![gelu_tanh(&i[0])],
        "layer_norm" => vec![layer_norm(&i[0], &i[1], &i[2])],
        "softmax" => vec![softmax(&i[0])],
        "mlp_block" => vec![mlp_block(&i[0], &i[1], &i[2], &i[3], &i[4], &i[5], &i[6])],
        "adam_step" => adam_step(&i[0], &i[1], &i[2], &i[3], 3),
        _ => vec![transformer_block(i)],
    })
}

/// `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`.
pub fn gelu_tanh(x: &Array) -> Array {
    let gelu = |x: f64| x * 0.5 * (((x + x * x * x * 0.044715) * 0.7978845608028654).tanh() + 1.0);
    Array::new(&x.shape, x.data.iter().map(|&v| gelu(v)).collect())
}

/// LayerNorm over the last axis: `(x - mean) / sqrt(var + 1e-5) * gamma + beta`.
pub fn layer_norm(x: &Array, gamma: &Array, beta: &Array) -> Array {
    let n = x.cols();
    let mut out = Vec::with_capacity(x.data.len());
    for row in x.data.chunks(n) {
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let std = (var + 1e-5).sqrt();
        out.extend(
            row.iter().zip(&gamma.data).zip(&beta.data).map(|((v, g), b)| (v - mean) / std * g + b),
        );
    }
    Array::new(&x.shape, out)
}

/// Softmax over the last axis, with the row maximum subtracted.
pub fn softmax(x: &Array) -> Array {
    let mut out = Vec::with_capacity(x.data.len());
    for row in x.data.chunks(x.cols()) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| v / sum));
    }
    Array::new(&x.shape, out)
}

/// `x · wᵀ` over the last axis of `x` (`w` is `[out, in]`, as `linear` takes it).
fn matmul_t(x: &Array, w: &Array) -> Array {
    let (inner, outer) = (x.cols(), w.shape[0]);
    assert_eq!(w.cols(), inner, "matmul_t: inner sizes differ");
    let mut out = Vec::with_capacity(x.data.len() / inner * outer);
    for row in x.data.chunks(inner) {
        out.extend(
            w.data
                .chunks(inner)
                .map(|w_row| row.iter().zip(w_row).map(|(a, b)| a * b).sum::<f64>()),
        );
    }
    let mut shape = x.shape.clone();
    *shape.last_mut().unwrap() = outer;
    Array::new(&shape, out)
}

/// `x + y`, with `y` broadcast along the leading axes when it is shorter.
fn add(x: &Array, y: &Array) -> Array {
    let n = y.data.len();
    Array::new(&x.shape, x.data.iter().enumerate().map(|(i, v)| v + y.data[i % n]).collect())
}

/// `LayerNorm(x + W2 · GELU(W1 · x + b1) + b2)`.
pub fn mlp_block(
    x: &Array,
    w1: &Array,
    b1: &Array,
    w2: &Array,
    b2: &Array,
    gamma: &Array,
    beta: &Array,
) -> Array {
    let h = gelu_tanh(&add(&matmul_t(x, w1), b1));
    let y = add(&add(&matmul_t(&h, w2), b2), x);
    layer_norm(&y, gamma, beta)
}

/// One Adam step (lr 1e-3, betas 0.9 and 0.999, eps 1e-8, bias-corrected at
/// step `t`); returns the new parameters and both moments.
pub fn adam_step(p: &Array, m: &Array, v: &Array, g: &Array, t: i32) -> Vec<Array> {
    let (lr, beta1, beta2, eps): (f64, f64, f64, f64) = (1e-3, 0.9, 0.999, 1e-8);
    let (c1, c2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
    let n = p.data.len();
    let (mut p_new, mut m_new, mut v_new) =
        (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let gi = g.data[i];
        let mi = m.data[i] * beta1 + gi * (1.0 - beta1);
        let vi = v.data[i] * beta2 + gi * gi * (1.0 - beta2);
        p_new.push(p.data[i] - mi / c1 / ((vi / c2).sqrt() + eps) * lr);
        m_new.push(mi);
        v_new.push(vi);
    }
    vec![Array::new(&p.shape, p_new), Array::new(&m.shape, m_new), Array::new(&v.shape, v_new)]
}

/// The pre-norm transformer block of [`crate::transformer_block`]: inputs x
/// `[batch, seq, width]`, Wq, Wk, Wv, Wo, W1, W2, then LayerNorm 1 and 2
/// (gamma, beta); four heads.
pub fn transformer_block(t: &[Array]) -> Array {
    let x = &t[0];
    let (batch, seq, width) = (x.shape[0], x.shape[1], x.shape[2]);
    let heads = 4;
    let head_dim = width / heads;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let h = layer_norm(x, &t[7], &t[8]);
    let (q, k, v) = (matmul_t(&h, &t[1]), matmul_t(&h, &t[2]), matmul_t(&h, &t[3]));
    // Head `hd` of token `s` in batch `b` is the slice [hd*head_dim, (hd+1)*head_dim)
    // of row (b, s): the reshape to [batch, seq, heads, head_dim] and permute.
    fn head(a: &Array, token: usize, hd: usize, head_dim: usize) -> &[f64] {
        &a.data[token * a.cols() + hd * head_dim..][..head_dim]
    }
    let at = |a, b, s, hd| head(a, b * seq + s, hd, head_dim);
    let mut merged = vec![0.0; batch * seq * width];
    for b in 0..batch {
        for hd in 0..heads {
            for i in 0..seq {
                let qi = at(&q, b, i, hd);
                let scores: Vec<f64> = (0..seq)
                    .map(|j| {
                        qi.iter().zip(at(&k, b, j, hd)).map(|(a, c)| a * c).sum::<f64>() * scale
                    })
                    .collect();
                let probs = softmax(&Array::new(&[seq], scores));
                let out = &mut merged[(b * seq + i) * width + hd * head_dim..][..head_dim];
                for (j, p) in probs.data.iter().enumerate() {
                    for (o, vj) in out.iter_mut().zip(at(&v, b, j, hd)) {
                        *o += p * vj;
                    }
                }
            }
        }
    }
    let x = add(x, &matmul_t(&Array::new(&x.shape, merged), &t[4]));
    let h = layer_norm(&x, &t[9], &t[10]);
    let mlp = matmul_t(&gelu_tanh(&matmul_t(&h, &t[5])), &t[6]);
    add(&x, &mlp)
}

/// Relative errors are taken only where the reference is at least this large
/// in magnitude, so values near zero do not dominate them.
pub const RELATIVE_FLOOR: f64 = 1e-3;

/// How far one output is from the f64 reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorStats {
    pub max_abs: f64,
    /// Largest `|a - r| / |r|` over elements with `|r| ≥ RELATIVE_FLOOR`.
    pub max_rel: f64,
    pub rms: f64,
    /// The RMS of the reference over the same elements, to read `rms` against.
    pub ref_rms: f64,
    /// Elements compared: both values finite.
    pub compared: usize,
    /// Elements where the reference is not finite and the result is not
    /// finite either (NaN for NaN, the same infinity): they agree.
    pub nonfinite_agree: usize,
    /// Elements where exactly one side is finite, or the non-finite values
    /// differ: always a defect worth reading.
    pub nonfinite_disagree: usize,
}

/// Compares `actual` with `reference` element by element.
pub fn error_stats(actual: &[f64], reference: &[f64]) -> ErrorStats {
    assert_eq!(actual.len(), reference.len(), "error_stats: lengths differ");
    let mut s = ErrorStats {
        max_abs: 0.0,
        max_rel: 0.0,
        rms: 0.0,
        ref_rms: 0.0,
        compared: 0,
        nonfinite_agree: 0,
        nonfinite_disagree: 0,
    };
    let (mut sum_sq, mut ref_sum_sq) = (0.0, 0.0);
    for (&a, &r) in actual.iter().zip(reference) {
        if !a.is_finite() || !r.is_finite() {
            let agree = (a.is_nan() && r.is_nan()) || a == r;
            if agree {
                s.nonfinite_agree += 1;
            } else {
                s.nonfinite_disagree += 1;
            }
            continue;
        }
        let err = (a - r).abs();
        s.compared += 1;
        s.max_abs = s.max_abs.max(err);
        sum_sq += err * err;
        ref_sum_sq += r * r;
        if r.abs() >= RELATIVE_FLOOR {
            s.max_rel = s.max_rel.max(err / r.abs());
        }
    }
    let n = s.compared.max(1) as f64;
    (s.rms, s.ref_rms) = ((sum_sq / n).sqrt(), (ref_sum_sq / n).sqrt());
    s
}

/// The step of a [`crate::Workload`]: records the computation on its inputs.
pub type Step = fn(&[Tensor]) -> Result<Vec<Tensor>>;

/// Inputs held on the host, to give several contexts exactly the same values.
#[derive(Debug, Clone)]
pub struct HostInput {
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl HostInput {
    pub fn of_tensor(t: &Tensor) -> Result<HostInput> {
        Ok(HostInput { shape: t.shape().to_vec(), data: t.host_data()? })
    }

    /// The same values widened to f64, for the reference.
    pub fn to_array(&self) -> Array {
        Array::new(&self.shape, self.data.to_f64_vec())
    }

    fn upload(&self, ctx: &Context) -> Result<Tensor> {
        match &self.data {
            HostData::F32(v) => ctx.from_slice(v, &self.shape),
            HostData::BF16(v) => ctx.from_slice(v, &self.shape),
            HostData::F16(v) => ctx.from_slice(v, &self.shape),
            other => Err(Error::attr(
                "reference64",
                format!("workload inputs are floats, got {}", other.dtype()),
            )),
        }
    }
}

/// Builds the inputs of workload `name` in f32 (in a Strict context, as the
/// workloads do), casts them to `dtype` with the engine, and brings them to
/// the host; also returns the workload's step.
pub fn workload_inputs(
    name: &str,
    size: crate::Size,
    dtype: DType,
) -> Result<(Vec<HostInput>, Step)> {
    let ctx = Context::new(Config::default())?;
    let w = crate::workload(&ctx, name, size)?;
    let inputs = w
        .inputs
        .iter()
        .map(|t| HostInput::of_tensor(&t.to_dtype(dtype)?))
        .collect::<Result<Vec<_>>>()?;
    Ok((inputs, w.step))
}

/// Runs `step` on `inputs` in a fresh context configured by `config` and
/// returns the outputs on the host.
pub fn run_step(config: Config, step: Step, inputs: &[HostInput]) -> Result<Vec<HostData>> {
    let ctx = Context::new(config)?;
    let tensors = inputs.iter().map(|i| i.upload(&ctx)).collect::<Result<Vec<_>>>()?;
    step(&tensors)?.iter().map(Tensor::host_data).collect()
}
