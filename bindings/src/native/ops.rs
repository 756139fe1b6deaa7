//! The native lowerings, one table. Each kernel makes the engine calls of
//! its Python twin in `deferfuse/lowerings/` for the arguments it accepts,
//! and answers `None` (run the Python lowering) for the rest; the forms
//! below derive in-place (`foo_`) and `_foreach_foo` ops from them, as the
//! Python side derives them (`_dispatch.inplace_kernel`, `foreach_kernel`).

use deferfuse::{Context, DType, GeluApproximation, Result, Scalar, ScalarOrTensor, Tensor};
use smallvec::{smallvec, SmallVec};

use super::{Done, Operand, Outcome, Ret, A};
use crate::root::{from_scalar_type, Cell};
use crate::tensor::{binary_op, unary_op};

/// A functional kernel: the op's value, or `None` when not handled.
type Kernel = fn(&Context, &[A<'_>]) -> Result<Option<Tensor>>;
type Run = for<'a> fn(&Context, &[A<'a>]) -> Outcome<'a>;

pub struct NativeOp {
    /// The aten overload, as the Python registry names it (`mul.Tensor`, `neg.default`).
    pub name: &'static str,
    pub run: Run,
}

fn arg<'x, 'a>(a: &'x [A<'a>], i: usize) -> &'x A<'a> {
    a.get(i).unwrap_or(&A::None)
}

fn tensor<'x>(a: &'x [A<'_>], i: usize) -> Option<&'x Tensor> {
    arg(a, i).tensor()
}

fn is_float(t: &Tensor) -> bool {
    matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16)
}

/// `other * alpha` as Python's `_alpha` computes it (a scalar `other` with
/// a non-unit `alpha` is left to Python).
fn scaled(other: &A<'_>, alpha: &A<'_>) -> Result<Option<ScalarOrTensor>> {
    if alpha.is_one() {
        return Ok(other.operand());
    }
    match (other, alpha.scalar()) {
        (A::Tensor(o), Some(alpha)) => {
            Ok(Some(ScalarOrTensor::Tensor(o.value.mul(ScalarOrTensor::Scalar(alpha))?)))
        }
        _ => Ok(None),
    }
}

fn binary(name: &str, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(x), Some(y)) = (tensor(a, 0), arg(a, 1).operand()) else {
        return Ok(None);
    };
    // Python turns bool mul/maximum/minimum into logical ops.
    if matches!(name, "mul" | "maximum" | "minimum") && arg(a, 0).is_bool() && arg(a, 1).is_bool() {
        return Ok(None);
    }
    binary_op(x, name, y).transpose()
}

macro_rules! binaries {
    ($($f:ident = $name:literal),* $(,)?) => {$(
        fn $f(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
            binary($name, a)
        }
    )*};
}
binaries!(mul = "mul", div = "div", maximum = "maximum", minimum = "minimum", eq = "eq", ne = "ne");
binaries!(lt = "lt", le = "le", gt = "gt", ge = "ge");

/// `pow(x, scalar)` of a float tensor; a square is a product, as the Python
/// lowering makes it (RMSNorm's `x.pow(2)`). Integer bases go to Python.
fn pow_scalar(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let Some(x) = tensor(a, 0).filter(|x| is_float(x)) else { return Ok(None) };
    match arg(a, 1) {
        A::Int(2) => x.mul(x).map(Some),
        A::Float(e) if *e == 2.0 => x.mul(x).map(Some),
        A::Int(_) | A::Float(_) => binary("pow", a),
        _ => Ok(None),
    }
}

fn add(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let Some(x) = tensor(a, 0) else { return Ok(None) };
    if arg(a, 0).is_bool() && arg(a, 1).is_bool() {
        return Ok(None);
    }
    let Some(y) = scaled(arg(a, 1), arg(a, 2))? else { return Ok(None) };
    x.add(y).map(Some)
}

fn sub(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let Some(x) = tensor(a, 0) else { return Ok(None) };
    if x.dtype() == DType::Bool {
        return Ok(None);
    }
    let Some(y) = scaled(arg(a, 1), arg(a, 2))? else { return Ok(None) };
    x.sub(y).map(Some)
}

/// `rsub(x, scalar)`: `scalar - x` as the Python lowering computes it,
/// `-x + scalar` (bools and a non-unit alpha go to Python).
fn rsub(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let Some(x) = tensor(a, 0).filter(|x| x.dtype() != DType::Bool) else { return Ok(None) };
    match (arg(a, 1), arg(a, 2).is_one()) {
        (A::Int(_) | A::Float(_), true) => {
            let Some(other) = arg(a, 1).operand() else { return Ok(None) };
            x.neg()?.add(other).map(Some)
        }
        _ => Ok(None),
    }
}

/// `&`, `|` and `^` of bools, PyTorch's logical ops; with an integer
/// operand they go to Python.
fn bitwise(op: &str, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(x), Some(y)) = (tensor(a, 0), arg(a, 1).operand()) else { return Ok(None) };
    if !(arg(a, 0).is_bool() && arg(a, 1).is_bool()) {
        return Ok(None);
    }
    match op {
        "and" => x.logical_and(y),
        "or" => x.logical_or(y),
        _ => x.ne(y),
    }
    .map(Some)
}

fn bitwise_and(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    bitwise("and", a)
}

fn bitwise_or(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    bitwise("or", a)
}

fn bitwise_xor(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    bitwise("xor", a)
}

/// `~x` of bools; integers go to Python.
fn bitwise_not(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    match tensor(a, 0) {
        Some(x) if x.dtype() == DType::Bool => x.logical_not().map(Some),
        _ => Ok(None),
    }
}

fn unary(name: &str, a: &[A<'_>]) -> Result<Option<Tensor>> {
    match tensor(a, 0) {
        Some(x) => unary_op(x, name).transpose(),
        None => Ok(None),
    }
}

macro_rules! unaries {
    ($($f:ident = $name:literal),* $(,)?) => {$(
        fn $f(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
            unary($name, a)
        }
    )*};
}
unaries!(abs = "abs", neg = "neg", exp = "exp", log = "log", sqrt = "sqrt", rsqrt = "rsqrt");
unaries!(
    reciprocal = "reciprocal",
    tanh = "tanh",
    sigmoid = "sigmoid",
    relu = "relu",
    silu = "silu"
);
unaries!(sin = "sin", cos = "cos", floor = "floor", sign = "sign", logical_not = "logical_not");

fn gelu(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    match arg(a, 1) {
        A::Str("tanh") => unary("gelu_tanh", a),
        A::Str("none") | A::None => unary("gelu", a),
        _ => Ok(None),
    }
}

fn where_self(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(c), Some(x), Some(y)) = (tensor(a, 0), arg(a, 1).operand(), arg(a, 2).operand())
    else {
        return Ok(None);
    };
    c.where_cond(x, y).map(Some)
}

fn addcmul(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(x), Some(t1), Some(t2)) = (tensor(a, 0), tensor(a, 1), tensor(a, 2)) else {
        return Ok(None);
    };
    let product = A::Tensor(Operand { value: t1.mul(t2)?, whole: None });
    let Some(y) = scaled(&product, arg(a, 3))? else { return Ok(None) };
    x.add(y).map(Some)
}

fn addcdiv(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(x), Some(t1), Some(t2)) = (tensor(a, 0), tensor(a, 1), tensor(a, 2)) else {
        return Ok(None);
    };
    if !is_float(t1) && !is_float(t2) {
        return Ok(None);
    }
    let quotient = A::Tensor(Operand { value: t1.div(t2)?, whole: None });
    let Some(y) = scaled(&quotient, arg(a, 3))? else { return Ok(None) };
    x.add(y).map(Some)
}

fn lerp(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(x), Some(end), Some(weight)) = (tensor(a, 0), tensor(a, 1), arg(a, 2).operand())
    else {
        return Ok(None);
    };
    x.add(end.sub(x)?.mul(weight)?).map(Some)
}

fn fill(ctx: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let value = match arg(a, 1).scalar() {
        Some(Scalar::Float(v)) => v,
        Some(Scalar::Int(v)) => v as f64,
        Some(Scalar::Bool(v)) => f64::from(u8::from(v)),
        None => return Ok(None),
    };
    // Debug uploads non-finite constants as data (`factories.constant`): Python's path.
    let Some(x) = tensor(a, 0).filter(|_| value.is_finite()) else { return Ok(None) };
    ctx.full(value, x.shape(), x.dtype()).map(Some)
}

fn zero(ctx: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    match tensor(a, 0) {
        Some(x) => ctx.full(0.0, x.shape(), x.dtype()).map(Some),
        None => Ok(None),
    }
}

fn matmul(a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    if a.dtype() != b.dtype() || !is_float(a) {
        return Ok(None);
    }
    a.matmul(b).map(Some)
}

fn mm(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    match (tensor(a, 0), tensor(a, 1)) {
        (Some(x), Some(y)) => matmul(x, y),
        _ => Ok(None),
    }
}

fn addmm(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(bias), Some(m1), Some(m2)) = (tensor(a, 0), tensor(a, 1), tensor(a, 2)) else {
        return Ok(None);
    };
    let Some(product) = matmul(m1, m2)? else { return Ok(None) };
    let product = A::Tensor(Operand { value: product, whole: None });
    let Some(ScalarOrTensor::Tensor(product)) = scaled(&product, arg(a, 4))? else {
        return Ok(None);
    };
    let beta = arg(a, 3);
    if matches!(*beta, A::Int(0) | A::Bool(false)) || matches!(*beta, A::Float(v) if v == 0.0) {
        return Ok(Some(product));
    }
    let bias = A::Tensor(Operand { value: bias.clone(), whole: None });
    let Some(bias) = scaled(&bias, beta)? else { return Ok(None) };
    product.add(bias).map(Some)
}

/// `dim` of a reduction: every axis for None or [].
fn axes(x: &Tensor, dim: &A<'_>) -> Option<Vec<i64>> {
    match dim {
        A::None => Some((0..x.shape().len() as i64).collect()),
        A::Ints([]) => Some((0..x.shape().len() as i64).collect()),
        A::Ints(d) => Some(d.to_vec()),
        _ => None,
    }
}

fn sum_dim(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(x), A::Bool(keepdim), A::None) = (tensor(a, 0), arg(a, 2), arg(a, 3)) else {
        return Ok(None);
    };
    match axes(x, arg(a, 1)) {
        Some(axes) if !x.shape().is_empty() => x.sum(&axes, *keepdim).map(Some),
        _ => Ok(None),
    }
}

/// `any` and `all` (`.default`, `.dim`, `.dims`) by counting, as the Python
/// lowering does, so that a reduction over no elements is False (any) or
/// True (all). Zero-dimensional tensors go to Python.
fn any_or_all(all: bool, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let Some(x) = tensor(a, 0).filter(|x| x.rank() > 0) else { return Ok(None) };
    let axes = match arg(a, 1) {
        A::Int(d) => vec![*d],
        dim => match axes(x, dim) {
            Some(axes) => axes,
            None => return Ok(None),
        },
    };
    let rank = x.rank() as i64;
    if axes.iter().any(|d| !(-rank..rank).contains(d)) {
        return Ok(None); // PyTorch's IndexError, from the Python path
    }
    let keepdim = match arg(a, 2) {
        A::Bool(k) => *k,
        A::None => false,
        _ => return Ok(None),
    };
    let mut flags = x.to_dtype(DType::Bool)?;
    if all {
        flags = flags.logical_not()?;
    }
    let count = flags.to_dtype(DType::I64)?.sum(&axes, keepdim)?;
    match all {
        true => count.eq(0i64).map(Some),
        false => count.gt(0i64).map(Some),
    }
}

fn any(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    any_or_all(false, a)
}

fn all(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    any_or_all(true, a)
}

/// `argmax` of a non-empty tensor with dimensions; without a dim, into the
/// flattened tensor (every dim 1 with keepdim). Bools, empty and
/// zero-dimensional tensors go to Python (its errors, its answers).
fn argmax(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let Some(x) =
        tensor(a, 0).filter(|x| x.rank() > 0 && x.numel() > 0 && x.dtype() != DType::Bool)
    else {
        return Ok(None);
    };
    let keepdim = matches!(arg(a, 2), A::Bool(true));
    match arg(a, 1) {
        A::Int(d) if (-(x.rank() as i64)..x.rank() as i64).contains(d) => {
            x.argmax(Some(*d), keepdim).map(Some)
        }
        A::None if keepdim => x.argmax(None, false)?.reshape(&vec![1; x.rank()]).map(Some),
        A::None => x.argmax(None, false).map(Some),
        _ => Ok(None),
    }
}

fn mean_dim(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(x), A::Bool(keepdim), A::None) = (tensor(a, 0), arg(a, 2), arg(a, 3)) else {
        return Ok(None);
    };
    let rank = x.shape().len() as i64;
    let Some(axes) = axes(x, arg(a, 1)) else { return Ok(None) };
    let empty = axes.iter().any(|&d| {
        !(-rank..rank).contains(&d) || x.shape()[d.rem_euclid(rank.max(1)) as usize] == 0
    });
    if rank == 0 || empty {
        return Ok(None);
    }
    x.mean(&axes, *keepdim).map(Some)
}

fn softmax_input(a: &[A<'_>]) -> Result<Option<(Tensor, i64)>> {
    let (Some(x), A::Int(dim), A::Bool(half_to_float)) = (tensor(a, 0), arg(a, 1), arg(a, 2))
    else {
        return Ok(None);
    };
    if x.shape().is_empty() {
        return Ok(None);
    }
    let x = if *half_to_float { x.to_dtype(DType::F32)? } else { x.clone() };
    Ok(Some((x, *dim)))
}

fn softmax(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    match softmax_input(a)? {
        Some((x, dim)) => x.softmax(dim).map(Some),
        None => Ok(None),
    }
}

fn log_softmax(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    match softmax_input(a)? {
        Some((x, dim)) => x.log_softmax(dim).map(Some),
        None => Ok(None),
    }
}

fn safe_softmax(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(x), A::Int(dim)) = (tensor(a, 0), arg(a, 1)) else { return Ok(None) };
    if !is_float(x) || x.shape().is_empty() {
        return Ok(None);
    }
    let x = match arg(a, 2) {
        A::None => x.clone(),
        A::Int(code) => match i8::try_from(*code).ok().and_then(from_scalar_type) {
            Some(dtype) => x.to_dtype(dtype)?,
            None => return Ok(None),
        },
        _ => return Ok(None),
    };
    let axis = dim.rem_euclid(x.shape().len() as i64);
    let finite =
        x.eq(f64::NEG_INFINITY)?.logical_not()?.to_dtype(DType::I64)?.sum(&[axis], true)?;
    finite.eq(0i64)?.where_cond(0.0, x.softmax(*dim)?).map(Some)
}

/// `(grad_output, output, dim, input_dtype)` of the softmax backward ops.
fn softmax_grad_args<'x>(a: &'x [A<'_>]) -> Option<(&'x Tensor, &'x Tensor, i64, DType)> {
    let (Some(g), Some(y), A::Int(dim), A::Int(dtype)) =
        (tensor(a, 0), tensor(a, 1), arg(a, 2), arg(a, 3))
    else {
        return None;
    };
    let dtype = from_scalar_type(i8::try_from(*dtype).ok()?)?;
    (!y.shape().is_empty()).then_some((g, y, *dim, dtype))
}

fn softmax_backward(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let Some((grad, out, dim, dtype)) = softmax_grad_args(a) else { return Ok(None) };
    let g = grad.mul(out)?;
    g.sub(out.mul(g.sum(&[dim], true)?)?)?.to_dtype(dtype).map(Some)
}

fn log_softmax_backward(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let Some((grad, out, dim, dtype)) = softmax_grad_args(a) else { return Ok(None) };
    let total = grad.sum(&[dim], true)?;
    grad.sub(out.exp()?.mul(total)?)?.to_dtype(dtype).map(Some)
}

// ---- activation gradients, as `lowerings/elementwise.py` composes them ----------------

fn threshold_backward(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let (Some(grad), Some(x), Some(threshold)) = (tensor(a, 0), tensor(a, 1), arg(a, 2).operand())
    else {
        return Ok(None);
    };
    x.gt(threshold)?.where_cond(grad, 0i64).map(Some)
}

/// `grad * d`, for the backward ops of `(grad_output, x)` whose derivative
/// `d` is a function of `x` alone.
fn chain(a: &[A<'_>], d: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Option<Tensor>> {
    match (tensor(a, 0), tensor(a, 1)) {
        (Some(grad), Some(x)) => grad.mul(d(x)?).map(Some),
        _ => Ok(None),
    }
}

fn sigmoid_backward(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    chain(a, |y| y.mul(y.neg()?.add(1.0)?))
}

fn tanh_backward(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    chain(a, |y| y.mul(y)?.neg()?.add(1.0))
}

fn silu_backward(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    chain(a, |x| {
        let s = x.sigmoid()?;
        s.mul(x.mul(s.neg()?.add(1.0)?)?.add(1.0)?)
    })
}

fn gelu_backward(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    match arg(a, 2) {
        A::Str("tanh") => chain(a, |x| {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            let inner = x.add(x.mul(x)?.mul(x)?.mul(0.044715)?)?.mul(k)?;
            let t = inner.tanh()?;
            let dinner = x.mul(x)?.mul(3.0 * 0.044715)?.add(1.0)?.mul(k)?;
            let slope = x.mul(0.5)?.mul(t.mul(&t)?.neg()?.add(1.0)?)?.mul(dinner)?;
            t.add(1.0)?.mul(0.5)?.add(slope)
        }),
        // d/dx x*Phi(x) = Phi(x) + x*phi(x); Phi(x) = gelu(x)/x away from 0, 1/2 at 0.
        A::Str("none") | A::None => chain(a, |x| {
            let pdf = x.mul(x)?.mul(-0.5)?.exp()?.mul(1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
            let safe = x.eq(0i64)?.where_cond(1.0, x)?;
            let cdf = x.eq(0i64)?.where_cond(0.5, x.gelu(GeluApproximation::None)?.div(safe)?)?;
            cdf.add(x.mul(pdf)?)
        }),
        _ => Ok(None),
    }
}

/// Engine values are immutable (a write replaces a root's value), so a clone
/// shares its input's value, read out of its view when it is one; the new
/// tensor is contiguous, as the Python lowering's is.
fn clone(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    Ok(tensor(a, 0).cloned())
}

/// `cat(tensors, dim)`, skipping the 1-D empty tensors PyTorch skips;
/// a list with anything but tensors, or only empty ones, goes to Python.
fn cat(_: &Context, a: &[A<'_>]) -> Result<Option<Tensor>> {
    let A::List(items) = arg(a, 0) else { return Ok(None) };
    let dim = match arg(a, 1) {
        A::Int(d) => *d,
        A::None => 0,
        _ => return Ok(None),
    };
    let mut parts = Vec::with_capacity(items.len());
    for item in items {
        let Some(t) = item.tensor() else { return Ok(None) };
        if t.shape() != [0] {
            parts.push(t);
        }
    }
    if parts.is_empty() {
        return Ok(None);
    }
    Tensor::cat(&parts, dim).map(Some)
}

/// The normalized axes of a LayerNorm: the trailing ones, which must have
/// the sizes of `normalized_shape`.
fn norm_axes(x: &Tensor, normalized: &A<'_>) -> Option<Vec<i64>> {
    let A::Ints(sizes) = normalized else { return None };
    let (n, rank) = (sizes.len(), x.shape().len());
    let trailing = x.shape().get(rank.checked_sub(n)?..)?;
    let matches = trailing.iter().zip(sizes.iter()).all(|(&a, &b)| a as i64 == b);
    (n > 0 && matches).then(|| (rank - n..rank).map(|d| d as i64).collect())
}

fn native_layer_norm<'a>(_: &Context, a: &[A<'a>]) -> Outcome<'a> {
    let (Some(input), A::Float(eps)) = (tensor(a, 0), arg(a, 4)) else { return Ok(None) };
    if !is_float(input) || input.shape().iter().product::<usize>() == 0 {
        return Ok(None);
    }
    let Some(axes) = norm_axes(input, arg(a, 1)) else { return Ok(None) };
    let x = input.to_dtype(DType::F32)?;
    let mean = x.mean(&axes, true)?;
    let centered = x.sub(&mean)?;
    let variance = centered.mul(&centered)?.mean(&axes, true)?;
    let rstd = variance.add(ScalarOrTensor::Scalar(Scalar::Float(*eps)))?.rsqrt()?;
    let mut y = centered.mul(&rstd)?;
    if let Some(weight) = tensor(a, 2) {
        y = y.mul(weight.to_dtype(DType::F32)?)?;
    }
    if let Some(bias) = tensor(a, 3) {
        y = y.add(bias.to_dtype(DType::F32)?)?;
    }
    let out = |t: Tensor| t.to_dtype(input.dtype()).map(Ret::Fresh);
    Ok(Some(Done { outs: smallvec![out(y)?, out(mean)?, out(rstd)?], writes: smallvec![] }))
}

fn native_layer_norm_backward<'a>(_: &Context, a: &[A<'a>]) -> Outcome<'a> {
    let (Some(grad), Some(input), Some(mean), Some(rstd)) =
        (tensor(a, 0), tensor(a, 1), tensor(a, 3), tensor(a, 4))
    else {
        return Ok(None);
    };
    let (weight, bias) = (tensor(a, 5), tensor(a, 6));
    let (Some(axes), A::Ints(&[want_dx, want_dw, want_db])) =
        (norm_axes(input, arg(a, 2)), arg(a, 7))
    else {
        return Ok(None);
    };
    let batch: Vec<i64> = (0..axes[0]).collect();
    let f32 = |t: &Tensor| t.to_dtype(DType::F32);
    let (x, g, rstd) = (f32(input)?, f32(grad)?, f32(rstd)?);
    let xhat = x.sub(f32(mean)?)?.mul(&rstd)?;
    let gw = match weight {
        Some(w) => g.mul(f32(w)?)?,
        None => g.clone(),
    };
    let dx = if want_dx != 0 {
        let mean_g = gw.mean(&axes, true)?;
        let mean_gx = gw.mul(&xhat)?.mean(&axes, true)?;
        let dx = gw.sub(mean_g)?.sub(xhat.mul(mean_gx)?)?.mul(&rstd)?;
        Ret::Fresh(dx.to_dtype(input.dtype())?)
    } else {
        Ret::Undefined
    };
    let dw = match weight {
        Some(w) if want_dw != 0 => {
            Ret::Fresh(g.mul(&xhat)?.sum(&batch, false)?.to_dtype(w.dtype())?)
        }
        _ => Ret::Undefined,
    };
    let db = match bias {
        Some(b) if want_db != 0 => Ret::Fresh(g.sum(&batch, false)?.to_dtype(b.dtype())?),
        _ => Ret::Undefined,
    };
    Ok(Some(Done { outs: smallvec![dx, dw, db], writes: smallvec![] }))
}

// ---- forms -------------------------------------------------------------------------

fn functional<'a>(f: Kernel, ctx: &Context, a: &[A<'a>]) -> Outcome<'a> {
    Ok(f(ctx, a)?.map(|t| Done { outs: smallvec![Ret::Fresh(t)], writes: smallvec![] }))
}

/// PyTorch's `can_cast` between engine dtypes: never to a lower category
/// (float > integer > bool).
fn can_cast(from: DType, to: DType) -> bool {
    let category = |d: DType| match d {
        DType::Bool => 0,
        DType::I32 | DType::I64 => 1,
        DType::F32 | DType::BF16 | DType::F16 => 2,
    };
    category(from) <= category(to)
}

/// `value` as the new value of `target` (an in-place op's `self`): of its
/// shape, cast to its dtype. Broadcasting into `self` and casts PyTorch
/// refuses are left to Python, which raises PyTorch's errors.
fn fit(value: Tensor, target: &Tensor) -> Result<Option<Tensor>> {
    if value.shape() != target.shape() || !can_cast(value.dtype(), target.dtype()) {
        return Ok(None);
    }
    value.to_dtype(target.dtype()).map(Some)
}

/// The write of an in-place op on `a[0]`.
fn write_self<'a>(f: Kernel, ctx: &Context, a: &[A<'a>]) -> Result<Option<(&'a Cell, Tensor)>> {
    let A::Tensor(Operand { value: target, whole: Some(cell) }) = arg(a, 0) else {
        return Ok(None);
    };
    let Some(value) = f(ctx, a)? else { return Ok(None) };
    Ok(fit(value, target)?.map(|v| (*cell, v)))
}

fn inplace<'a>(f: Kernel, ctx: &Context, a: &[A<'a>]) -> Outcome<'a> {
    Ok(write_self(f, ctx, a)?
        .map(|w| Done { outs: smallvec![Ret::Input(0)], writes: smallvec![w] }))
}

/// The arguments of element `i` of a `_foreach_` op: lists of length `n`
/// give their `i`-th item, everything else is passed to every element.
fn element<'a>(a: &[A<'a>], i: usize, n: usize) -> Vec<A<'a>> {
    a.iter()
        .map(|x| match x {
            A::List(items) if items.len() == n => items[i].clone(),
            other => other.clone(),
        })
        .collect()
}

fn foreach<'a>(f: Kernel, ctx: &Context, a: &[A<'a>]) -> Outcome<'a> {
    let A::List(selves) = arg(a, 0) else { return Ok(None) };
    let n = selves.len();
    let mut done = Done::default();
    for i in 0..n {
        let Some(t) = f(ctx, &element(a, i, n))? else { return Ok(None) };
        done.outs.push(Ret::Fresh(t));
    }
    Ok(Some(done))
}

fn foreach_inplace<'a>(f: Kernel, ctx: &Context, a: &[A<'a>]) -> Outcome<'a> {
    let A::List(selves) = arg(a, 0) else { return Ok(None) };
    let n = selves.len();
    let mut done = Done::default();
    for i in 0..n {
        let Some(w) = write_self(f, ctx, &element(a, i, n))? else { return Ok(None) };
        done.writes.push(w);
    }
    Ok(Some(done))
}

/// `_copy_from(src, dst)`: `dst` (all of its storage) takes `src`'s value,
/// cast to its dtype and broadcast to its shape, as `_dispatch.copy_from` does.
fn copy_from<'a>(_: &Context, a: &[A<'a>]) -> Outcome<'a> {
    let (Some(src), A::Tensor(Operand { value: dst, whole: Some(cell) })) =
        (tensor(a, 0), arg(a, 1))
    else {
        return Ok(None);
    };
    let mut value = src.to_dtype(dst.dtype())?;
    if value.shape() != dst.shape() {
        value = value.expand(dst.shape())?;
    }
    Ok(Some(Done { outs: smallvec![Ret::Input(1)], writes: smallvec![(*cell, value)] }))
}

/// The fused optimizer steps (`_fused_adam_`, `_fused_adamw_`,
/// `_fused_sgd_`): the arithmetic of their Python twins in
/// `deferfuse/_fused_optim.py`, which holds the why. Every tensor they write
/// must be all of its storage and a float; a learning rate on `tpu` is left
/// to Python.
struct Optimizer<'x, 'a> {
    a: &'x [A<'a>],
    /// GradScaler's `found_inf == 1`: every write keeps its old value.
    skip: Option<Tensor>,
    grad_scale: Option<Tensor>,
    writes: SmallVec<[(&'a Cell, Tensor); 1]>,
}

fn number(x: &A<'_>) -> Option<f64> {
    match *x {
        A::Float(v) => Some(v),
        A::Int(v) => Some(v as f64),
        _ => None,
    }
}

fn flag(x: &A<'_>) -> Option<bool> {
    match *x {
        A::Bool(v) => Some(v),
        _ => None,
    }
}

fn f32(t: &Tensor) -> Result<Tensor> {
    t.to_dtype(DType::F32)
}

impl<'x, 'a> Optimizer<'x, 'a> {
    /// `None` unless the `lists` leading lists all have `n` float tensors
    /// that are whole storages (`may_be_empty`: a list that may be empty).
    fn new(
        a: &'x [A<'a>],
        lists: usize,
        may_be_empty: &[usize],
        scale_at: usize,
    ) -> Option<(Self, usize)> {
        let A::List(first) = arg(a, 0) else { return None };
        let n = first.len();
        for i in 0..lists {
            let A::List(items) = arg(a, i) else { return None };
            if items.is_empty() && may_be_empty.contains(&i) {
                continue;
            }
            let whole_float = |x: &A<'_>| matches!(x, A::Tensor(Operand { value, whole: Some(_) }) if is_float(value));
            if items.len() != n || !items.iter().all(whole_float) {
                return None;
            }
        }
        let optional = |x: &A<'a>| match x {
            A::None => Some(None),
            A::Tensor(o) => Some(Some(o.value.clone())),
            _ => None,
        };
        let grad_scale = optional(arg(a, scale_at))?;
        let found_inf = optional(arg(a, scale_at + 1))?;
        let skip = found_inf.map(|f| f.eq(1.0)).transpose().ok()?;
        Some((Optimizer { a, skip, grad_scale, writes: SmallVec::new() }, n))
    }

    fn item(&self, list: usize, i: usize) -> (&'a Cell, &Tensor) {
        let A::List(items) = &self.a[list] else { unreachable!("checked in new") };
        let A::Tensor(Operand { value, whole: Some(cell) }) = &items[i] else {
            unreachable!("checked in new")
        };
        (*cell, value)
    }

    /// Element `i` of `list` in float32.
    fn read(&self, list: usize, i: usize) -> Result<Tensor> {
        f32(self.item(list, i).1)
    }

    /// Element `i` of `list` takes `value` (unless `found_inf`).
    fn write(&mut self, list: usize, i: usize, value: Tensor) -> Result<()> {
        let (cell, target) = self.item(list, i);
        let value = match &self.skip {
            Some(skip) => skip.where_cond(f32(target)?, value)?,
            None => value,
        };
        self.writes.push((cell, value.to_dtype(target.dtype())?));
        Ok(())
    }

    /// The gradient, unscaled by GradScaler's scale (written back, as the CPU kernel does).
    fn gradient(&mut self, list: usize, i: usize, maximize: bool) -> Result<Tensor> {
        let mut g = self.read(list, i)?;
        if let Some(scale) = self.grad_scale.clone() {
            g = g.div(scale)?;
            self.write(list, i, g.clone())?;
        }
        if maximize {
            g = g.neg()?;
        }
        Ok(g)
    }

    fn done(self) -> Done<'a> {
        Done { outs: smallvec![], writes: self.writes }
    }
}

/// `base ** step` for a step count held in a tensor.
fn power(base: f64, step: &Tensor) -> Result<Tensor> {
    if base == 0.0 {
        return f32(step)?.mul(0.0);
    }
    f32(step)?.mul(base.ln())?.exp()
}

fn fused_adam<'a>(a: &[A<'a>], decoupled: bool) -> Outcome<'a> {
    let [Some(lr), Some(beta1), Some(beta2), Some(weight_decay), Some(eps)] =
        [6, 7, 8, 9, 10].map(|i| number(arg(a, i)))
    else {
        return Ok(None);
    };
    let (Some(amsgrad), Some(maximize)) = (flag(arg(a, 11)), flag(arg(a, 12))) else {
        return Ok(None);
    };
    let steps_are_tensors =
        matches!(arg(a, 5), A::List(s) if s.iter().all(|x| x.tensor().is_some()));
    let Some((mut opt, n)) = Optimizer::new(a, 5, &[4], 13).filter(|_| steps_are_tensors) else {
        return Ok(None);
    };
    if amsgrad && !matches!(arg(a, 4), A::List(m) if m.len() == n) {
        return Ok(None);
    }
    for i in 0..n {
        let mut p = opt.read(0, i)?;
        let mut g = opt.gradient(1, i, maximize)?;
        if weight_decay != 0.0 {
            if decoupled {
                p = p.mul(1.0 - lr * weight_decay)?;
            } else {
                g = g.add(p.mul(weight_decay)?)?;
            }
        }
        let exp_avg = opt.read(2, i)?;
        let exp_avg = exp_avg.add(g.sub(exp_avg.clone())?.mul(1.0 - beta1)?)?;
        let exp_avg_sq = opt.read(3, i)?.mul(beta2)?.add(g.mul(g.clone())?.mul(1.0 - beta2)?)?;
        let A::List(steps) = arg(a, 5) else { unreachable!("checked above") };
        let step = steps[i].tensor().expect("checked above");
        let step_size = power(beta1, step)?.neg()?.add(1.0)?.reciprocal()?.mul(lr)?;
        let correction2_sqrt = power(beta2, step)?.neg()?.add(1.0)?.sqrt()?;
        let mut second = exp_avg_sq.clone();
        if amsgrad {
            second = opt.read(4, i)?.maximum(exp_avg_sq.clone())?;
            opt.write(4, i, second.clone())?;
        }
        let denom = second.sqrt()?.div(correction2_sqrt)?.add(eps)?;
        let update = exp_avg.mul(step_size)?.div(denom)?;
        opt.write(2, i, exp_avg)?;
        opt.write(3, i, exp_avg_sq)?;
        opt.write(0, i, p.sub(update)?)?;
    }
    Ok(Some(opt.done()))
}

fn fused_adam_<'a>(_: &Context, a: &[A<'a>]) -> Outcome<'a> {
    fused_adam(a, false)
}

fn fused_adamw_<'a>(_: &Context, a: &[A<'a>]) -> Outcome<'a> {
    fused_adam(a, true)
}

fn fused_sgd_<'a>(_: &Context, a: &[A<'a>]) -> Outcome<'a> {
    let [Some(weight_decay), Some(momentum), Some(lr), Some(dampening)] =
        [3, 4, 5, 6].map(|i| number(arg(a, i)))
    else {
        return Ok(None);
    };
    let [Some(nesterov), Some(maximize), Some(first_step)] = [7, 8, 9].map(|i| flag(arg(a, i)))
    else {
        return Ok(None);
    };
    let Some((mut opt, n)) = Optimizer::new(a, 3, &[2], 10) else { return Ok(None) };
    if momentum != 0.0 && !matches!(arg(a, 2), A::List(m) if m.len() == n) {
        return Ok(None);
    }
    for i in 0..n {
        let p = opt.read(0, i)?;
        let mut g = opt.gradient(1, i, maximize)?;
        if weight_decay != 0.0 {
            g = g.add(p.mul(weight_decay)?)?;
        }
        if momentum != 0.0 {
            let buf = match first_step {
                true => g.clone(),
                false => opt.read(2, i)?.mul(momentum)?.add(g.mul(1.0 - dampening)?)?,
            };
            opt.write(2, i, buf.clone())?;
            g = if nesterov { g.add(buf.mul(momentum)?)? } else { buf };
        }
        opt.write(0, i, p.sub(g.mul(lr)?)?)?;
    }
    Ok(Some(opt.done()))
}

macro_rules! table {
    ($($name:literal => $form:ident($f:ident)),* $(,)?) => {
        pub static OPS: &[NativeOp] = &[
            $(NativeOp { name: $name, run: |ctx, a| $form($f, ctx, a) }),*
        ];
    };
}

fn direct<'a>(f: Run, ctx: &Context, a: &[A<'a>]) -> Outcome<'a> {
    f(ctx, a)
}

table! {
    "add.Tensor" => functional(add), "add.Scalar" => functional(add),
    "sub.Tensor" => functional(sub), "sub.Scalar" => functional(sub),
    "mul.Tensor" => functional(mul), "mul.Scalar" => functional(mul),
    "div.Tensor" => functional(div), "div.Scalar" => functional(div),
    "add_.Tensor" => inplace(add), "add_.Scalar" => inplace(add),
    "sub_.Tensor" => inplace(sub), "sub_.Scalar" => inplace(sub),
    "mul_.Tensor" => inplace(mul), "mul_.Scalar" => inplace(mul),
    "div_.Tensor" => inplace(div), "div_.Scalar" => inplace(div),
    "maximum.default" => functional(maximum), "minimum.default" => functional(minimum),
    "eq.Tensor" => functional(eq), "eq.Scalar" => functional(eq),
    "ne.Tensor" => functional(ne), "ne.Scalar" => functional(ne),
    "lt.Tensor" => functional(lt), "lt.Scalar" => functional(lt),
    "le.Tensor" => functional(le), "le.Scalar" => functional(le),
    "gt.Tensor" => functional(gt), "gt.Scalar" => functional(gt),
    "ge.Tensor" => functional(ge), "ge.Scalar" => functional(ge),
    "abs.default" => functional(abs), "abs_.default" => inplace(abs),
    "neg.default" => functional(neg), "neg_.default" => inplace(neg),
    "exp.default" => functional(exp), "exp_.default" => inplace(exp),
    "log.default" => functional(log), "log_.default" => inplace(log),
    "sqrt.default" => functional(sqrt), "sqrt_.default" => inplace(sqrt),
    "rsqrt.default" => functional(rsqrt), "rsqrt_.default" => inplace(rsqrt),
    "reciprocal.default" => functional(reciprocal), "reciprocal_.default" => inplace(reciprocal),
    "tanh.default" => functional(tanh), "tanh_.default" => inplace(tanh),
    "sigmoid.default" => functional(sigmoid), "sigmoid_.default" => inplace(sigmoid),
    "relu.default" => functional(relu), "relu_.default" => inplace(relu),
    "silu.default" => functional(silu), "silu_.default" => inplace(silu),
    "sin.default" => functional(sin), "cos.default" => functional(cos),
    "floor.default" => functional(floor), "sign.default" => functional(sign),
    "sgn.default" => functional(sign), "logical_not.default" => functional(logical_not),
    "gelu.default" => functional(gelu),
    "where.self" => functional(where_self),
    "addcmul.default" => functional(addcmul), "addcmul_.default" => inplace(addcmul),
    "addcdiv.default" => functional(addcdiv), "addcdiv_.default" => inplace(addcdiv),
    "lerp.Scalar" => functional(lerp), "lerp_.Scalar" => inplace(lerp),
    "lerp.Tensor" => functional(lerp), "lerp_.Tensor" => inplace(lerp),
    "fill_.Scalar" => inplace(fill), "zero_.default" => inplace(zero),
    "mm.default" => functional(mm), "bmm.default" => functional(mm),
    "addmm.default" => functional(addmm),
    "sum.dim_IntList" => functional(sum_dim), "mean.dim" => functional(mean_dim),
    "any.default" => functional(any), "any.dim" => functional(any), "any.dims" => functional(any),
    "all.default" => functional(all), "all.dim" => functional(all), "all.dims" => functional(all),
    "argmax.default" => functional(argmax),
    "_softmax.default" => functional(softmax), "_log_softmax.default" => functional(log_softmax),
    "_safe_softmax.default" => functional(safe_softmax),
    "_softmax_backward_data.default" => functional(softmax_backward),
    "_log_softmax_backward_data.default" => functional(log_softmax_backward),
    "_copy_from.default" => direct(copy_from),
    "native_layer_norm.default" => direct(native_layer_norm),
    "native_layer_norm_backward.default" => direct(native_layer_norm_backward),
    "clone.default" => functional(clone), "cat.default" => functional(cat),
    "pow.Tensor_Scalar" => functional(pow_scalar), "rsub.Scalar" => functional(rsub),
    "bitwise_and.Tensor" => functional(bitwise_and), "bitwise_and.Scalar" => functional(bitwise_and),
    "bitwise_or.Tensor" => functional(bitwise_or), "bitwise_or.Scalar" => functional(bitwise_or),
    "bitwise_xor.Tensor" => functional(bitwise_xor), "bitwise_xor.Scalar" => functional(bitwise_xor),
    "bitwise_not.default" => functional(bitwise_not),
    "threshold_backward.default" => functional(threshold_backward),
    "sigmoid_backward.default" => functional(sigmoid_backward),
    "tanh_backward.default" => functional(tanh_backward),
    "silu_backward.default" => functional(silu_backward),
    "gelu_backward.default" => functional(gelu_backward),
    "_foreach_add.Scalar" => foreach(add), "_foreach_add_.Scalar" => foreach_inplace(add),
    "_foreach_add.List" => foreach(add), "_foreach_add_.List" => foreach_inplace(add),
    "_foreach_add.ScalarList" => foreach(add), "_foreach_add_.ScalarList" => foreach_inplace(add),
    "_foreach_sub.Scalar" => foreach(sub), "_foreach_sub_.Scalar" => foreach_inplace(sub),
    "_foreach_sub.List" => foreach(sub), "_foreach_sub_.List" => foreach_inplace(sub),
    "_foreach_sub.ScalarList" => foreach(sub), "_foreach_sub_.ScalarList" => foreach_inplace(sub),
    "_foreach_mul.Scalar" => foreach(mul), "_foreach_mul_.Scalar" => foreach_inplace(mul),
    "_foreach_mul.List" => foreach(mul), "_foreach_mul_.List" => foreach_inplace(mul),
    "_foreach_mul.ScalarList" => foreach(mul), "_foreach_mul_.ScalarList" => foreach_inplace(mul),
    "_foreach_div.Scalar" => foreach(div), "_foreach_div_.Scalar" => foreach_inplace(div),
    "_foreach_div.List" => foreach(div), "_foreach_div_.List" => foreach_inplace(div),
    "_foreach_div.ScalarList" => foreach(div), "_foreach_div_.ScalarList" => foreach_inplace(div),
    "_foreach_addcmul.Scalar" => foreach(addcmul), "_foreach_addcmul_.Scalar" => foreach_inplace(addcmul),
    "_foreach_addcmul.ScalarList" => foreach(addcmul),
    "_foreach_addcmul_.ScalarList" => foreach_inplace(addcmul),
    "_foreach_addcdiv.Scalar" => foreach(addcdiv), "_foreach_addcdiv_.Scalar" => foreach_inplace(addcdiv),
    "_foreach_addcdiv.ScalarList" => foreach(addcdiv),
    "_foreach_addcdiv_.ScalarList" => foreach_inplace(addcdiv),
    "_foreach_lerp.Scalar" => foreach(lerp), "_foreach_lerp_.Scalar" => foreach_inplace(lerp),
    "_foreach_lerp.List" => foreach(lerp), "_foreach_lerp_.List" => foreach_inplace(lerp),
    "_fused_adam_.default" => direct(fused_adam_), "_fused_adam_.tensor_lr" => direct(fused_adam_),
    "_fused_adamw_.default" => direct(fused_adamw_), "_fused_adamw_.tensor_lr" => direct(fused_adamw_),
    "_fused_sgd_.default" => direct(fused_sgd_), "_fused_sgd_.tensor_lr" => direct(fused_sgd_),
    "_foreach_maximum.List" => foreach(maximum), "_foreach_maximum_.List" => foreach_inplace(maximum),
    "_foreach_maximum.Scalar" => foreach(maximum), "_foreach_maximum_.Scalar" => foreach_inplace(maximum),
    "_foreach_maximum.ScalarList" => foreach(maximum),
    "_foreach_maximum_.ScalarList" => foreach_inplace(maximum),
    "_foreach_minimum.List" => foreach(minimum), "_foreach_minimum_.List" => foreach_inplace(minimum),
    "_foreach_minimum.Scalar" => foreach(minimum), "_foreach_minimum_.Scalar" => foreach_inplace(minimum),
    "_foreach_minimum.ScalarList" => foreach(minimum),
    "_foreach_minimum_.ScalarList" => foreach_inplace(minimum),
    "_foreach_sqrt.default" => foreach(sqrt), "_foreach_sqrt_.default" => foreach_inplace(sqrt),
    "_foreach_neg.default" => foreach(neg), "_foreach_neg_.default" => foreach_inplace(neg),
    "_foreach_exp.default" => foreach(exp), "_foreach_exp_.default" => foreach_inplace(exp),
    "_foreach_abs.default" => foreach(abs), "_foreach_abs_.default" => foreach_inplace(abs),
    "_foreach_zero_.default" => foreach_inplace(zero),
}
