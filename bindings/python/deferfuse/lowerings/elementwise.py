"""Elementwise aten ops, activations and their gradients."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

from .._engine import Tensor as ET
from ._registry import LOWERINGS, Unsupported, check_bounds, eng, is_float, lower, need_tensor

UNARY = {
    "abs": "abs",
    "neg": "neg",
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "reciprocal": "reciprocal",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "relu": "relu",
    "silu": "silu",
    "sin": "sin",
    "cos": "cos",
    "floor": "floor",
    "sign": "sign",
    "sgn": "sign",
    "logical_not": "logical_not",
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
    return (
        self.binary("mul", self) if self.dtype != "bool" else self.cast("i64").binary("mul", self.cast("i64"))
    )


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
    return (
        self.unary("abs").binary("eq", float("inf"))
        if is_float(self)
        else eng().full(0.0, list(self.shape), "bool")
    )


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
    "mul": "mul",
    "maximum": "maximum",
    "minimum": "minimum",
    "eq": "eq",
    "ne": "ne",
    "lt": "lt",
    "le": "le",
    "gt": "gt",
    "ge": "ge",
    "logical_and": "logical_and",
    "logical_or": "logical_or",
    "greater": "gt",
    "less": "lt",
    "greater_equal": "ge",
    "less_equal": "le",
    "not_equal": "ne",
}


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
    LOWERINGS[f"{_aten}.Tensor"] = LOWERINGS[f"{_aten}.Scalar"] = LOWERINGS[f"{_aten}.default"] = _binary(
        _name
    )


def logical(name: str, a: Any, b: Any) -> ET:
    if not isinstance(a, ET):
        a, b = b, a
    return a.binary(name, b)


def _parity(a: ET) -> ET:
    """`a & 1` of an integer tensor: `a - 2 * (a // 2)`, 0 or 1 for negative
    numbers too (two's complement). Exact while |a| < 2^47 (`_integer_div`)."""
    return a.binary("sub", _integer_div(a, 2, "floor").binary("mul", 2)).cast(a.dtype)


#: `a op 1`, from an integer `a` and its parity `p`.
_WITH_ONE: dict[str, Callable[[ET, ET], ET]] = {
    "and": lambda a, p: p,
    "or": lambda a, p: a.binary("add", 1).binary("sub", p),
    "xor": lambda a, p: a.binary("add", 1).binary("sub", p.binary("mul", 2)),
}


def _bitwise_with_bool(name: str, a: ET, b: Any) -> ET:
    """An integer tensor and a bool (`unfinished & ~stopped` in a decoding
    loop): the bool promotes to 1 or 0, and `a & 0 == 0`, `a | 0 == a ^ 0 == a`."""
    one = _WITH_ONE[name](a, _parity(a))
    zero = a.binary("mul", 0) if name == "and" else a
    if not isinstance(b, ET):
        return one if b else zero
    return b.where_(one, zero)


def _bitwise(name: str) -> Callable[..., ET]:
    def run(self: Any, other: Any) -> ET:
        if _is_bool(self) and _is_bool(other):
            return logical_xor(self, other) if name == "xor" else logical(f"logical_{name}", self, other)
        integer, flag = (other, self) if _is_bool(self) else (self, other)
        if isinstance(integer, ET) and integer.dtype in ("i32", "i64") and _is_bool(flag):
            return _bitwise_with_bool(name, integer, flag)
        raise Unsupported("bitwise ops on two integers")

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
    if rounding_mode is None:
        return self.binary("div", other)
    if self.dtype in ("i32", "i64") and type(other) is int and other != 0:
        return _integer_div(self, other, rounding_mode)
    if (
        self.dtype in ("i32", "i64")
        and isinstance(other, ET)
        and other.dtype in ("i32", "i64")
        and (other.dtype == self.dtype or (self.shape and not other.shape))
    ):
        # PyTorch raises for a zero divisor: here at the next read, as an
        # index out of range does (the divisor's zero flag against a size of 1).
        out = _integer_div(self, other, rounding_mode)
        check_bounds("aten::div", "zero_division", [other.binary("eq", 0).cast("i64")], [1], [0])
        return out
    if not is_float(self) and not is_float(other):
        raise Unsupported("integer division with rounding by zero or across integer dtypes")
    # A float quotient: the true division floored or truncated, for a divisor
    # of any kind (a Python int like `x // 2` too). Half precision divides in
    # float32 and rounds once, after the floor, as PyTorch's kernels do.
    dtype = self.result_type(other)
    half = dtype in ("bf16", "f16")
    if half:
        q = self.cast("f32").binary("div", other.cast("f32") if isinstance(other, ET) else other)
    else:
        q = self.binary("div", other)
    q = q.unary("floor") if rounding_mode == "floor" else trunc(q)
    return q.cast(dtype) if half else q


def _integer_div(x: ET, d: int | ET, rounding_mode: str) -> ET:
    """`x // d` (floor) or `trunc(x / d)` of integers by a nonzero int or an
    integer tensor, exactly: a float32 estimate of the quotient, refined
    once from the remainder (integer arithmetic, exact) and corrected by one
    step. Exact while |x / d| < 2^46. A zero in a tensor divisor reads as 1
    here (no infinity is made); the caller checks for it."""
    a = x.cast("i64")
    if isinstance(d, ET):
        d = d.cast("i64")
        d = d.binary("eq", 0).where_(1, d)
        positive = d.binary("gt", 0)
        fd = d.cast("f32")
    else:
        positive, fd = d > 0, float(d)

    def pick(when_positive: ET, when_negative: ET) -> ET:
        if isinstance(positive, bool):
            return when_positive if positive else when_negative
        return positive.where_(when_positive, when_negative)

    def refine(q: ET) -> ET:
        r = a.binary("sub", q.binary("mul", d))
        return q.binary("add", r.cast("f32").binary("div", fd).unary("floor").cast("i64"))

    q = refine(a.cast("f32").binary("div", fd).unary("floor").cast("i64"))
    r = a.binary("sub", q.binary("mul", d))
    # Floor's remainder lies in [0, d) for d > 0 and (d, 0] for d < 0.
    low = pick(r.binary("lt", 0), r.binary("gt", 0))
    high = pick(r.binary("ge", d), r.binary("le", d))
    q = low.where_(q.binary("sub", 1), high.where_(q.binary("add", 1), q))
    if rounding_mode == "trunc":
        r = a.binary("sub", q.binary("mul", d))
        negative = pick(a.binary("lt", 0), a.binary("ge", 0))
        q = r.binary("ne", 0).binary("logical_and", negative).where_(q.binary("add", 1), q)
    return q.cast(x.dtype)


@lower("remainder.Tensor", "remainder.Scalar")
def remainder(self: Any, other: Any) -> ET:
    need_tensor(self)
    if self.dtype in ("i32", "i64") and type(other) is int and other != 0:
        # Python's sign convention: the remainder takes the divisor's sign.
        return self.binary("sub", _integer_div(self, other, "floor").binary("mul", other))
    if not is_float(self):
        raise Unsupported("integer remainder by a tensor or by zero")
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
    return grad_output.binary(
        "mul", s.binary("mul", self.binary("mul", s.unary("neg").binary("add", 1.0)).binary("add", 1.0))
    )


@lower("gelu_backward.default")
def gelu_backward(grad_output: ET, self: ET, approximate: str = "none") -> ET:
    x = self
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        inner = x.binary("add", x.binary("mul", x).binary("mul", x).binary("mul", 0.044715)).binary("mul", k)
        t = inner.unary("tanh")
        dinner = x.binary("mul", x).binary("mul", 3 * 0.044715).binary("add", 1.0).binary("mul", k)
        d = (
            t.binary("add", 1.0)
            .binary("mul", 0.5)
            .binary(
                "add",
                x.binary("mul", 0.5)
                .binary("mul", t.binary("mul", t).unary("neg").binary("add", 1.0))
                .binary("mul", dinner),
            )
        )
        return grad_output.binary("mul", d)
    # d/dx x*Phi(x) = Phi(x) + x*phi(x); Phi(x) = gelu(x)/x away from 0, 1/2 at 0.
    pdf = x.binary("mul", x).binary("mul", -0.5).unary("exp").binary("mul", 1.0 / math.sqrt(2.0 * math.pi))
    safe = x.binary("eq", 0).where_(1.0, x)
    cdf = x.binary("eq", 0).where_(0.5, x.unary("gelu").binary("div", safe))
    return grad_output.binary("mul", cdf.binary("add", x.binary("mul", pdf)))


# ---- sign bits, NaN-aware extremes, hypot, atan2, logit, rounding -------------


def _in_f32(fn: Callable[..., ET]) -> Callable[..., ET]:
    """Runs a composition in f32 and rounds once to the operands' float dtype,
    as PyTorch's bf16/f16 kernels compute in float (opmath)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> ET:
        floats = [a.dtype for a in args if isinstance(a, ET) and is_float(a)]
        out_dtype = "f32" if not floats or "f32" in floats else floats[0]
        widened = [a.cast("f32") if isinstance(a, ET) and a.dtype in ("bf16", "f16") else a for a in args]
        out = fn(*widened, **kwargs)
        return out.cast(out_dtype) if out.dtype != out_dtype else out

    return run


def _neg_sign(x: ET) -> ET:
    """The sign bit of a float: x < 0, or x is -0.0 (whose reciprocal is
    -inf; only zeros take that reciprocal). The engine cannot read a NaN's
    sign bit: NaN counts as positive, as the NaN literals PyTorch makes are."""
    zero = x.binary("eq", 0.0)
    negative_zero = zero.where_(x, 1.0).unary("reciprocal").binary("lt", 0.0).binary("logical_and", zero)
    return x.binary("lt", 0.0).binary("logical_or", negative_zero)


@lower("signbit.default")
def signbit(self: ET) -> ET:
    if self.dtype == "bool":
        return eng().full(0.0, list(self.shape), "bool")
    return _neg_sign(self) if is_float(self) else self.binary("lt", 0)


@lower("bitwise_not.default")
def bitwise_not(self: ET) -> ET:
    """Logical not on bools; on two's complement integers ~x == -x - 1."""
    if self.dtype == "bool":
        return self.unary("logical_not")
    if self.dtype not in ("i32", "i64"):
        raise Unsupported("bitwise_not of a float")
    return self.unary("neg").binary("sub", 1)


@lower("copysign.Tensor", "copysign.Scalar")
@_in_f32
def copysign(self: Any, other: Any) -> ET:
    need_tensor(self)
    x = self if is_float(self) else self.cast("f32")
    if isinstance(other, ET):
        negative = _neg_sign(other.cast("f32") if not is_float(other) else other)
    else:
        if math.isnan(float(other)):
            raise Unsupported("copysign with a NaN scalar")
        negative = math.copysign(1.0, float(other)) < 0
        return x.unary("abs").unary("neg") if negative else x.unary("abs")
    magnitude = x.unary("abs")
    return negative.where_(magnitude.unary("neg"), magnitude)


def _nan_aware(name: str) -> Callable[..., ET]:
    """fmax / fmin: the maximum / minimum, and the other operand where one
    of them is NaN."""

    def run(self: ET, other: ET) -> ET:
        need_tensor(self, other)
        both = self.binary(name, other)
        if not (is_float(self) or is_float(other)):
            return both
        return self.binary("ne", self).where_(other, other.binary("ne", other).where_(self, both))

    return run


LOWERINGS["fmax.default"] = _nan_aware("maximum")
LOWERINGS["fmin.default"] = _nan_aware("minimum")


@lower("hypot.default")
@_in_f32
def hypot(self: ET, other: ET) -> ET:
    """sqrt(a^2 + b^2) without overflow: m * sqrt(1 + (n/m)^2) with m, n the
    larger and smaller magnitude; infinite where either is (even beside a
    NaN, as C's hypot)."""
    need_tensor(self, other)
    a, b = self.unary("abs"), other.unary("abs")
    big, small = a.binary("maximum", b), a.binary("minimum", b)
    plain = big.binary("eq", 0.0).binary("logical_or", big.binary("eq", float("inf")))
    safe = plain.where_(1.0, big)
    ratio = plain.where_(0.0, small.binary("div", safe))
    general = big.binary("mul", ratio.binary("mul", ratio).binary("add", 1.0).unary("sqrt"))
    infinite = a.binary("eq", float("inf")).binary("logical_or", b.binary("eq", float("inf")))
    return infinite.where_(float("inf"), general)


_SQRT3 = math.sqrt(3.0)


def _atan_unit(t: ET) -> ET:
    """atan(t) for t in [0, 1]: above tan(pi/12), atan(t) = pi/6 + atan(u) with
    u = (t - 1/sqrt3) / (1 + t/sqrt3), so |u| <= tan(pi/12) = 0.268; then the
    odd Taylor series to u^19 (next term < 0.268^21/21 ~ 5e-14, far below f32
    rounding)."""
    shift = t.binary("gt", 2.0 - _SQRT3)
    u = shift.where_(
        t.binary("sub", 1.0 / _SQRT3).binary("div", t.binary("div", _SQRT3).binary("add", 1.0)), t
    )
    u2 = u.binary("mul", u)
    acc = None
    for k in range(19, 0, -2):  # Horner in u^2 on the coefficients (-1)^j / (2j+1)
        c = (1.0 if (k // 2) % 2 == 0 else -1.0) / k
        acc = eng().full(c, [], u.dtype) if acc is None else acc.binary("mul", u2).binary("add", c)
    return shift.where_(u.binary("mul", acc).binary("add", math.pi / 6), u.binary("mul", acc))


@lower("atan2.default")
@_in_f32
def atan2(self: ET, other: ET) -> ET:
    """atan2(y, x) from atan on [0, 1] of min/max of |y|, |x| and quadrant
    fix-ups, with C's signed-zero and infinity rules."""
    need_tensor(self, other)
    y = self if is_float(self) else self.cast("f32")
    x = other if is_float(other) else other.cast("f32")
    ay, ax = y.unary("abs"), x.unary("abs")
    big, small = ax.binary("maximum", ay), ax.binary("minimum", ay)
    both_inf = ax.binary("eq", float("inf")).binary("logical_and", ay.binary("eq", float("inf")))
    degenerate = big.binary("eq", 0.0).binary("logical_or", both_inf)
    t = degenerate.where_(both_inf.where_(1.0, 0.0), small.binary("div", degenerate.where_(1.0, big)))
    base = _atan_unit(t)  # angle of (max, min) in [0, pi/4]
    angle = ay.binary("gt", ax).where_(base.unary("neg").binary("add", math.pi / 2), base)
    angle = _neg_sign(x).where_(angle.unary("neg").binary("add", math.pi), angle)
    out = _neg_sign(y).where_(angle.unary("neg"), angle)
    nan = y.binary("ne", y).binary("logical_or", x.binary("ne", x))
    return nan.where_(float("nan"), out)


@lower("atan.default")
@_in_f32
def atan(self: ET) -> ET:
    x = _float_unary(self)
    return atan2(x, eng().full(1.0, [], x.dtype))


def _cos_of_sin(x: ET) -> ET:
    """sqrt(1 - x^2) as sqrt((1 - x)(1 + x)): exact near |x| = 1, where
    1 - x^2 would lose every digit; NaN past |x| = 1."""
    return x.unary("neg").binary("add", 1.0).binary("mul", x.binary("add", 1.0)).unary("sqrt")


@lower("asin.default")
@_in_f32
def asin(self: ET) -> ET:
    x = _float_unary(self)
    return atan2(x, _cos_of_sin(x))


@lower("acos.default")
@_in_f32
def acos(self: ET) -> ET:
    x = _float_unary(self)
    return atan2(_cos_of_sin(x), x)


#: Numerical Recipes' `erfcc` fit: erfc(y) = t exp(-y^2 + P(t)), t = 1 / (1 + y/2),
#: for y >= 0 with a fractional error below 1.2e-7 (coefficients of t^0..t^9).
_ERFC_FIT = (
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
    0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
)  # fmt: skip


def _erf_parts(x: ET) -> tuple[ET, ET, ET]:
    """(|x| < 1/2, erf(x) from its Maclaurin series there, erfc(|x|) from the
    fit elsewhere). The series to x^15 is exact to 1e-9 relative below 1/2,
    where 1 - erfc would lose digits to cancellation."""
    y = x.unary("abs")
    small = y.binary("lt", 0.5)
    x2 = x.binary("mul", x)
    series = None
    for n in range(7, -1, -1):  # Horner in x^2 on (-1)^n / (n! (2n + 1))
        c = (-1.0) ** n / (math.factorial(n) * (2 * n + 1))
        series = eng().full(c, [], x.dtype) if series is None else series.binary("mul", x2).binary("add", c)
    series = series.binary("mul", x).binary("mul", 2.0 / math.sqrt(math.pi))
    # erfc(11) underflows f32: the tail is 0 from there, and infinity stays
    # out of the split below (NaN passes through).
    y = y.binary("minimum", 11.0)
    t = y.binary("mul", 0.5).binary("add", 1.0).unary("reciprocal")
    p = None
    for c in reversed(_ERFC_FIT):
        p = eng().full(c, [], x.dtype) if p is None else p.binary("mul", t).binary("add", c)
    # y^2 split as yh^2 + (y - yh)(y + yh), yh = floor(16 y) / 16 squaring
    # exactly: the exponent's rounding would cost erfc up to 4e-6 relative.
    yh = y.binary("mul", 16.0).unary("floor").binary("mul", 1.0 / 16.0)
    cross = y.binary("sub", yh).binary("mul", y.binary("add", yh))
    head = yh.binary("mul", yh).unary("neg").unary("exp")
    tail = t.binary("mul", head).binary("mul", p.binary("sub", cross).unary("exp"))
    return small, series, tail


@lower("erf.default")
@_in_f32
def erf(self: ET) -> ET:
    x = _float_unary(self)
    small, series, tail = _erf_parts(x)
    big = tail.unary("neg").binary("add", 1.0)
    return small.where_(series, x.binary("lt", 0.0).where_(big.unary("neg"), big))


@lower("erfc.default")
@_in_f32
def erfc(self: ET) -> ET:
    x = _float_unary(self)
    small, series, tail = _erf_parts(x)
    return small.where_(
        series.unary("neg").binary("add", 1.0),
        x.binary("lt", 0.0).where_(tail.unary("neg").binary("add", 2.0), tail),
    )


@lower("logit.default")
@_in_f32
def logit(self: ET, eps: float | None = None) -> ET:
    x = self if is_float(self) else self.cast("f32")
    if eps is not None and eps >= 0:
        # PyTorch's order of tests (it matters when eps > 0.5); NaN stays NaN.
        lo, hi = float(eps), 1.0 - float(eps)
        x = x.binary("lt", lo).where_(lo, x.binary("gt", hi).where_(hi, x))
    return x.binary("div", x.unary("neg").binary("add", 1.0)).unary("log")


def _round_even(x: ET) -> ET:
    """Round half to even (nearbyint): floor, plus one above a half, and on
    a tie towards the even neighbour."""
    f = x.unary("floor")
    d = x.binary("sub", f)
    odd = f.binary("sub", f.binary("mul", 0.5).unary("floor").binary("mul", 2.0)).binary("ne", 0.0)
    up = d.binary("gt", 0.5).binary("logical_or", d.binary("eq", 0.5).binary("logical_and", odd))
    return up.where_(f.binary("add", 1.0), f)


@lower("round.default")
def round_(self: ET) -> ET:
    return _round_even(self) if is_float(self) else self


@lower("round.decimals")
def round_decimals(self: ET, *, decimals: int = 0) -> ET:
    """PyTorch's formula in the tensor's dtype: nearbyint(x * 10^d) / 10^d, or
    nearbyint(x / 10^-d) * 10^-d for negative d."""
    if not is_float(self):
        raise Unsupported("round with decimals on integers")
    if decimals == 0:
        return _round_even(self)
    scale = float(10.0 ** abs(decimals))
    if decimals > 0:
        return _round_even(self.binary("mul", scale)).binary("div", scale)
    return _round_even(self.binary("div", scale)).binary("mul", scale)


# ---- lgamma and digamma ------------------------------------------------------------

_SHIFT = 8  # below it, the recurrence moves x up to where Stirling's series is accurate


def _reflect_parts(x: ET) -> tuple[ET, ET]:
    """For x < 0.5: sin(pi x) computed on x - round(x) (exact in f32), so the
    argument stays small however large |x| is; and 1 - x."""
    r = x.binary("sub", _round_even(x))
    return r.binary("mul", math.pi).unary("sin"), x.unary("neg").binary("add", 1.0)


def _lgamma_positive(x: ET) -> ET:
    """lgamma for x > 0: z = x + 8 below 8 and log of the rising product
    taken off, then Stirling's series to 1/z^7 (truncation < 1e-11 at z = 8)."""
    small = x.binary("lt", float(_SHIFT))
    prod = x
    for k in range(1, _SHIFT):
        prod = prod.binary("mul", x.binary("add", float(k)))
    z = small.where_(x.binary("add", float(_SHIFT)), x)
    inv = z.unary("reciprocal")
    inv2 = inv.binary("mul", inv)
    series = inv2.binary("mul", -1.0 / 1680).binary("add", 1.0 / 1260).binary("mul", inv2)
    series = series.binary("sub", 1.0 / 360).binary("mul", inv2).binary("add", 1.0 / 12).binary("mul", inv)
    stirling = (
        z.binary("sub", 0.5)
        .binary("mul", z.unary("log"))
        .binary("sub", z)
        .binary("add", 0.5 * math.log(2 * math.pi))
    )
    stirling = stirling.binary("add", series)
    return small.where_(stirling.binary("sub", small.where_(prod, 1.0).unary("log")), stirling)


@lower("lgamma.default")
@_in_f32
def lgamma(self: ET) -> ET:
    """log|Gamma(x)|: Stirling's series after the recurrence for x >= 0.5, the
    reflection log(pi / |sin(pi x)|) - lgamma(1 - x) below. Measured against
    float64 lgamma over [-50, 50] and magnitudes 1e-30 .. 1e30 in f32: error
    <= 6e-6 absolute below |lgamma| = 1, relative above. Poles
    (0 and negative integers) give +inf, as PyTorch."""
    x = self if is_float(self) else self.cast("f32")
    neg = x.binary("lt", 0.5)
    sin_pi, one_minus = _reflect_parts(x)
    up = neg.where_(one_minus, x)
    up = up.binary("gt", 0.0).where_(up, 1.0)  # keeps NaN/inf-free inputs for the series
    positive = _lgamma_positive(up)
    abs_sin = sin_pi.unary("abs")
    pole = abs_sin.binary("eq", 0.0)
    reflected = abs_sin.binary("mul", 1.0 / math.pi).unary("log").unary("neg").binary("sub", positive)
    out = neg.where_(pole.where_(float("inf"), reflected), positive)
    out = (
        x.binary("eq", float("inf"))
        .binary("logical_or", x.binary("eq", float("-inf")))
        .where_(float("inf"), out)
    )
    return x.binary("ne", x).where_(x, out)


def _digamma_positive(x: ET) -> ET:
    """digamma for x > 0: z = x + 8 below 8 with sum 1/(x+k) taken off, then
    the asymptotic series log z - 1/2z - 1/12z^2 + 1/120z^4 - 1/252z^6 + 1/240z^8."""
    small = x.binary("lt", float(_SHIFT))
    recip = x.unary("reciprocal")
    for k in range(1, _SHIFT):
        recip = recip.binary("add", x.binary("add", float(k)).unary("reciprocal"))
    z = small.where_(x.binary("add", float(_SHIFT)), x)
    inv = z.unary("reciprocal")
    inv2 = inv.binary("mul", inv)
    tail = inv2.binary("mul", 1.0 / 240).binary("sub", 1.0 / 252).binary("mul", inv2).binary("add", 1.0 / 120)
    tail = tail.binary("mul", inv2).binary("sub", 1.0 / 12).binary("mul", inv2)
    series = z.unary("log").binary("sub", inv.binary("mul", 0.5)).binary("add", tail)
    return small.where_(series.binary("sub", recip), series)


@lower("digamma.default")
@_in_f32
def digamma(self: ET) -> ET:
    """psi(x): the asymptotic series after the recurrence for x >= 0.5, the
    reflection psi(1 - x) - pi / tan(pi x) below. Poles: -inf at +0, +inf at
    -0 and NaN at negative integers, as PyTorch. Measured against float64
    digamma over [-50, 50] and magnitudes 1e-30 .. 1e30 in f32: error <= 1e-6
    absolute below |psi| = 1, relative above."""
    x = self if is_float(self) else self.cast("f32")
    neg = x.binary("lt", 0.5)
    sin_pi, one_minus = _reflect_parts(x)
    r = x.binary("sub", _round_even(x))
    cos_pi = r.binary("mul", math.pi).unary("cos")
    up = neg.where_(one_minus, x)
    up = up.binary("gt", 0.0).where_(up, 1.0)
    positive = _digamma_positive(up)
    pole = sin_pi.binary("eq", 0.0)
    reflected = positive.binary("sub", cos_pi.binary("mul", math.pi).binary("div", pole.where_(1.0, sin_pi)))
    zero = x.binary("eq", 0.0)
    at_zero = _neg_sign(x).where_(float("inf"), float("-inf"))
    out = neg.where_(pole.where_(float("nan"), reflected), positive)
    out = zero.where_(at_zero, out)
    out = x.binary("eq", float("inf")).where_(
        float("inf"), x.binary("eq", float("-inf")).where_(float("nan"), out)
    )
    return x.binary("ne", x).where_(x, out)


# ---- polygamma ----------------------------------------------------------------------

# Cephes' zeta: the Euler-Maclaurin tail's coefficients (2k)! / B_2k.
_ZETA_A = [
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
]


def _zeta_parts(s: int, q: ET) -> tuple[list[ET], ET]:
    """Hurwitz zeta(s, q) for q > 0 as Cephes (and PyTorch's CPU kernel)
    computes it: the ten terms q^-s, ..., (q+9)^-s, and the Euler-Maclaurin
    tail at w = q + 9 with twelve Bernoulli terms (those past Cephes' early
    exit are below one rounding)."""
    terms = [q.binary("pow", float(-s))]
    a = q
    for _ in range(9):
        a = a.binary("add", 1.0)
        terms.append(a.binary("pow", float(-s)))
    w, b = a, terms[-1]
    tail = b.binary("mul", w).binary("mul", 1.0 / (s - 1)).binary("sub", b.binary("mul", 0.5))
    coef, k = 1.0, 0.0
    inv_w = w.unary("reciprocal")
    for denom in _ZETA_A:
        coef *= s + k
        b = b.binary("mul", inv_w)
        tail = tail.binary("add", b.binary("mul", coef / denom))
        k += 1.0
        coef *= s + k
        b = b.binary("mul", inv_w)
        k += 1.0
    return terms, tail


def _zeta_positive(s: int, q: ET) -> ET:
    terms, tail = _zeta_parts(s, q)
    total = terms[0]
    for t in terms[1:]:
        total = total.binary("add", t)
    return total.binary("add", tail)


def _zeta(s: int, q: ET) -> ET:
    """zeta(s, q) for an integer s >= 2 and any q: +inf at 0 and the negative
    integers; for q = -m + f (0 < f < 1) the sum over q + j < 0 in closed
    form, zeta(s, f) + (-1)^s (zeta(s, 1 - f) - zeta(s, 1 - f + m)), so every
    zeta has a positive argument (Cephes sums those terms one by one)."""
    floor = q.unary("floor")
    negative = q.binary("le", 0.0)
    pole = negative.binary("logical_and", q.binary("eq", floor))
    f = q.binary("sub", floor)
    safe_f = pole.where_(0.5, f)
    m = floor.unary("neg")
    plain = _zeta_positive(s, negative.where_(1.0, q))
    far = _zeta_positive(s, safe_f.unary("neg").binary("add", 1.0).binary("add", negative.where_(m, 0.0)))
    sign = 1.0 if s % 2 == 0 else -1.0
    # zeta(s, f) +- zeta(s, 1 - f) term by term: near f = 1/2 the paired
    # terms nearly cancel, and a difference of close numbers is exact, as in
    # Cephes' direct sum over the same terms.
    left, left_tail = _zeta_parts(s, safe_f)
    mirror, mirror_tail = _zeta_parts(s, safe_f.unary("neg").binary("add", 1.0))
    folded = None
    for a, b in zip(left, mirror):
        pair = a.binary("add", b.binary("mul", sign))
        folded = pair if folded is None else folded.binary("add", pair)
    folded = folded.binary("add", left_tail.binary("add", mirror_tail.binary("mul", sign)))
    folded = folded.binary("sub", far.binary("mul", sign))
    out = negative.where_(pole.where_(float("inf"), folded), plain)
    return q.binary("ne", q).where_(q, out)


def _trigamma(x: ET) -> ET:
    """PyTorch's calc_trigamma: reflection below 1/2, six recurrence steps,
    then the asymptotic series."""
    low = x.binary("lt", 0.5)
    sin_pi = x.binary("mul", math.pi).unary("sin")
    reflect = low.where_(sin_pi.binary("mul", sin_pi).unary("reciprocal").binary("mul", -(math.pi**2)), 0.0)
    z = low.where_(x.unary("neg").binary("add", 1.0), x)
    total = reflect
    for _ in range(6):
        total = total.binary("add", z.binary("mul", z).unary("reciprocal"))
        z = z.binary("add", 1.0)
    ixx = z.binary("mul", z).unary("reciprocal")
    tail = (
        ixx.binary("mul", -1.0 / 42)
        .binary("add", 1.0 / 30)
        .binary("mul", ixx)
        .unary("neg")
        .binary("add", 1.0 / 6)
    )
    tail = tail.binary("mul", ixx).binary("add", z.unary("reciprocal").binary("mul", 0.5)).binary("add", 1.0)
    total = total.binary("add", tail.binary("div", z))
    return low.where_(total.unary("neg"), total)


@lower("polygamma.default")
def polygamma(n: int, self: ET) -> ET:
    """digamma for n = 0, PyTorch's trigamma for 1, and (-1)^(n+1) n! zeta(n+1, x)
    above, as PyTorch's CPU kernels (f32; half precision computed in f32)."""
    if not isinstance(self, ET) or n < 0:
        raise Unsupported("polygamma of a scalar or negative order")
    if n == 0:
        return digamma(self)
    x = self if is_float(self) else self.cast("f32")
    out_dtype = x.dtype
    x = x.cast("f32") if x.dtype != "f32" else x
    if n == 1:
        out = _trigamma(x)
    else:
        out = _zeta(n + 1, x).binary("mul", (1.0 if n % 2 else -1.0) * math.factorial(n))
    return out.cast(out_dtype) if out_dtype != "f32" else out
