//! The fused row forms the rewrites lift: softmax, log_softmax, layer_norm,
//! rms_norm. Each is evaluated exactly as its primitive decomposition is on
//! this backend (per-element steps in f32, sums in f64 rounded to f32 where
//! the decomposition reduces), except that intermediates are not rounded to
//! bf16/f16: only the result is. For f32 inputs the fused form and its
//! decomposition therefore agree bit for bit.
//!
//! - softmax:     `m = max(x)`, `e = exp(x - m)`, `out = e / sum(e)`
//! - log_softmax: `d = x - m`, `out = d - ln(sum(exp(d)))`
//! - layer_norm:  `mu = mean(x)`, `d = x - mu`, `out = d * rsqrt(mean(d * d) + eps)`
//! - rms_norm:    `out = x * rsqrt(mean(x * x) + eps)`
//!
//! where `rsqrt(v) = 1 / sqrt(v)` and reductions run over the op's axes.

use trace_ir::{Error, Op, Result};

use super::elem::{build, by_dtype, row_major, typed, walk, Elem, Strides};
use super::reduce::{fold_rows, Plan};
use crate::host_data::HostData;

fn fmax(a: f32, x: f32) -> f32 {
    if a.is_nan() || x.is_nan() {
        f32::NAN
    } else if x > a {
        x
    } else {
        a
    }
}

/// Per-row statistics, then `out[i] = f(x[i], stats[row(i)])` over the input's shape.
fn apply<T: Elem<D = f32>, S: Copy + Send + Sync>(
    x: &[T],
    shape: &[usize],
    p: &Plan,
    axes: &[usize],
    stats: &[S],
    f: impl Fn(f32, S) -> f32 + Sync + Send,
) -> Vec<T> {
    // Strides of the row index over the input's shape: reduced dimensions
    // do not move it.
    let kept = row_major(&p.kept_shape);
    let mut ks = kept.iter();
    let row: Strides = (0..shape.len())
        .map(|d| if axes.contains(&d) { 0 } else { *ks.next().unwrap_or(&0) })
        .collect();
    let own = row_major(shape);
    let (xi, ri) = (own.last().copied().unwrap_or(0), row.last().copied().unwrap_or(0));
    build(x.len(), |start, out: &mut [T]| {
        walk(shape, [&own, &row], start, out.len(), |k, [ox, or], run| {
            for (t, o) in out[k..k + run].iter_mut().enumerate() {
                *o = T::store(f(x[ox + t * xi].load(), stats[or + t * ri]));
            }
        })
    })
}

fn row_max<T: Elem<D = f32>>(x: &[T], p: &Plan) -> Vec<f32> {
    fold_rows(x, p, |_| f32::NEG_INFINITY, fmax, fmax, |a| a)
}

/// `sum(g(x, stat))` per row, accumulated in f64.
fn row_sum<T: Elem<D = f32>>(
    x: &[T],
    p: &Plan,
    stat: &[f32],
    g: impl Fn(f32, f32) -> f32 + Sync + Send,
) -> Vec<f64> {
    fold_rows(
        x,
        p,
        |row| (-0.0f64, stat.get(row).copied().unwrap_or(0.0)),
        |(s, m), v| (s + g(v, m) as f64, m),
        |(a, m), (b, _)| (a + b, m),
        |(s, _)| s,
    )
}

fn row_op<T: Elem<D = f32>>(
    op: &Op,
    x: &[T],
    shape: &[usize],
    eps: Option<&[T]>,
) -> Result<Vec<T>> {
    let name = op.name();
    let axes: &[usize] = match op {
        Op::Softmax { axis } | Op::LogSoftmax { axis } => std::slice::from_ref(axis),
        Op::LayerNorm { axes } | Op::RmsNorm { axes } => axes,
        _ => return Err(super::internal(format!("{name} is not a row op"))),
    };
    if axes.iter().any(|&a| a >= shape.len()) {
        return Err(Error::attr(
            name,
            format!("axes {axes:?} are out of range for rank {}", shape.len()),
        ));
    }
    let p = Plan::new(shape, axes);
    if x.is_empty() {
        return Ok(Vec::new());
    }
    let zero = vec![0.0f32; p.out_n];
    let eps = || -> Result<f32> {
        eps.and_then(|e| e.first())
            .map(|e| e.load())
            .ok_or_else(|| Error::shape(name, "needs a scalar eps", &[]))
    };
    let n = p.r as f64;
    Ok(match op {
        Op::Softmax { .. } => {
            let m = row_max(x, &p);
            let s = row_sum(x, &p, &m, |v, m| (v - m).exp());
            let ms: Vec<(f32, f32)> = m.into_iter().zip(s).map(|(m, s)| (m, s as f32)).collect();
            apply(x, shape, &p, axes, &ms, |v, (m, s)| (v - m).exp() / s)
        }
        Op::LogSoftmax { .. } => {
            let m = row_max(x, &p);
            let s = row_sum(x, &p, &m, |v, m| (v - m).exp());
            let ml: Vec<(f32, f32)> =
                m.into_iter().zip(s).map(|(m, s)| (m, (s as f32).ln())).collect();
            apply(x, shape, &p, axes, &ml, |v, (m, l)| (v - m) - l)
        }
        Op::LayerNorm { .. } => {
            let eps = eps()?;
            let mu: Vec<f32> =
                row_sum(x, &p, &zero, |v, _| v).into_iter().map(|s| (s / n) as f32).collect();
            let var = row_sum(x, &p, &mu, |v, mu| (v - mu) * (v - mu));
            let mr: Vec<(f32, f32)> = mu
                .into_iter()
                .zip(var)
                .map(|(mu, s)| (mu, 1.0 / (((s / n) as f32) + eps).sqrt()))
                .collect();
            apply(x, shape, &p, axes, &mr, |v, (mu, r)| (v - mu) * r)
        }
        Op::RmsNorm { .. } => {
            let eps = eps()?;
            let r: Vec<f32> = row_sum(x, &p, &zero, |v, _| v * v)
                .into_iter()
                .map(|s| 1.0 / (((s / n) as f32) + eps).sqrt())
                .collect();
            apply(x, shape, &p, axes, &r, |v, r| v * r)
        }
        _ => return Err(super::internal(format!("{name} is not a row op"))),
    })
}

/// Evaluates a fused row op on `x` (shape `shape`) with the optional scalar
/// `eps` input of layer_norm/rms_norm.
pub(crate) fn row(
    op: &Op,
    x: &HostData,
    shape: &[usize],
    eps: Option<&HostData>,
) -> Result<HostData> {
    let dt = x.dtype();
    let bad = || Error::dtype(op.name(), "needs a floating input", &[dt]);
    by_dtype!(dt;
        float T => {
            let e = eps.map(typed::<T>).transpose()?;
            Ok(T::wrap(row_op::<T>(op, typed::<T>(x)?, shape, e)?))
        };
        int _T => Err(bad());
        bool => Err(bad())
    )
}
