//! Reductions over any set of axes, and argmax/argmin over one axis.
//!
//! Float sum/mean/prod accumulate in f64 and round once (to f32, then to the
//! storage type); integer sum/prod wrap in i64; max/min propagate NaN. Over
//! an empty axis: sum gives 0, prod 1, mean NaN, max/min an error.

use rayon::prelude::*;
use smallvec::SmallVec;
use trace_ir::shape::numel;
use trace_ir::{ArgReduceOp, Error, ReduceOp, Result};

use super::elem::{build, by_dtype, row_major, typed, walk, Elem, Strides, CHUNK, PAR_THRESHOLD};
use crate::host_data::HostData;

/// The input split into kept dimensions (which index the output, in order)
/// and reduced ones, each with the input's strides.
pub(crate) struct Plan {
    pub(crate) kept_shape: Strides,
    pub(crate) kept_strides: Strides,
    pub(crate) red_shape: Strides,
    pub(crate) red_strides: Strides,
    /// Elements reduced into each output.
    pub(crate) r: usize,
    pub(crate) out_n: usize,
    /// Whether the reduced dimensions all come before the kept ones (a bias
    /// gradient's sum over the batch): the input is then `r` rows of the
    /// `out_n` outputs, one after another in memory.
    pub(crate) leading: bool,
}

impl Plan {
    pub(crate) fn new(shape: &[usize], axes: &[usize]) -> Plan {
        let strides = row_major(shape);
        let mut p = Plan {
            kept_shape: SmallVec::new(),
            kept_strides: SmallVec::new(),
            red_shape: SmallVec::new(),
            red_strides: SmallVec::new(),
            r: 0,
            out_n: 0,
            leading: (0..axes.len()).all(|d| axes.contains(&d)),
        };
        for (d, (&n, &s)) in shape.iter().zip(&strides).enumerate() {
            if axes.contains(&d) {
                p.red_shape.push(n);
                p.red_strides.push(s);
            } else {
                p.kept_shape.push(n);
                p.kept_strides.push(s);
            }
        }
        p.r = numel(&p.red_shape);
        p.out_n = numel(&p.kept_shape);
        p
    }
}

/// Folds the reduced elements of every output. `init` must be the identity of
/// `step`/`merge`; partial folds (for a long reduction split across threads)
/// are merged in a fixed order, so results do not depend on the thread count.
fn fold<T: Elem, A: Copy + Send + Sync, O: Elem>(
    data: &[T],
    p: &Plan,
    init: A,
    step: impl Fn(A, T::D) -> A + Sync + Send,
    merge: impl Fn(A, A) -> A + Sync + Send,
    finish: impl Fn(A) -> O + Sync + Send,
) -> Vec<O> {
    fold_rows(data, p, |_| init, step, merge, finish)
}

/// [`fold`] with an initial accumulator per output (`init(output index)`), so
/// the accumulator can carry per-row context (e.g. a row's maximum). Parts of
/// a row are folded from `init` and merged, so `init` must still be the
/// identity of `merge`.
pub(crate) fn fold_rows<T: Elem, A: Copy + Send + Sync, O: Default + Clone + Send>(
    data: &[T],
    p: &Plan,
    init: impl Fn(usize) -> A + Sync + Send,
    step: impl Fn(A, T::D) -> A + Sync + Send,
    merge: impl Fn(A, A) -> A + Sync + Send,
    finish: impl Fn(A) -> O + Sync + Send,
) -> Vec<O> {
    if p.leading && p.out_n > 1 {
        return fold_leading(data, p, init, step, finish);
    }
    let rs = p.red_strides.last().copied().unwrap_or(0);
    // A long fold runs four interleaved accumulators, merged in a fixed
    // order: a float fold is bound by the latency of its adds, not by their
    // throughput. A short one keeps one (the merges would cost more).
    let serial = |init: A, base: usize, start: usize, len: usize| -> A {
        let long = len >= 64;
        let mut lanes = [init; 4];
        walk(&p.red_shape, [&p.red_strides], start, len, |_, [o], run| {
            let at = |t: usize| data[base + o + t * rs].load();
            let mut t = 0;
            while long && t + 4 <= run {
                for (j, lane) in lanes.iter_mut().enumerate() {
                    *lane = step(*lane, at(t + j));
                }
                t += 4;
            }
            for t in t..run {
                lanes[0] = step(lanes[0], at(t));
            }
        });
        let [a, b, c, d] = lanes;
        if long {
            merge(merge(a, b), merge(c, d))
        } else {
            a
        }
    };
    let one = |row: usize, base: usize| -> O {
        let init = init(row);
        if p.r > PAR_THRESHOLD {
            let parts: Vec<A> = (0..p.r.div_ceil(CHUNK))
                .into_par_iter()
                .map(|c| serial(init, base, c * CHUNK, CHUNK.min(p.r - c * CHUNK)))
                .collect();
            finish(parts.into_iter().fold(init, &merge))
        } else {
            finish(serial(init, base, 0, p.r))
        }
    };
    let ks = p.kept_strides.last().copied().unwrap_or(0);
    let fill = |start: usize, out: &mut [O]| {
        walk(&p.kept_shape, [&p.kept_strides], start, out.len(), |k, [o], run| {
            for (t, e) in out[k..k + run].iter_mut().enumerate() {
                *e = one(start + k + t, o + t * ks);
            }
        })
    };
    let mut out = vec![O::default(); p.out_n];
    let per = (CHUNK / p.r.max(1)).max(1);
    if p.r > PAR_THRESHOLD || p.out_n.saturating_mul(p.r) <= PAR_THRESHOLD || p.out_n <= per {
        fill(0, &mut out);
    } else {
        out.par_chunks_mut(per).enumerate().for_each(|(c, s)| fill(c * per, s));
    }
    out
}

/// Output columns per block of [`fold_leading`]: their accumulators stay in
/// the L1 cache while every input row passes over them.
const COLUMNS: usize = 1024;

/// [`fold_rows`] for reduced dimensions that lead: reads the input in memory
/// order, folding each row into a block of accumulators, where the general
/// walk would load one element per cache line. Each output still folds its
/// elements in order, one after another, so the result does not depend on
/// the thread count.
fn fold_leading<T: Elem, A: Copy + Send + Sync, O: Default + Clone + Send>(
    data: &[T],
    p: &Plan,
    init: impl Fn(usize) -> A + Sync + Send,
    step: impl Fn(A, T::D) -> A + Sync + Send,
    finish: impl Fn(A) -> O + Sync + Send,
) -> Vec<O> {
    let k = p.out_n;
    let block = |start: usize, out: &mut [O]| {
        let mut acc: Vec<A> = (start..start + out.len()).map(&init).collect();
        for row in data.chunks_exact(k).take(p.r) {
            for (a, x) in acc.iter_mut().zip(&row[start..start + out.len()]) {
                *a = step(*a, x.load());
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = finish(a);
        }
    };
    let mut out = vec![O::default(); k];
    if p.r.saturating_mul(k) > PAR_THRESHOLD && k > COLUMNS {
        out.par_chunks_mut(COLUMNS).enumerate().for_each(|(c, s)| block(c * COLUMNS, s));
    } else {
        out.chunks_mut(COLUMNS).enumerate().for_each(|(c, s)| block(c * COLUMNS, s));
    }
    out
}

fn fmax(a: f32, x: f32) -> f32 {
    if a.is_nan() || x.is_nan() {
        f32::NAN
    } else if x > a {
        x
    } else {
        a
    }
}

fn fmin(a: f32, x: f32) -> f32 {
    if a.is_nan() || x.is_nan() {
        f32::NAN
    } else if x < a {
        x
    } else {
        a
    }
}

fn reduce_float<T: Elem<D = f32>>(kind: ReduceOp, x: &[T], p: &Plan) -> Vec<T> {
    let r = p.r as f64;
    match kind {
        // -0.0 is the identity of addition, so a one-element sum is a copy.
        ReduceOp::Sum => {
            fold(x, p, -0.0f64, |a, v| a + v as f64, |a, b| a + b, |a| T::store(a as f32))
        }
        ReduceOp::Mean => {
            fold(x, p, -0.0f64, |a, v| a + v as f64, |a, b| a + b, |a| T::store((a / r) as f32))
        }
        ReduceOp::Prod => {
            fold(x, p, 1.0f64, |a, v| a * v as f64, |a, b| a * b, |a| T::store(a as f32))
        }
        ReduceOp::Max => fold(x, p, f32::NEG_INFINITY, fmax, fmax, T::store),
        ReduceOp::Min => fold(x, p, f32::INFINITY, fmin, fmin, T::store),
    }
}

fn reduce_int<T: Elem<D = i64>>(kind: ReduceOp, x: &[T], p: &Plan) -> Result<Vec<T>> {
    Ok(match kind {
        ReduceOp::Sum => fold(x, p, 0i64, i64::wrapping_add, i64::wrapping_add, T::store),
        ReduceOp::Prod => fold(x, p, 1i64, i64::wrapping_mul, i64::wrapping_mul, T::store),
        ReduceOp::Max => fold(x, p, i64::MIN, i64::max, i64::max, T::store),
        ReduceOp::Min => fold(x, p, i64::MAX, i64::min, i64::min, T::store),
        ReduceOp::Mean => {
            return Err(Error::dtype(
                "mean",
                "integer inputs are not supported",
                &[trace_ir::DType::I64],
            ))
        }
    })
}

/// Reduces `data` (of shape `shape`) over `axes` (distinct, in range; empty
/// means an identity copy). `keepdim` does not change the element order, so
/// it is left to the caller's output meta.
pub(crate) fn reduce(
    kind: ReduceOp,
    axes: &[usize],
    data: &HostData,
    shape: &[usize],
) -> Result<HostData> {
    let p = Plan::new(shape, axes);
    let dt = data.dtype();
    if p.r == 0 && p.out_n > 0 {
        let fill = match kind {
            ReduceOp::Sum => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Mean if dt.is_float() => f64::NAN,
            ReduceOp::Mean => {
                return Err(Error::dtype("mean", "integer inputs are not supported", &[dt]))
            }
            ReduceOp::Max | ReduceOp::Min => {
                return Err(Error::shape(
                    kind.name(),
                    format!("cannot reduce over an empty axis (axes {axes:?})"),
                    &[&trace_ir::shape::shape(shape)],
                ))
            }
        };
        return Ok(HostData::filled(dt, fill, p.out_n));
    }
    by_dtype!(dt;
        float T => Ok(T::wrap(reduce_float::<T>(kind, typed::<T>(data)?, &p)));
        int T => Ok(T::wrap(reduce_int::<T>(kind, typed::<T>(data)?, &p)?));
        bool => Err(Error::dtype(kind.name(), "bool inputs are not supported", &[dt]))
    )
}

fn arg_extreme<T: Elem>(x: &[T], base: usize, dim: usize, stride: usize, max: bool) -> i64 {
    let mut best = x[base].load();
    let mut bi = 0usize;
    if T::is_nan(best) {
        return 0;
    }
    for j in 1..dim {
        let v = x[base + j * stride].load();
        if T::is_nan(v) {
            return j as i64;
        }
        if (max && v > best) || (!max && v < best) {
            best = v;
            bi = j;
        }
    }
    bi as i64
}

/// Index (i64) of the first maximum/minimum along `axis`; a NaN counts as
/// the extreme, as in PyTorch.
pub(crate) fn arg_reduce(
    kind: ArgReduceOp,
    axis: usize,
    data: &HostData,
    shape: &[usize],
) -> Result<HostData> {
    let name = match kind {
        ArgReduceOp::Argmax => "argmax",
        ArgReduceOp::Argmin => "argmin",
    };
    let Some(&dim) = shape.get(axis) else {
        return Err(Error::attr(
            name,
            format!("axis {axis} is out of range for rank {}", shape.len()),
        ));
    };
    let inner = numel(&shape[axis + 1..]);
    let out_n = numel(&shape[..axis]) * inner;
    if dim == 0 && out_n > 0 {
        return Err(Error::shape(
            name,
            "cannot take an arg-reduction over an empty axis",
            &[&trace_ir::shape::shape(shape)],
        ));
    }
    let max = kind == ArgReduceOp::Argmax;
    let dt = data.dtype();
    let run = |x: &(dyn Fn(usize) -> i64 + Sync)| -> Vec<i64> {
        build(out_n, |start, out: &mut [i64]| {
            for (k, o) in out.iter_mut().enumerate() {
                let i = start + k;
                *o = x((i / inner) * dim * inner + i % inner);
            }
        })
    };
    let v = by_dtype!(dt;
        float T => { let x = typed::<T>(data)?; run(&|b| arg_extreme(x, b, dim, inner, max)) };
        int T => { let x = typed::<T>(data)?; run(&|b| arg_extreme(x, b, dim, inner, max)) };
        bool => return Err(Error::dtype(name, "bool inputs are not supported", &[dt]))
    );
    Ok(HostData::I64(v))
}
