//! Elementwise ops: unary, binary (broadcasting), where, cast.
//!
//! Floats compute in f32 and round once to the storage type; integers compute
//! in i64 and wrap to the storage type with `as`; bool stays bool.

use half::{bf16, f16};
use trace_ir::consts;
use trace_ir::shape::numel;
use trace_ir::{BinaryOp, DType, Error, Result, UnaryOp};

use super::elem::{
    build, by_any, by_dtype, for_chunks, map_new, map_same, typed, walk, Elem, Input, Src, View,
};
use super::erf::erfc;
use crate::host_data::HostData;

fn unsupported(op: &str, dtype: DType) -> Error {
    Error::dtype(op, "input dtype not supported by the cpu backend", &[dtype])
}

// ---------------------------------------------------------------- unary

/// GELU's tanh-form constants rounded to f32, as PyTorch's f32 kernel and
/// the fused kernels use them: the reference computes the same function,
/// only in f64.
const GELU_BETA: f64 = consts::GELU_TANH_BETA as f32 as f64;
const GELU_KAPPA: f64 = consts::GELU_TANH_KAPPA as f32 as f64;

/// Exact GELU, `0.5 x (1 + erf(x / sqrt 2))`, written as `0.5 x erfc(-x / sqrt 2)`
/// (the same value, without cancellation for negative x), in f64.
pub fn gelu_erf(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * erfc(-x * consts::GELU_ERF_SCALE)) as f32
}

/// PyTorch's tanh GELU, `0.5 x (1 + tanh(u))`, computed in f64 as the equal
/// `x / (1 + e^{-2u})`, which has no cancellation for negative x (so tiny
/// negative results stay negative instead of becoming -0).
pub fn gelu_tanh(x: f32) -> f32 {
    let x = x as f64;
    let u = GELU_BETA * (x + GELU_KAPPA * x * x * x);
    (x / (1.0 + (-2.0 * u).exp())) as f32
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn relu(x: f32) -> f32 {
    if x > 0.0 || x.is_nan() {
        x
    } else {
        0.0
    }
}

/// PyTorch's sign: NaN stays NaN, and -0.0 and 0.0 give 0.0.
pub(crate) fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else if x.is_nan() {
        x
    } else {
        0.0
    }
}

/// A unary op; the output has the input's dtype and shape. An owned input is
/// overwritten in place.
pub(crate) fn unary(kind: UnaryOp, src: Src<'_>) -> Result<HostData> {
    let dt = src.dtype();
    by_dtype!(dt;
        float T => unary_float::<T>(kind, Input::new(src)?);
        int T => unary_int::<T>(kind, Input::new(src)?);
        bool => {
            if kind != UnaryOp::LogicalNot {
                return Err(unsupported(kind.name(), dt));
            }
            Ok(HostData::Bool(map_same::<bool>(Input::new(src)?, |x| !x)))
        }
    )
}

fn unary_float<T: Elem<D = f32>>(kind: UnaryOp, x: Input<'_, T>) -> Result<HostData> {
    use UnaryOp::*;
    let v = match kind {
        Neg => map_same(x, |a| -a),
        Abs => map_same(x, f32::abs),
        Exp => map_same(x, f32::exp),
        Log => map_same(x, f32::ln),
        Sqrt => map_same(x, f32::sqrt),
        Rsqrt => map_same(x, |a| 1.0 / a.sqrt()),
        Reciprocal => map_same(x, |a| 1.0 / a),
        Tanh => map_same(x, f32::tanh),
        Sigmoid => map_same(x, sigmoid),
        Relu => map_same(x, relu),
        GeluErf => map_same(x, gelu_erf),
        GeluTanh => map_same(x, gelu_tanh),
        Silu => map_same(x, |a| a * sigmoid(a)),
        Sin => map_same(x, f32::sin),
        Cos => map_same(x, f32::cos),
        Floor => map_same(x, f32::floor),
        Sign => map_same(x, sign),
        LogicalNot => return Err(unsupported(kind.name(), DType::F32)),
    };
    Ok(T::wrap(v))
}

fn unary_int<T: Elem<D = i64>>(kind: UnaryOp, x: Input<'_, T>) -> Result<HostData> {
    use UnaryOp::*;
    let v = match kind {
        Neg => map_same(x, i64::wrapping_neg),
        Abs => map_same(x, i64::wrapping_abs),
        Relu => map_same(x, |a| a.max(0)),
        Floor => map_same(x, |a| a),
        Sign => map_same(x, i64::signum),
        _ => return Err(unsupported(kind.name(), DType::I64)),
    };
    Ok(T::wrap(v))
}

// ---------------------------------------------------------------- binary

/// Integer power with wrapping; negative exponents give `1/base` truncated
/// (1 for base 1, ±1 for base -1, else 0), as PyTorch.
pub fn int_pow(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp & 1 == 1 {
                    -1
                } else {
                    1
                }
            }
            _ => 0,
        };
    }
    let (mut result, mut b, mut e) = (1i64, base, exp as u64);
    while e > 0 {
        if e & 1 == 1 {
            result = result.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    result
}

/// maximum/minimum propagate NaN, as PyTorch's.
fn fmax(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else if y > x {
        y
    } else {
        x
    }
}

fn fmin(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else if y < x {
        y
    } else {
        x
    }
}

/// Binds `$f` to the closure of a same-dtype float binary op and evaluates
/// `Some($body)`, or `None` for ops that do not produce the operand dtype.
macro_rules! float_arith {
    ($kind:expr, |$f:ident| $body:expr) => {
        match $kind {
            BinaryOp::Add => {
                let $f = |x: f32, y: f32| x + y;
                Some($body)
            }
            BinaryOp::Sub => {
                let $f = |x: f32, y: f32| x - y;
                Some($body)
            }
            BinaryOp::Mul => {
                let $f = |x: f32, y: f32| x * y;
                Some($body)
            }
            BinaryOp::Div => {
                let $f = |x: f32, y: f32| x / y;
                Some($body)
            }
            BinaryOp::Pow => {
                let $f = |x: f32, y: f32| x.powf(y);
                Some($body)
            }
            BinaryOp::Maximum => {
                let $f = fmax;
                Some($body)
            }
            BinaryOp::Minimum => {
                let $f = fmin;
                Some($body)
            }
            _ => None,
        }
    };
}

macro_rules! int_arith {
    ($kind:expr, |$f:ident| $body:expr) => {
        match $kind {
            BinaryOp::Add => {
                let $f = |x: i64, y: i64| x.wrapping_add(y);
                Some($body)
            }
            BinaryOp::Sub => {
                let $f = |x: i64, y: i64| x.wrapping_sub(y);
                Some($body)
            }
            BinaryOp::Mul => {
                let $f = |x: i64, y: i64| x.wrapping_mul(y);
                Some($body)
            }
            BinaryOp::Pow => {
                let $f = int_pow;
                Some($body)
            }
            BinaryOp::Maximum => {
                let $f = |x: i64, y: i64| x.max(y);
                Some($body)
            }
            BinaryOp::Minimum => {
                let $f = |x: i64, y: i64| x.min(y);
                Some($body)
            }
            _ => None,
        }
    };
}

/// Comparisons in the operand domain `$ty`.
macro_rules! compare {
    ($kind:expr, $ty:ty, |$f:ident| $body:expr) => {
        match $kind {
            BinaryOp::Eq => {
                let $f = |x: $ty, y: $ty| x == y;
                Some($body)
            }
            BinaryOp::Ne => {
                let $f = |x: $ty, y: $ty| x != y;
                Some($body)
            }
            BinaryOp::Lt => {
                let $f = |x: $ty, y: $ty| x < y;
                Some($body)
            }
            BinaryOp::Le => {
                let $f = |x: $ty, y: $ty| x <= y;
                Some($body)
            }
            BinaryOp::Gt => {
                let $f = |x: $ty, y: $ty| x > y;
                Some($body)
            }
            BinaryOp::Ge => {
                let $f = |x: $ty, y: $ty| x >= y;
                Some($body)
            }
            _ => None,
        }
    };
}

/// Every op on bool operands (all produce bool).
macro_rules! bool_ops {
    ($kind:expr, |$f:ident| $body:expr) => {
        match $kind {
            BinaryOp::LogicalAnd => {
                let $f = |x: bool, y: bool| x && y;
                Some($body)
            }
            BinaryOp::LogicalOr => {
                let $f = |x: bool, y: bool| x || y;
                Some($body)
            }
            k => compare!(k, bool, |$f| $body),
        }
    };
}

/// `f(a, b)` broadcast to `shape`, into a new vector.
fn zip_new<T: Elem, O: Elem>(
    a: &View<'_, T>,
    b: &View<'_, T>,
    shape: &[usize],
    f: impl Fn(T::D, T::D) -> O::D + Sync + Send,
) -> Vec<O> {
    let n = numel(shape);
    match (a, b) {
        (View::Contig(x), View::Contig(y)) => build(n, |start, out: &mut [O]| {
            for ((o, &p), &q) in out.iter_mut().zip(&x[start..]).zip(&y[start..]) {
                *o = O::store(f(p.load(), q.load()));
            }
        }),
        (View::Contig(x), View::Scalar(q)) => {
            let q = q.load();
            build(n, |start, out: &mut [O]| {
                for (o, &p) in out.iter_mut().zip(&x[start..]) {
                    *o = O::store(f(p.load(), q));
                }
            })
        }
        (View::Scalar(p), View::Contig(y)) => {
            let p = p.load();
            build(n, |start, out: &mut [O]| {
                for (o, &q) in out.iter_mut().zip(&y[start..]) {
                    *o = O::store(f(p, q.load()));
                }
            })
        }
        (View::Scalar(p), View::Scalar(q)) => vec![O::store(f(p.load(), q.load())); n],
        _ => {
            let (sa, sb) = (a.strides(shape), b.strides(shape));
            let (da, db) = (a.data(), b.data());
            let (ia, ib) = (sa.last().copied().unwrap_or(0), sb.last().copied().unwrap_or(0));
            build(n, |start, out: &mut [O]| {
                walk(shape, [&sa, &sb], start, out.len(), |k, [oa, ob], run| {
                    for (t, o) in out[k..k + run].iter_mut().enumerate() {
                        *o = O::store(f(da[oa + t * ia].load(), db[ob + t * ib].load()));
                    }
                })
            })
        }
    }
}

/// `buf[i] = f(buf[i], other[i])` (or `f(other[i], buf[i])` when `!lhs`), in
/// place. `buf` has the output's element count, so it is read contiguously.
fn zip_in_place<T: Elem>(
    buf: &mut [T],
    other: &View<'_, T>,
    lhs: bool,
    shape: &[usize],
    f: impl Fn(T::D, T::D) -> T::D + Sync + Send,
) {
    let g = |x: T::D, y: T::D| if lhs { f(x, y) } else { f(y, x) };
    match other {
        View::Contig(y) => for_chunks(buf, |start, out| {
            for (o, &q) in out.iter_mut().zip(&y[start..]) {
                *o = T::store(g(o.load(), q.load()));
            }
        }),
        View::Scalar(q) => {
            let q = q.load();
            for_chunks(buf, |_, out| {
                for o in out.iter_mut() {
                    *o = T::store(g(o.load(), q));
                }
            })
        }
        View::Strided(d, s) => {
            let i = s.last().copied().unwrap_or(0);
            for_chunks(buf, |start, out| {
                walk(shape, [s], start, out.len(), |k, [off], run| {
                    for (t, o) in out[k..k + run].iter_mut().enumerate() {
                        *o = T::store(g(o.load(), d[off + t * i].load()));
                    }
                })
            })
        }
    }
}

fn bad_binary(kind: BinaryOp, dt: DType) -> Error {
    Error::dtype(kind.name(), "operand dtype not supported by the cpu backend", &[dt, dt])
}

/// A binary op into a new buffer. `a` has shape `sa`, `b` shape `sb`; both
/// broadcast to `shape`.
pub(crate) fn binary_new(
    kind: BinaryOp,
    a: &HostData,
    sa: &[usize],
    b: &HostData,
    sb: &[usize],
    shape: &[usize],
) -> Result<HostData> {
    let dt = a.dtype();
    if b.dtype() != dt {
        return Err(Error::dtype(kind.name(), "operands must share one dtype", &[dt, b.dtype()]));
    }
    let out = by_dtype!(dt;
        float T => {
            let (x, y) = (View::new(typed::<T>(a)?, sa, shape), View::new(typed::<T>(b)?, sb, shape));
            float_arith!(kind, |f| T::wrap(zip_new::<T, T>(&x, &y, shape, f)))
                .or_else(|| compare!(kind, f32, |f| HostData::Bool(zip_new::<T, bool>(&x, &y, shape, f))))
        };
        int T => {
            let (x, y) = (View::new(typed::<T>(a)?, sa, shape), View::new(typed::<T>(b)?, sb, shape));
            int_arith!(kind, |f| T::wrap(zip_new::<T, T>(&x, &y, shape, f)))
                .or_else(|| compare!(kind, i64, |f| HostData::Bool(zip_new::<T, bool>(&x, &y, shape, f))))
        };
        bool => {
            let (x, y) = (View::new(typed::<bool>(a)?, sa, shape), View::new(typed::<bool>(b)?, sb, shape));
            bool_ops!(kind, |f| HostData::Bool(zip_new::<bool, bool>(&x, &y, shape, f)))
        }
    );
    out.ok_or_else(|| bad_binary(kind, dt))
}

/// A binary op whose output has the dtype and element count of `buf`, one of
/// its operands (the left one when `lhs`), computed in place over `buf`.
pub(crate) fn binary_in_place(
    kind: BinaryOp,
    buf: HostData,
    lhs: bool,
    other: &HostData,
    so: &[usize],
    shape: &[usize],
) -> Result<HostData> {
    let dt = buf.dtype();
    if other.dtype() != dt {
        return Err(Error::dtype(
            kind.name(),
            "operands must share one dtype",
            &[dt, other.dtype()],
        ));
    }
    let out = by_dtype!(dt;
        float T => {
            let mut v = T::unwrap_vec(buf).ok_or_else(|| bad_binary(kind, dt))?;
            let y = View::new(typed::<T>(other)?, so, shape);
            float_arith!(kind, |f| zip_in_place::<T>(&mut v, &y, lhs, shape, f)).map(|()| T::wrap(v))
        };
        int T => {
            let mut v = T::unwrap_vec(buf).ok_or_else(|| bad_binary(kind, dt))?;
            let y = View::new(typed::<T>(other)?, so, shape);
            int_arith!(kind, |f| zip_in_place::<T>(&mut v, &y, lhs, shape, f)).map(|()| T::wrap(v))
        };
        bool => {
            let mut v = bool::unwrap_vec(buf).ok_or_else(|| bad_binary(kind, dt))?;
            let y = View::new(typed::<bool>(other)?, so, shape);
            bool_ops!(kind, |f| zip_in_place::<bool>(&mut v, &y, lhs, shape, f)).map(|()| HostData::Bool(v))
        }
    );
    out.ok_or_else(|| bad_binary(kind, dt))
}

// ---------------------------------------------------------------- where

/// `cond ? a : b`, all three broadcast to `shape`.
pub(crate) fn where_(
    cond: &HostData,
    sc: &[usize],
    a: &HostData,
    sa: &[usize],
    b: &HostData,
    sb: &[usize],
    shape: &[usize],
) -> Result<HostData> {
    let dt = a.dtype();
    if b.dtype() != dt {
        return Err(Error::dtype(
            "where",
            "branches must share one dtype",
            &[cond.dtype(), dt, b.dtype()],
        ));
    }
    let c = View::new(typed::<bool>(cond)?, sc, shape);
    let (stc, dc) = (c.strides(shape), c.data());
    let ic = stc.last().copied().unwrap_or(0);
    let n = numel(shape);
    Ok(by_any!(dt, T => {
        let (x, y) = (View::new(typed::<T>(a)?, sa, shape), View::new(typed::<T>(b)?, sb, shape));
        let (stx, sty, dx, dy) = (x.strides(shape), y.strides(shape), x.data(), y.data());
        let (ix, iy) = (stx.last().copied().unwrap_or(0), sty.last().copied().unwrap_or(0));
        T::wrap(build(n, |start, out: &mut [T]| {
            walk(shape, [&stc, &stx, &sty], start, out.len(), |k, [oc, ox, oy], run| {
                for (t, o) in out[k..k + run].iter_mut().enumerate() {
                    *o = if dc[oc + t * ic] { dx[ox + t * ix] } else { dy[oy + t * iy] };
                }
            })
        }))
    }))
}

// ---------------------------------------------------------------- cast

/// Conversions of one element to every dtype, with PyTorch's semantics:
/// float to int truncates toward zero (`as`: saturating, NaN to 0), int to
/// int wraps, anything to bool is `!= 0`, ints go to bf16/f16 through f32.
pub(crate) trait CastElem: Elem {
    fn to_bool(self) -> bool;
    fn to_i32(self) -> i32;
    fn to_i64(self) -> i64;
    fn to_f32(self) -> f32;
}

macro_rules! cast_float {
    ($($t:ty),*) => {$(
        impl CastElem for $t {
            fn to_bool(self) -> bool { self.load() != 0.0 }
            fn to_i32(self) -> i32 { self.load() as i32 }
            fn to_i64(self) -> i64 { self.load() as i64 }
            fn to_f32(self) -> f32 { self.load() }
        }
    )*};
}
cast_float!(f32, bf16, f16);

macro_rules! cast_int {
    ($($t:ty),*) => {$(
        impl CastElem for $t {
            fn to_bool(self) -> bool { self != 0 }
            fn to_i32(self) -> i32 { self as i32 }
            fn to_i64(self) -> i64 { self as i64 }
            fn to_f32(self) -> f32 { self as f32 }
        }
    )*};
}
cast_int!(i32, i64);

impl CastElem for bool {
    fn to_bool(self) -> bool {
        self
    }
    fn to_i32(self) -> i32 {
        self as i32
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn to_f32(self) -> f32 {
        self as u8 as f32
    }
}

/// Plain data whose every bit pattern is a valid value.
///
/// # Safety
/// Implementors must be `Copy`, have no padding, and accept any bit pattern.
unsafe trait Pod: Copy + Send + Sync + 'static {}
unsafe impl Pod for f32 {}
unsafe impl Pod for i32 {}
unsafe impl Pod for bf16 {}
unsafe impl Pod for f16 {}

/// Converts every element of `v` with `f`, reusing its allocation for the
/// result (`A` and `B` have one size and alignment).
fn convert_in_place<A: Pod, B: Pod>(mut v: Vec<A>, f: impl Fn(A) -> B + Sync + Send) -> Vec<B> {
    const { assert!(size_of::<A>() == size_of::<B>() && align_of::<A>() == align_of::<B>()) };
    for_chunks(&mut v, |_, s| {
        for e in s.iter_mut() {
            let b = f(*e);
            // SAFETY: A and B have the same size and every bit pattern is a valid A.
            *e = unsafe { std::mem::transmute_copy::<B, A>(&b) };
        }
    });
    let mut v = std::mem::ManuallyDrop::new(v);
    let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
    // SAFETY: the allocation came from a Vec<A>, and A and B have the same
    // size and alignment, so the layout is that of a Vec<B> of `cap`
    // elements; every element now holds the bits of a valid B.
    unsafe { Vec::from_raw_parts(ptr as *mut B, len, cap) }
}

fn cast_to<T: CastElem>(x: &[T], to: DType) -> HostData {
    match to {
        DType::Bool => HostData::Bool(map_new(x, T::to_bool)),
        DType::I32 => HostData::I32(map_new(x, T::to_i32)),
        DType::I64 => HostData::I64(map_new(x, T::to_i64)),
        DType::BF16 => HostData::BF16(map_new(x, |e| bf16::from_f32(e.to_f32()))),
        DType::F16 => HostData::F16(map_new(x, |e| f16::from_f32(e.to_f32()))),
        DType::F32 => HostData::F32(map_new(x, T::to_f32)),
    }
}

/// Casts to `to`. An owned input of the same element size is converted in
/// place (same dtype: returned as is).
pub(crate) fn cast(src: Src<'_>, to: DType) -> Result<HostData> {
    let data = match src {
        Src::Owned(d) => {
            return Ok(match (d, to) {
                (d, to) if d.dtype() == to => d,
                (HostData::F32(v), DType::I32) => {
                    HostData::I32(convert_in_place(v, |e: f32| e as i32))
                }
                (HostData::I32(v), DType::F32) => {
                    HostData::F32(convert_in_place(v, |e: i32| e as f32))
                }
                (HostData::BF16(v), DType::F16) => {
                    HostData::F16(convert_in_place(v, |e: bf16| f16::from_f32(e.to_f32())))
                }
                (HostData::F16(v), DType::BF16) => {
                    HostData::BF16(convert_in_place(v, |e: f16| bf16::from_f32(e.to_f32())))
                }
                (d, to) => cast(Src::Borrowed(&d), to)?,
            })
        }
        Src::Borrowed(d) => d,
    };
    Ok(by_any!(data.dtype(), T => cast_to::<T>(typed::<T>(data)?, to)))
}
