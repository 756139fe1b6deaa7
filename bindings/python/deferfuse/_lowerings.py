"""aten ops as engine ops. Each lowering gets the op's arguments with `tpu`
tensors replaced by engine tensors (and CPU zero-dimensional tensors by Python
numbers) and returns engine tensors. It raises `Unsupported` for arguments it
does not handle, and the op then runs through the CPU fallback.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from . import _state
from ._engine import Tensor as ET

LOWERINGS: dict[str, Callable[..., Any]] = {}


class Unsupported(Exception):
    """These arguments have no engine lowering; run the op on the CPU."""


def lower(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            LOWERINGS[name] = fn
        return fn

    return register


def eng():
    return _state.engine()


def dt(dtype: torch.dtype | None) -> str:
    from ._handles import TO_ENGINE

    if dtype not in TO_ENGINE:
        raise Unsupported(f"dtype {dtype}")
    return TO_ENGINE[dtype]


def is_float(x: Any) -> bool:
    return x.dtype in ("f32", "bf16", "f16") if isinstance(x, ET) else isinstance(x, float)


def need_tensor(*xs: Any) -> None:
    for x in xs:
        if not isinstance(x, ET):
            raise Unsupported("operand is not a tensor")


def dims(x: ET, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(len(x.shape)))
    return list(dim) if isinstance(dim, (list, tuple)) else [dim]


def as_float(x: ET) -> ET:
    return x if is_float(x) else x.cast("f32")


# ---- elementwise ------------------------------------------------------------

UNARY = {
    "abs": "abs", "neg": "neg", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "reciprocal": "reciprocal", "tanh": "tanh", "sigmoid": "sigmoid", "relu": "relu", "silu": "silu",
    "sin": "sin", "cos": "cos", "floor": "floor", "sign": "sign", "sgn": "sign", "logical_not": "logical_not",
}
for _aten, _name in UNARY.items():
    LOWERINGS[f"{_aten}.default"] = (lambda name: lambda self: self.unary(name))(_name)


def _float_unary(x: ET) -> ET:
    return x if is_float(x) else x.cast("f32")


@lower("gelu.default")
def gelu(self: ET, approximate: str = "none") -> ET:
    return self.unary("gelu_tanh" if approximate == "tanh" else "gelu")


@lower("square.default")
def square(self: ET) -> ET:
    return self.binary("mul", self) if self.dtype != "bool" else self.cast("i64").binary("mul", self.cast("i64"))


@lower("ceil.default")
def ceil(self: ET) -> ET:
    return self.unary("neg").unary("floor").unary("neg") if is_float(self) else self


@lower("trunc.default", "fix.default")
def trunc(self: ET) -> ET:
    return self.unary("sign").binary("mul", self.unary("abs").unary("floor")) if is_float(self) else self


@lower("frac.default")
def frac(self: ET) -> ET:
    return self.binary("sub", trunc(self))


@lower("log2.default")
def log2(self: ET) -> ET:
    return _float_unary(self).unary("log").binary("mul", 1.0 / math.log(2.0))


@lower("log10.default")
def log10(self: ET) -> ET:
    return _float_unary(self).unary("log").binary("mul", 1.0 / math.log(10.0))


@lower("tan.default")
def tan(self: ET) -> ET:
    x = _float_unary(self)
    return x.unary("sin").binary("div", x.unary("cos"))


@lower("exp2.default")
def exp2(self: ET) -> ET:
    return _float_unary(self).binary("mul", math.log(2.0)).unary("exp")


@lower("isnan.default")
def isnan(self: ET) -> ET:
    return self.binary("ne", self) if is_float(self) else eng().full(0.0, list(self.shape), "bool")


@lower("isinf.default")
def isinf(self: ET) -> ET:
    return self.unary("abs").binary("eq", float("inf")) if is_float(self) else eng().full(0.0, list(self.shape), "bool")


@lower("isposinf.default")
def isposinf(self: ET) -> ET:
    return self.binary("eq", float("inf")) if is_float(self) else eng().full(0.0, list(self.shape), "bool")


@lower("isneginf.default")
def isneginf(self: ET) -> ET:
    return self.binary("eq", float("-inf")) if is_float(self) else eng().full(0.0, list(self.shape), "bool")


@lower("positive.default")
def positive(self: ET) -> ET:
    return self


def _alpha(other: Any, alpha: Any) -> Any:
    if alpha is None or alpha == 1:
        return other
    if isinstance(other, ET):
        return other.binary("mul", alpha)
    return other * alpha




@lower("sub.Tensor", "sub.Scalar")
def sub(self: Any, other: Any, alpha: Any = 1) -> ET:
    need_tensor(self)
    if self.dtype == "bool":
        raise Unsupported("bool subtraction")
    return self.binary("sub", _alpha(other, alpha))


@lower("rsub.Tensor", "rsub.Scalar")
def rsub(self: Any, other: Any, alpha: Any = 1) -> ET:
    need_tensor(self)
    scaled = _alpha(self, alpha)
    if isinstance(other, ET):
        return other.binary("sub", scaled)
    return scaled.unary("neg").binary("add", other)


BINARY = {
    "mul": "mul", "maximum": "maximum", "minimum": "minimum", "eq": "eq", "ne": "ne", "lt": "lt", "le": "le",
    "gt": "gt", "ge": "ge", "logical_and": "logical_and", "logical_or": "logical_or",
    "greater": "gt", "less": "lt", "greater_equal": "ge", "less_equal": "le", "not_equal": "ne",
}


# PyTorch computes these on bool tensors as logical ops; the engine asks for them by name.
BOOL_AS_LOGICAL = {"mul": "logical_and", "maximum": "logical_or", "minimum": "logical_and"}


def _is_bool(x: Any) -> bool:
    return x.dtype == "bool" if isinstance(x, ET) else isinstance(x, bool)


def _binary(name: str) -> Callable[..., ET]:
    def run(self: Any, other: Any) -> ET:
        if name in BOOL_AS_LOGICAL and _is_bool(self) and _is_bool(other):
            return logical(BOOL_AS_LOGICAL[name], self, other)
        if not isinstance(self, ET):
            need_tensor(other)
            if name in ("mul", "maximum", "minimum", "eq", "ne", "logical_and", "logical_or"):
                return other.binary(name, self)
            raise Unsupported("scalar left operand")
        return self.binary(name, other)

    return run


for _aten, _name in BINARY.items():
    LOWERINGS[f"{_aten}.Tensor"] = LOWERINGS[f"{_aten}.Scalar"] = LOWERINGS[f"{_aten}.default"] = _binary(_name)


def logical(name: str, a: Any, b: Any) -> ET:
    if not isinstance(a, ET):
        a, b = b, a
    return a.binary(name, b)


def _bitwise(name: str) -> Callable[..., ET]:
    def run(self: Any, other: Any) -> ET:
        if not (_is_bool(self) and _is_bool(other)):
            raise Unsupported("bitwise ops on integers")
        return logical_xor(self, other) if name == "xor" else logical(f"logical_{name}", self, other)

    return run


for _name in ("and", "or", "xor"):
    LOWERINGS[f"bitwise_{_name}.Tensor"] = LOWERINGS[f"bitwise_{_name}.Scalar"] = _bitwise(_name)


@lower("add.Tensor", "add.Scalar")
def add(self: Any, other: Any, alpha: Any = 1) -> ET:
    need_tensor(self)
    if _is_bool(self) and _is_bool(other):
        return logical("logical_or", self, other)
    return self.binary("add", _alpha(other, alpha))


@lower("logical_xor.default")
def logical_xor(self: ET, other: Any) -> ET:
    a = self.cast("bool")
    b = other.cast("bool") if isinstance(other, ET) else bool(other)
    return a.binary("ne", b)


@lower("div.Tensor", "div.Scalar")
def div(self: Any, other: Any) -> ET:
    need_tensor(self)
    return self.binary("div", other)


@lower("div.Tensor_mode", "div.Scalar_mode")
def div_mode(self: Any, other: Any, *, rounding_mode: str | None = None) -> ET:
    need_tensor(self)
    q = self.binary("div", other)
    if rounding_mode is None:
        return q
    if not is_float(self) or (isinstance(other, ET) and not is_float(other)) or isinstance(other, int):
        raise Unsupported("integer division with rounding")
    return q.unary("floor") if rounding_mode == "floor" else trunc(q)


@lower("remainder.Tensor", "remainder.Scalar")
def remainder(self: Any, other: Any) -> ET:
    need_tensor(self)
    if not is_float(self):
        raise Unsupported("integer remainder")
    return self.binary("sub", self.binary("div", other).unary("floor").binary("mul", other))


@lower("fmod.Tensor", "fmod.Scalar")
def fmod(self: Any, other: Any) -> ET:
    need_tensor(self)
    if not is_float(self):
        raise Unsupported("integer fmod")
    return self.binary("sub", trunc(self.binary("div", other)).binary("mul", other))


@lower("pow.Tensor_Tensor", "pow.Tensor_Scalar")
def pow_(self: ET, exponent: Any) -> ET:
    if exponent == 2 and not isinstance(exponent, ET):
        return self.binary("mul", self) if self.dtype != "bool" else pow_(self.cast("i64"), 2)
    if not isinstance(exponent, ET) and not is_float(self) and (isinstance(exponent, float) or exponent < 0):
        raise Unsupported("integer base with a fractional or negative exponent")
    return self.binary("pow", exponent)


@lower("pow.Scalar")
def pow_scalar(self: Any, exponent: ET) -> ET:
    dtype = "f32" if isinstance(self, float) and not is_float(exponent) else exponent.dtype
    if not is_float(exponent) and not isinstance(self, float):
        raise Unsupported("integer power of a scalar")
    return eng().full(float(self), [], dtype).binary("pow", exponent)


@lower("where.self")
def where(condition: ET, self: Any, other: Any) -> ET:
    need_tensor(condition)
    return condition.where_(self, other)


@lower("where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def where_scalar(condition: ET, self: Any, other: Any) -> ET:
    return where(condition, self, other)


@lower("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(self: ET, mask: ET, value: Any) -> ET:
    if isinstance(value, ET):
        value = value.cast(self.dtype)
    out = mask.where_(value, self)
    return out.cast(self.dtype) if out.dtype != self.dtype else out


@lower("clamp.default", "clip.default")
def clamp(self: ET, min: Any = None, max: Any = None) -> ET:
    out = self
    if min is not None:
        out = out.binary("maximum", min)
    if max is not None:
        out = out.binary("minimum", max)
    return out


@lower("clamp.Tensor", "clip.Tensor")
def clamp_tensor(self: ET, min: Any = None, max: Any = None) -> ET:
    return clamp(self, min, max)


@lower("clamp_min.default")
def clamp_min(self: ET, min: Any) -> ET:
    return self.binary("maximum", min)


@lower("clamp_max.default")
def clamp_max(self: ET, max: Any) -> ET:
    return self.binary("minimum", max)


@lower("hardtanh.default")
def hardtanh(self: ET, min_val: float = -1.0, max_val: float = 1.0) -> ET:
    return clamp(self, min_val, max_val)


@lower("relu6.default")
def relu6(self: ET) -> ET:
    return clamp(self, 0, 6)


@lower("leaky_relu.default")
def leaky_relu(self: ET, negative_slope: float = 0.01) -> ET:
    return self.binary("gt", 0).where_(self, self.binary("mul", negative_slope))


@lower("elu.default")
def elu(self: ET, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> ET:
    neg = self.binary("mul", input_scale).unary("exp").binary("sub", 1.0).binary("mul", alpha)
    return self.binary("gt", 0).where_(self, neg).binary("mul", scale)


@lower("hardsigmoid.default")
def hardsigmoid(self: ET) -> ET:
    return clamp(self.binary("div", 6.0).binary("add", 0.5), 0.0, 1.0)


@lower("hardswish.default")
def hardswish(self: ET) -> ET:
    return self.binary("mul", hardsigmoid(self))


@lower("softplus.default")
def softplus(self: ET, beta: float = 1.0, threshold: float = 20.0) -> ET:
    bx = self.binary("mul", beta)
    soft = bx.unary("exp").binary("add", 1.0).unary("log").binary("div", beta)
    return bx.binary("gt", threshold).where_(self, soft)


@lower("lerp.Scalar", "lerp.Tensor")
def lerp(self: ET, end: ET, weight: Any) -> ET:
    return self.binary("add", end.binary("sub", self).binary("mul", weight))


@lower("addcmul.default")
def addcmul(self: ET, tensor1: ET, tensor2: ET, value: Any = 1) -> ET:
    return self.binary("add", _alpha(tensor1.binary("mul", tensor2), value))


@lower("addcdiv.default")
def addcdiv(self: ET, tensor1: ET, tensor2: ET, value: Any = 1) -> ET:
    if not is_float(tensor1) and not is_float(tensor2):
        raise Unsupported("integer addcdiv")
    return self.binary("add", _alpha(tensor1.binary("div", tensor2), value))


# ---- activation gradients (what autograd calls) ------------------------------


@lower("threshold_backward.default")
def threshold_backward(grad_output: ET, self: ET, threshold: Any) -> ET:
    return self.binary("gt", threshold).where_(grad_output, 0)


@lower("threshold.default")
def threshold(self: ET, threshold: Any, value: Any) -> ET:
    return self.binary("gt", threshold).where_(self, value).cast(self.dtype)


@lower("sigmoid_backward.default")
def sigmoid_backward(grad_output: ET, output: ET) -> ET:
    return grad_output.binary("mul", output.binary("mul", output.unary("neg").binary("add", 1.0)))


@lower("tanh_backward.default")
def tanh_backward(grad_output: ET, output: ET) -> ET:
    return grad_output.binary("mul", output.binary("mul", output).unary("neg").binary("add", 1.0))


@lower("silu_backward.default")
def silu_backward(grad_output: ET, self: ET) -> ET:
    s = self.unary("sigmoid")
    return grad_output.binary("mul", s.binary("mul", self.binary("mul", s.unary("neg").binary("add", 1.0)).binary("add", 1.0)))


@lower("gelu_backward.default")
def gelu_backward(grad_output: ET, self: ET, approximate: str = "none") -> ET:
    x = self
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        inner = x.binary("add", x.binary("mul", x).binary("mul", x).binary("mul", 0.044715)).binary("mul", k)
        t = inner.unary("tanh")
        dinner = x.binary("mul", x).binary("mul", 3 * 0.044715).binary("add", 1.0).binary("mul", k)
        d = t.binary("add", 1.0).binary("mul", 0.5).binary(
            "add", x.binary("mul", 0.5).binary("mul", t.binary("mul", t).unary("neg").binary("add", 1.0)).binary("mul", dinner)
        )
        return grad_output.binary("mul", d)
    # d/dx x*Phi(x) = Phi(x) + x*phi(x); Phi(x) = gelu(x)/x away from 0, 1/2 at 0.
    pdf = x.binary("mul", x).binary("mul", -0.5).unary("exp").binary("mul", 1.0 / math.sqrt(2.0 * math.pi))
    safe = x.binary("eq", 0).where_(1.0, x)
    cdf = x.binary("eq", 0).where_(0.5, x.unary("gelu").binary("div", safe))
    return grad_output.binary("mul", cdf.binary("add", x.binary("mul", pdf)))


# ---- reductions ---------------------------------------------------------------


def _reduce_dtype(x: ET, dtype: torch.dtype | None) -> ET:
    return x.cast(dt(dtype)) if dtype is not None else x


@lower("sum.default")
def sum_all(self: ET, *, dtype: torch.dtype | None = None) -> ET:
    return _reduce_dtype(self, dtype).reduce("sum", dims(self, None), False)


@lower("sum.dim_IntList")
def sum_dim(self: ET, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> ET:
    if len(self.shape) == 0:
        return _reduce_dtype(self, dtype).reduce("sum", [], False)
    return _reduce_dtype(self, dtype).reduce("sum", dims(self, dim), keepdim)


@lower("mean.default")
def mean_all(self: ET, *, dtype: torch.dtype | None = None) -> ET:
    return _reduce_dtype(self, dtype).reduce("mean", dims(self, None), False)


@lower("mean.dim")
def mean_dim(self: ET, dim: Any, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> ET:
    if len(self.shape) == 0:
        return _reduce_dtype(self, dtype).reduce("mean", [], False)
    return _reduce_dtype(self, dtype).reduce("mean", dims(self, dim), keepdim)


@lower("prod.default")
def prod_all(self: ET, *, dtype: torch.dtype | None = None) -> ET:
    _nonempty(self, "prod")
    return _reduce_dtype(self, dtype).reduce("prod", dims(self, None), False)


@lower("prod.dim_int")
def prod_dim(self: ET, dim: int, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> ET:
    _nonempty(self, "prod")
    if len(self.shape) == 0:
        return _reduce_dtype(self, dtype).reduce("prod", [], False)
    return _reduce_dtype(self, dtype).reduce("prod", [dim], keepdim)


def _nonempty(x: ET, what: str) -> None:
    if math.prod(x.shape) == 0:
        raise Unsupported(f"{what} of an empty tensor")


@lower("amax.default")
def amax(self: ET, dim: Any = (), keepdim: bool = False) -> ET:
    _nonempty(self, "amax")
    if self.dtype == "bool":
        return amax(self.cast("i32"), dim, keepdim).cast("bool")
    return self.reduce("max", dims(self, dim) if len(self.shape) else [], keepdim)


@lower("amin.default")
def amin(self: ET, dim: Any = (), keepdim: bool = False) -> ET:
    _nonempty(self, "amin")
    if self.dtype == "bool":
        return amin(self.cast("i32"), dim, keepdim).cast("bool")
    return self.reduce("min", dims(self, dim) if len(self.shape) else [], keepdim)


@lower("max.default")
def max_all(self: ET) -> ET:
    return amax(self)


@lower("min.default")
def min_all(self: ET) -> ET:
    return amin(self)


@lower("max.dim")
def max_dim(self: ET, dim: int, keepdim: bool = False) -> tuple[ET, ET]:
    if len(self.shape) == 0 or self.dtype == "bool":
        raise Unsupported("max.dim of a zero-dimensional or bool tensor")
    _nonempty(self, "max")
    return self.reduce("max", [dim], keepdim), self.arg_reduce("argmax", dim, keepdim)


@lower("min.dim")
def min_dim(self: ET, dim: int, keepdim: bool = False) -> tuple[ET, ET]:
    if len(self.shape) == 0 or self.dtype == "bool":
        raise Unsupported("min.dim of a zero-dimensional or bool tensor")
    _nonempty(self, "min")
    return self.reduce("min", [dim], keepdim), self.arg_reduce("argmin", dim, keepdim)


@lower("argmax.default")
def argmax(self: ET, dim: int | None = None, keepdim: bool = False) -> ET:
    if len(self.shape) == 0 or self.dtype == "bool" or (dim is None and keepdim):
        raise Unsupported("argmax of a zero-dimensional or bool tensor, or with keepdim and no dim")
    _nonempty(self, "argmax")
    return self.arg_reduce("argmax", dim, keepdim)


@lower("argmin.default")
def argmin(self: ET, dim: int | None = None, keepdim: bool = False) -> ET:
    if len(self.shape) == 0 or self.dtype == "bool" or (dim is None and keepdim):
        raise Unsupported("argmin of a zero-dimensional or bool tensor, or with keepdim and no dim")
    _nonempty(self, "argmin")
    return self.arg_reduce("argmin", dim, keepdim)


@lower("any.default", "any.dim", "any.dims")
def any_(self: ET, dim: Any = None, keepdim: bool = False) -> ET:
    if math.prod(self.shape) == 0:
        raise Unsupported("any of an empty tensor")
    axes = dims(self, dim) if len(self.shape) else []
    return self.cast("bool").cast("i32").reduce("max", axes, keepdim).cast("bool")


@lower("all.default", "all.dim", "all.dims")
def all_(self: ET, dim: Any = None, keepdim: bool = False) -> ET:
    if math.prod(self.shape) == 0:
        raise Unsupported("all of an empty tensor")
    axes = dims(self, dim) if len(self.shape) else []
    return self.cast("bool").cast("i32").reduce("min", axes, keepdim).cast("bool")


@lower("var.correction", "std.correction")
def var_std(self: ET, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> ET:
    raise Unsupported("handled by _var_std")


def _var(self: ET, dim: Any, correction: Any, keepdim: bool) -> ET:
    if not is_float(self) or len(self.shape) == 0:
        raise Unsupported("var of a non-float or zero-dimensional tensor")
    axes = dims(self, dim)
    n = math.prod(self.shape[a] for a in axes)
    c = 1 if correction is None else correction
    if n - c <= 0:
        raise Unsupported("var with too few elements")
    centered = self.binary("sub", self.reduce("mean", axes, True))
    return centered.binary("mul", centered).reduce("sum", axes, keepdim).binary("div", float(n - c))


LOWERINGS["var.correction"] = lambda self, dim=None, *, correction=None, keepdim=False: _var(self, dim, correction, keepdim)
LOWERINGS["std.correction"] = lambda self, dim=None, *, correction=None, keepdim=False: _var(self, dim, correction, keepdim).unary("sqrt")


@lower("logsumexp.default")
def logsumexp(self: ET, dim: Any, keepdim: bool = False) -> ET:
    x = as_float(self)
    if len(x.shape) == 0 or math.prod(x.shape) == 0:
        raise Unsupported("logsumexp of a zero-dimensional or empty tensor")
    axes = dims(x, dim)
    m = x.reduce("max", axes, True)
    # An infinite maximum would make x - m NaN; shift by 0 there instead.
    m = m.unary("abs").binary("eq", float("inf")).where_(0.0, m)
    total = x.binary("sub", m).unary("exp").reduce("sum", axes, keepdim).unary("log")
    return total.binary("add", m if keepdim else m.reduce("max", axes, False))


@lower("linalg_vector_norm.default")
def vector_norm(self: ET, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> ET:
    if not is_float(self):
        raise Unsupported("norm of a non-float tensor")
    x = self.cast(dt(dtype)) if dtype is not None else self
    if len(x.shape) == 0:
        x, axes = x.reshape([1]), [0]
        keepdim = False
    else:
        axes = dims(x, dim)
    if math.prod(x.shape) == 0 and ord in (float("inf"), float("-inf")):
        raise Unsupported("max-norm of an empty tensor")
    a = x.unary("abs")
    if ord == float("inf"):
        return a.reduce("max", axes, keepdim)
    if ord == float("-inf"):
        return a.reduce("min", axes, keepdim)
    if ord == 0:
        return a.binary("ne", 0).cast(x.dtype).reduce("sum", axes, keepdim)
    if ord == 1:
        return a.reduce("sum", axes, keepdim)
    if ord == 2:
        return x.binary("mul", x).reduce("sum", axes, keepdim).unary("sqrt")
    if ord < 0:
        raise Unsupported("negative norm orders")
    return a.binary("pow", float(ord)).reduce("sum", axes, keepdim).binary("pow", 1.0 / float(ord))


# ---- matrix products ------------------------------------------------------------


def _mm_check(a: ET, b: ET) -> None:
    if a.dtype != b.dtype or not is_float(a):
        raise Unsupported("matmul of mixed or integer dtypes")


@lower("mm.default", "bmm.default")
def mm(self: ET, mat2: ET) -> ET:
    _mm_check(self, mat2)
    return self.matmul(mat2)


@lower("dot.default", "mv.default")
def dot(self: ET, tensor: ET) -> ET:
    _mm_check(self, tensor)
    return self.matmul(tensor)


@lower("addmm.default", "baddbmm.default")
def addmm(self: ET, mat1: ET, mat2: ET, *, beta: Any = 1, alpha: Any = 1) -> ET:
    _mm_check(mat1, mat2)
    prod = _alpha(mat1.matmul(mat2), alpha)
    if beta == 0:
        return prod
    return prod.binary("add", _alpha(self, beta))


@lower("addmv.default")
def addmv(self: ET, mat: ET, vec: ET, *, beta: Any = 1, alpha: Any = 1) -> ET:
    return addmm(self, mat, vec, beta=beta, alpha=alpha)


# ---- softmax and normalization ----------------------------------------------


@lower("_softmax.default")
def softmax(self: ET, dim: int, half_to_float: bool) -> ET:
    x = self.cast("f32") if half_to_float else self
    return x.softmax(dim) if len(x.shape) else x.binary("mul", 0).binary("add", 1.0)


@lower("_log_softmax.default")
def log_softmax(self: ET, dim: int, half_to_float: bool) -> ET:
    x = self.cast("f32") if half_to_float else self
    return x.log_softmax(dim) if len(x.shape) else x.binary("mul", 0)


@lower("_softmax_backward_data.default")
def softmax_backward(grad_output: ET, output: ET, dim: int, input_dtype: torch.dtype) -> ET:
    g = grad_output.binary("mul", output)
    out = g.binary("sub", output.binary("mul", g.reduce("sum", [dim], True)) if len(output.shape) else g)
    return out.cast(dt(input_dtype))


@lower("_log_softmax_backward_data.default")
def log_softmax_backward(grad_output: ET, output: ET, dim: int, input_dtype: torch.dtype) -> ET:
    total = grad_output.reduce("sum", [dim], True) if len(output.shape) else grad_output
    return grad_output.binary("sub", output.unary("exp").binary("mul", total)).cast(dt(input_dtype))


def _norm_axes(x: ET, normalized_shape: Any) -> list[int]:
    n = len(normalized_shape)
    if n == 0 or n > len(x.shape) or list(x.shape[len(x.shape) - n :]) != list(normalized_shape):
        raise Unsupported("normalized_shape does not match")
    return list(range(len(x.shape) - n, len(x.shape)))


@lower("native_layer_norm.default")
def native_layer_norm(input: ET, normalized_shape: Any, weight: ET | None, bias: ET | None, eps: float) -> tuple[ET, ET, ET]:
    if not is_float(input) or math.prod(input.shape) == 0:
        raise Unsupported("layer_norm of a non-float or empty tensor")
    axes = _norm_axes(input, normalized_shape)
    x = input.cast("f32")
    mean = x.reduce("mean", axes, True)
    centered = x.binary("sub", mean)
    rstd = centered.binary("mul", centered).reduce("mean", axes, True).binary("add", eps).unary("rsqrt")
    y = centered.binary("mul", rstd)
    if weight is not None:
        y = y.binary("mul", weight.cast("f32"))
    if bias is not None:
        y = y.binary("add", bias.cast("f32"))
    return y.cast(input.dtype), mean.cast(input.dtype), rstd.cast(input.dtype)


@lower("native_layer_norm_backward.default")
def native_layer_norm_backward(
    grad_out: ET, input: ET, normalized_shape: Any, mean: ET, rstd: ET, weight: ET | None, bias: ET | None, output_mask: Any
) -> tuple[Any, Any, Any]:
    axes = _norm_axes(input, normalized_shape)
    batch = list(range(len(input.shape) - len(axes)))
    x, g = input.cast("f32"), grad_out.cast("f32")
    xhat = x.binary("sub", mean.cast("f32")).binary("mul", rstd.cast("f32"))
    gw = g.binary("mul", weight.cast("f32")) if weight is not None else g
    dx = None
    if output_mask[0]:
        a = gw.reduce("mean", axes, True)
        b = gw.binary("mul", xhat).reduce("mean", axes, True)
        dx = gw.binary("sub", a).binary("sub", xhat.binary("mul", b)).binary("mul", rstd.cast("f32")).cast(input.dtype)
    dw = g.binary("mul", xhat).reduce("sum", batch, False).cast(weight.dtype) if output_mask[1] and weight is not None else None
    db = g.reduce("sum", batch, False).cast(bias.dtype) if output_mask[2] and bias is not None else None
    return dx, dw, db


# ---- layout and construction ----------------------------------------------


@lower("cat.default")
def cat(tensors: list[Any], dim: int = 0) -> ET:
    parts = [t for t in tensors if isinstance(t, ET) and not (len(t.shape) == 1 and t.shape[0] == 0)]
    if len(parts) != len([t for t in tensors if isinstance(t, ET)]) or not parts:
        if not parts:
            raise Unsupported("cat of empty tensors only")
    if any(not isinstance(t, ET) for t in tensors):
        raise Unsupported("cat of mixed operands")
    return eng().cat(parts, dim)


def _tril_mask(shape: list[int], diagonal: int, lower_tri: bool) -> ET:
    rows, cols = shape[-2], shape[-1]
    r = eng().arange(0, rows, 1, "i64").reshape([rows, 1])
    c = eng().arange(0, cols, 1, "i64").reshape([1, cols])
    d = c.binary("sub", r)
    return d.binary("le", diagonal) if lower_tri else d.binary("ge", diagonal)


@lower("tril.default")
def tril(self: ET, diagonal: int = 0) -> ET:
    if len(self.shape) < 2:
        raise Unsupported("tril needs two dimensions")
    return _tril_mask(list(self.shape), diagonal, True).where_(self, eng().full(0.0, [], self.dtype))


@lower("triu.default")
def triu(self: ET, diagonal: int = 0) -> ET:
    if len(self.shape) < 2:
        raise Unsupported("triu needs two dimensions")
    return _tril_mask(list(self.shape), diagonal, False).where_(self, eng().full(0.0, [], self.dtype))


def constant(value: float, shape: list[int], dtype: str) -> ET:
    """A filled tensor. Debug mode checks every op's output for NaN and Inf, so
    a non-finite constant the program asks for (an attention mask's -inf) is
    uploaded as data instead of computed by an op."""
    if not math.isfinite(value) and _state.get_mode() == "debug":
        from ._handles import TO_TORCH, from_cpu_value

        return from_cpu_value(torch.full(shape, value, dtype=TO_TORCH[dtype]))
    return eng().full(value, shape, dtype)


def _factory_dtype(dtype: torch.dtype | None, default: torch.dtype) -> str:
    return dt(dtype if dtype is not None else default)


@lower("full.default")
def full(size: Any, fill_value: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> ET:
    if dtype is None:
        dtype = torch.bool if isinstance(fill_value, bool) else torch.int64 if isinstance(fill_value, int) else torch.get_default_dtype()
    return constant(float(fill_value), list(size), _factory_dtype(dtype, dtype))


@lower("scalar_tensor.default")
def scalar_tensor(s: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> ET:
    return constant(float(s), [], _factory_dtype(dtype, torch.get_default_dtype()))


@lower("empty.memory_format")
def empty(size: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None, memory_format: Any = None) -> ET:
    return eng().full(0.0, list(size), _factory_dtype(dtype, torch.get_default_dtype()))


@lower("empty_strided.default")
def empty_strided(size: Any, stride: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> ET:
    return empty(size, dtype=dtype)


def _arange(start: Any, end: Any, step: Any, dtype: Any) -> ET:
    if dtype is None:
        dtype = torch.int64 if all(isinstance(v, int) for v in (start, end, step)) else torch.get_default_dtype()
    name = dt(dtype)
    if name != "i64" and any(isinstance(v, float) for v in (start, end, step)) and name != "f32":
        raise Unsupported("low-precision float arange")
    return eng().arange(float(start), float(end), float(step), name)


@lower("arange.default")
def arange(end: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> ET:
    return _arange(0, end, 1, dtype)


@lower("arange.start")
def arange_start(start: Any, end: Any, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> ET:
    return _arange(start, end, 1, dtype)


@lower("arange.start_step")
def arange_start_step(start: Any, end: Any, step: Any = 1, *, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None) -> ET:
    return _arange(start, end, step, dtype)


@lower("fill.Scalar")
def fill(self: ET, value: Any) -> ET:
    return constant(float(value), list(self.shape), self.dtype)


@lower("fill.Tensor")
def fill_tensor(self: ET, value: ET) -> ET:
    if len(value.shape) != 0:
        raise Unsupported("fill with a tensor that has dimensions")
    return value.cast(self.dtype).expand(list(self.shape))


@lower("zero.default")
def zero(self: ET) -> ET:
    return eng().full(0.0, list(self.shape), self.dtype)


@lower("clone.default")
def clone(self: ET, *, memory_format: Any = None) -> ET:
    # Engine values are immutable (a write replaces a root's value), so the
    # clone may share the value.
    return self


# ---- pooling -----------------------------------------------------------------


def _pool_param(value: Any, n: int, default: Any) -> list[int]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    return values * n if len(values) == 1 else values


def _max_pool(self: ET, n: int, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool) -> tuple[ET, ET]:
    """Max pooling as the maximum over the k^n strided slices of a padded
    input, with PyTorch's index (first maximum wins, NaN wins) into each
    input plane."""
    if not is_float(self) or len(self.shape) not in (n + 1, n + 2) or math.prod(self.shape) == 0:
        raise Unsupported("max pooling of a non-float or empty tensor")
    k = _pool_param(kernel_size, n, None)
    s = _pool_param(stride, n, k)
    p = _pool_param(padding, n, 0)
    d = _pool_param(dilation, n, 1)
    spatial = list(self.shape[-n:])
    out_sizes = []
    for size, kk, ss, pp, dd in zip(spatial, k, s, p, d):
        span = size + 2 * pp - dd * (kk - 1) - 1
        o = (-(-span // ss) if ceil_mode else span // ss) + 1
        if ceil_mode and (o - 1) * ss >= size + pp:
            o -= 1
        if o <= 0 or pp > kk // 2:
            raise Unsupported("pooling window larger than the input")
        out_sizes.append(o)
    x = self
    rank = len(self.shape)
    for axis, (size, kk, ss, pp, dd, o) in enumerate(zip(spatial, k, s, p, d, out_sizes)):
        dim = rank - n + axis
        need = (o - 1) * ss + dd * (kk - 1) + 1
        right = need - size - pp
        parts = []
        if pp:
            shape = list(x.shape)
            shape[dim] = pp
            parts.append(eng().full(float("-inf"), shape, x.dtype))
        parts.append(x if right >= 0 else x.slice(dim, 0, size + right, 1))
        if right > 0:
            shape = list(x.shape)
            shape[dim] = right
            parts.append(eng().full(float("-inf"), shape, x.dtype))
        if len(parts) > 1:
            x = eng().cat(parts, dim)
    # Flat index of each window element in its input plane, per kernel offset.
    plane = 1
    strides_in_plane = []
    for size in reversed(spatial):
        strides_in_plane.append(plane)
        plane *= size
    strides_in_plane.reverse()
    best = best_index = None
    for offset in _offsets(k):
        window = x
        index = None
        for axis, (o, kk, ss, pp, dd, off) in enumerate(zip(out_sizes, k, s, p, d, offset)):
            dim = rank - n + axis
            start = off * dd
            window = window.slice(dim, start, start + (o - 1) * ss + 1, ss)
            shape = [1] * n
            shape[axis] = o
            coord = eng().arange(0, o, 1, "i64").binary("mul", ss).binary("add", off * dd - pp).reshape(shape)
            term = coord.binary("mul", strides_in_plane[axis])
            index = term if index is None else index.binary("add", term)
        if best is None:
            best, best_index = window, index.expand(list(window.shape))
            continue
        take = window.binary("gt", best).binary("logical_or", window.binary("ne", window))
        best = take.where_(window, best)
        best_index = take.where_(index, best_index)
    return best, best_index


def _offsets(k: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for kk in k:
        out = [o + (i,) for o in out for i in range(kk)]
    return out


@lower("max_pool2d_with_indices.default")
def max_pool2d_with_indices(self: ET, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple[ET, ET]:
    return _max_pool(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lower("max_pool3d_with_indices.default")
def max_pool3d_with_indices(self: ET, kernel_size: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple[ET, ET]:
    return _max_pool(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


# ---- gathers as masked sums -------------------------------------------------
#
# The engine has no gather, so a lookup is written as a masked sum: for every
# candidate position, `where(index == position, value, 0)`, summed over the
# positions. It is exact (one term is non-zero; `where` keeps an infinite or
# NaN table entry out of the others), but costs as many elements as
# lookups x candidates, so larger ones stay on the CPU.

ONE_HOT_LIMIT = 1 << 22


def _one_hot(index: ET, n: int) -> ET:
    """`index[..., None] == arange(n)`: a bool mask with a trailing axis of n."""
    return index.reshape(list(index.shape) + [1]).binary("eq", eng().arange(0, n, 1, "i64"))


def _check_size(lookups: int, candidates: int, rest: int = 1) -> None:
    if lookups * candidates * rest > ONE_HOT_LIMIT:
        raise Unsupported("a lookup too large for a masked sum")


def _move_last(x: ET, dim: int) -> ET:
    rank = len(x.shape)
    perm = [a for a in range(rank) if a != dim] + [dim]
    return x if dim == rank - 1 else x.permute(perm)


def _move_back(x: ET, dim: int) -> ET:
    rank = len(x.shape)
    if dim == rank - 1:
        return x
    perm = list(range(rank - 1))
    perm.insert(dim, rank - 1)
    return x.permute(perm)


@lower("index_select.default")
def index_select(self: ET, dim: int, index: ET) -> ET:
    if len(self.shape) == 0 or len(index.shape) > 1 or index.dtype not in ("i64", "i32") or math.prod(self.shape) == 0:
        raise Unsupported("index_select of a zero-dimensional or empty tensor")
    dim %= len(self.shape)
    n, m = self.shape[dim], math.prod(index.shape)
    rest = math.prod(self.shape) // n
    _check_size(m, n, rest)
    idx = index.reshape([m]).cast("i64")
    idx = idx.binary("lt", 0).where_(idx.binary("add", n), idx)
    x = _move_last(self, dim)  # [..., n]
    mask = _one_hot(idx, n)  # [m, n]
    picked = mask.where_(x.reshape(list(x.shape[:-1]) + [1, n]), eng().full(0.0, [], self.dtype)).reduce("sum", [-1], False)
    return _move_back(picked.cast(self.dtype), dim)


@lower("embedding.default")
def embedding(weight: ET, indices: ET, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False) -> ET:
    if len(weight.shape) != 2:
        raise Unsupported("embedding with a table that is not a matrix")
    flat = index_select(weight, 0, indices.reshape([math.prod(indices.shape)]))
    return flat.reshape(list(indices.shape) + [weight.shape[1]])


@lower("embedding_dense_backward.default")
def embedding_dense_backward(grad_output: ET, indices: ET, num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> ET:
    if scale_grad_by_freq:
        raise Unsupported("scale_grad_by_freq")
    t = math.prod(indices.shape)
    d = grad_output.shape[-1]
    _check_size(t, num_weights, d)
    idx = indices.reshape([t]).cast("i64")
    g = grad_output.reshape([t, d])
    keep = idx.binary("ne", padding_idx) if padding_idx >= 0 else None
    mask = _one_hot(idx, num_weights)  # [t, V]
    if keep is not None:
        mask = mask.binary("logical_and", keep.reshape([t, 1]))
    # grad_weight[v, :] = sum over tokens with index v of g[token, :]
    contrib = mask.reshape([t, num_weights, 1]).where_(g.reshape([t, 1, d]), eng().full(0.0, [], g.dtype))
    return contrib.reduce("sum", [0], False)


@lower("gather.default")
def gather(self: ET, dim: int, index: ET, *, sparse_grad: bool = False) -> ET:
    if len(self.shape) == 0 or len(index.shape) != len(self.shape) or math.prod(index.shape) == 0:
        raise Unsupported("gather of zero-dimensional or empty tensors")
    dim %= len(self.shape)
    n = self.shape[dim]
    _check_size(math.prod(index.shape), n)
    x = self
    for axis, (size, want) in enumerate(zip(self.shape, index.shape)):
        if axis != dim and want < size:
            x = x.slice(axis, 0, want, 1)
    x = _move_last(x, dim)  # [..., n]
    idx = _move_last(index.cast("i64"), dim)  # [..., m]
    mask = _one_hot(idx, n)  # [..., m, n]
    picked = mask.where_(x.reshape(list(x.shape[:-1]) + [1, n]), eng().full(0.0, [], self.dtype)).reduce("sum", [-1], False)
    return _move_back(picked.cast(self.dtype), dim)


def _nll_parts(self: ET, target: ET, weight: ET | None, ignore_index: int) -> tuple[ET, ET, ET]:
    """The one-hot mask of the targets (ignored ones all false) and each
    sample's weight."""
    if len(self.shape) != 2 or len(target.shape) != 1 or not is_float(self):
        raise Unsupported("nll_loss beyond [N, C] inputs")
    n, c = self.shape
    _check_size(n, c)
    t = target.cast("i64")
    mask = _one_hot(t, c).binary("logical_and", t.binary("ne", ignore_index).reshape([n, 1]))
    w = weight.reshape([1, c]) if weight is not None else eng().full(1.0, [1, c], self.dtype)
    zero = eng().full(0.0, [], self.dtype)
    sample_weight = mask.where_(w.expand([n, c]), zero).reduce("sum", [1], False)
    return mask, sample_weight, zero


@lower("nll_loss_forward.default")
def nll_loss_forward(self: ET, target: ET, weight: ET | None, reduction: int, ignore_index: int) -> tuple[ET, ET]:
    mask, sample_weight, zero = _nll_parts(self, target, weight, ignore_index)
    picked = mask.where_(self, zero).reduce("sum", [1], False)
    losses = picked.binary("mul", sample_weight).unary("neg")
    total = sample_weight.reduce("sum", [0], False)
    if reduction == 0:
        return losses, total.binary("mul", 0)
    summed = losses.reduce("sum", [0], False)
    return (summed.binary("div", total) if reduction == 1 else summed), total


@lower("nll_loss_backward.default")
def nll_loss_backward(grad_output: ET, self: ET, target: ET, weight: ET | None, reduction: int, ignore_index: int, total_weight: ET) -> ET:
    mask, sample_weight, zero = _nll_parts(self, target, weight, ignore_index)
    n, c = self.shape
    g = grad_output.reshape([n, 1]) if reduction == 0 else grad_output.reshape([1, 1])
    if reduction == 1:
        g = g.binary("div", total_weight)
    scaled = sample_weight.reshape([n, 1]).binary("mul", g).unary("neg")
    return mask.where_(scaled.expand([n, c]), zero)


@lower("cumsum.default")
def cumsum(self: ET, dim: int, *, dtype: Any = None) -> ET:
    x = _reduce_dtype(self, dtype)
    if len(x.shape) == 0:
        return x if dtype is not None or x.dtype not in ("bool", "i32") else x.cast("i64")
    if x.dtype in ("bool", "i32"):
        x = x.cast("i64")
    dim %= len(x.shape)
    n = x.shape[dim]
    _check_size(math.prod(x.shape), n)
    # out[..., i] = sum over j <= i of x[..., j]
    lower_tri = eng().arange(0, n, 1, "i64").reshape([n, 1]).binary("ge", eng().arange(0, n, 1, "i64"))  # [i, j]
    moved = _move_last(x, dim)
    terms = lower_tri.where_(moved.reshape(list(moved.shape[:-1]) + [1, n]), eng().full(0.0, [], x.dtype))
    return _move_back(terms.reduce("sum", [-1], False), dim)


def _nll_flat(self: ET, target: ET) -> tuple[ET, ET, list[int]]:
    """[N, C, d...] scores and [N, d...] targets as [N*d..., C] and [N*d...]."""
    if len(self.shape) < 3:
        raise Unsupported("nll_loss2d needs spatial dimensions")
    c = self.shape[1]
    perm = [0] + list(range(2, len(self.shape))) + [1]
    rows = math.prod(target.shape)
    return self.permute(perm).reshape([rows, c]), target.reshape([rows]), list(target.shape)


@lower("nll_loss2d_forward.default")
def nll_loss2d_forward(self: ET, target: ET, weight: ET | None, reduction: int, ignore_index: int) -> tuple[ET, ET]:
    scores, flat_target, shape = _nll_flat(self, target)
    out, total = nll_loss_forward(scores, flat_target, weight, reduction, ignore_index)
    return (out.reshape(shape) if reduction == 0 else out), total


@lower("nll_loss2d_backward.default")
def nll_loss2d_backward(grad_output: ET, self: ET, target: ET, weight: ET | None, reduction: int, ignore_index: int, total_weight: ET) -> ET:
    scores, flat_target, shape = _nll_flat(self, target)
    g = grad_output.reshape([math.prod(shape)]) if reduction == 0 else grad_output
    grad = nll_loss_backward(g, scores, flat_target, weight, reduction, ignore_index, total_weight)  # [rows, C]
    spatial = list(self.shape[2:])
    c = self.shape[1]
    back = [0, len(spatial) + 1] + list(range(1, len(spatial) + 1))
    return grad.reshape([self.shape[0]] + spatial + [c]).permute(back)


# ---- convolution ---------------------------------------------------------------


def convolution(input: ET, weight: ET, bias: ET | None, stride: Any, padding: Any, dilation: Any,
                transposed: bool, output_padding: Any, groups: int) -> ET:
    """A convolution as the kernel's strided slices of the padded input
    (im2col) and one batched matmul with the weight, per group."""
    n = len(weight.shape) - 2
    if transposed or len(input.shape) != n + 2 or not is_float(input) or input.dtype != weight.dtype \
            or math.prod(input.shape) == 0 or math.prod(weight.shape) == 0:
        raise Unsupported("transposed, unbatched, integer or empty convolution")
    s, p, d = _pool_param(stride, n, 1), _pool_param(padding, n, 0), _pool_param(dilation, n, 1)
    k = list(weight.shape[2:])
    batch, channels = input.shape[0], input.shape[1]
    spatial = list(input.shape[2:])
    out = [(size + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for size, kk, ss, pp, dd in zip(spatial, k, s, p, d)]
    if any(o <= 0 for o in out):
        raise Unsupported("convolution window larger than the input")
    _check_size(batch * channels * math.prod(k), math.prod(out))
    x = input
    for axis, pp in enumerate(p):
        if pp:
            shape = list(x.shape)
            shape[2 + axis] = pp
            zeros = eng().full(0.0, shape, x.dtype)
            x = eng().cat([zeros, x, zeros], 2 + axis)
    columns = []
    for offset in _offsets(k):
        window = x
        for axis, (o, ss, dd, off) in enumerate(zip(out, s, d, offset)):
            window = window.slice(2 + axis, off * dd, off * dd + (o - 1) * ss + 1, ss)
        columns.append(window.reshape([batch, channels, 1] + out))
    cols = eng().cat(columns, 2) if len(columns) > 1 else columns[0]  # [N, C, K, *out]
    per_group = channels // groups
    cols = cols.reshape([batch, groups, per_group * math.prod(k), math.prod(out)])
    w = weight.reshape([1, groups, weight.shape[0] // groups, per_group * math.prod(k)])
    y = w.matmul(cols).reshape([batch, weight.shape[0]] + out)
    if bias is not None:
        y = y.binary("add", bias.reshape([1, weight.shape[0]] + [1] * n))
    return y
