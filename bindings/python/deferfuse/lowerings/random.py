"""Random ops on the engine, drawing from the device generator (`_generator`).

Element `i` of a draw is a keyed permutation of `i` over 24-bit values: an
8-round Feistel network on two 12-bit halves whose round function is
`((right + k) mod 4096)^2 mod 4093`. Every intermediate value is an integer
below 2^24, so f32 holds it exactly (fused kernels compute in f32) and the
engine's ordinary elementwise ops compute it on every backend; the round
keys are scalar operands, runtime inputs, so the trace of a draw is the
same at every call. One draw holds at most 2^24 elements (larger ones run
on the CPU). Uniform values take the dtype's significand width of the
top bits, so they are exact in the dtype and stay below 1.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _generator
from .._engine import Tensor as ET
from ._registry import Unsupported, broadcast_batch, dt, eng, lower
from .lookups import ONE_HOT_LIMIT
from .sorting import _check_square, _network_order, _place, _ranks, _refuse_if

_HALF = 4096.0  # 2^12: one Feistel half
_PRIME = 4093.0  # the largest prime whose square is below 2^24
_ROUNDS = 8
_MAX_ELEMENTS = 1 << 24
_SIGNIFICAND = {"f32": 24, "bf16": 8, "f16": 11}


def _mod_half(x: ET) -> ET:
    """x mod 4096 for integers 0 <= x < 2^24 (division by a power of two is exact)."""
    return x.binary("sub", x.binary("div", _HALF).unary("floor").binary("mul", _HALF))


def _mod_prime(x: ET) -> ET:
    """x mod 4093 for integers 0 <= x < 2^24. The f32 quotient may round
    across an integer, so the remainder is corrected once either way."""
    r = x.binary("sub", x.binary("div", _PRIME).unary("floor").binary("mul", _PRIME))
    r = r.binary("lt", 0.0).where_(r.binary("add", _PRIME), r)
    return r.binary("ge", _PRIME).where_(r.binary("sub", _PRIME), r)


def _permuted(n: int, generator: Any) -> ET:
    """f32 [n]: distinct integers in [0, 2^24), a keyed permutation of 0..n-1."""
    keys = _generator.next_keys(2 * _ROUNDS, 12, generator)
    i = eng().arange(0.0, float(n), 1.0, "f32")
    left, right = i.binary("div", _HALF).unary("floor"), _mod_half(i)
    for r in range(_ROUNDS):
        t = _mod_half(right.binary("add", float(keys[2 * r])))
        f = _mod_prime(t.binary("mul", t))
        left, right = right, _mod_half(left.binary("add", f).binary("add", float(keys[2 * r + 1])))
    return left.binary("mul", _HALF).binary("add", right)


def _numel(shape: list[int]) -> int:
    n = math.prod(shape)
    if n > _MAX_ELEMENTS:
        raise Unsupported(f"a draw of more than 2^24 elements ({n})")
    return n


def _device_generator(generator: Any) -> Any:
    """`generator` when it is None (the default one) or a `tpu` generator."""
    if generator is not None and generator.device.type != "tpu":
        raise Unsupported(f"a {generator.device.type} generator")
    return generator


def _float_dtype(x: ET) -> str:
    if x.dtype not in _SIGNIFICAND:
        raise Unsupported(f"random floats of dtype {x.dtype}")
    return x.dtype


def uniform01(shape: list[int], bits: int = 24, generator: Any = None) -> ET:
    """f32 uniform values on [0, 1) with `bits` significant bits, drawn from
    `generator` (a `tpu` one; None: the default one)."""
    n = _numel(shape)
    if n == 0:
        return eng().full(0.0, shape, "f32")
    v = _permuted(n, generator)
    if bits < 24:
        v = v.binary("div", float(1 << (24 - bits))).unary("floor")
    return v.binary("mul", 2.0**-bits).reshape(shape)


def _open01(shape: list[int], generator: Any) -> ET:
    """f32 uniform values on (0, 1]: their log is finite and at most 0."""
    return uniform01(shape, generator=generator).binary("mul", -1.0).binary("add", 1.0)


def standard_normal(shape: list[int], generator: Any = None) -> ET:
    """f32 standard normal values: Box-Muller on two independent draws of
    half the size, whose radius times the angle's cosine and times its sine
    are two independent normals (the first and the second half). Half the
    uniform draws of one normal per pair, which cost most of the time."""
    n = _numel(shape)
    if n == 0:
        return eng().full(0.0, shape, "f32")
    half = (n + 1) // 2
    u1 = _open01([half], generator)  # its log is finite
    u2 = uniform01([half], generator=generator)
    radius = u1.unary("log").binary("mul", -2.0).unary("sqrt")
    angle = u2.binary("mul", 2.0 * math.pi)
    pair = [radius.binary("mul", angle.unary("cos")), radius.binary("mul", angle.unary("sin"))]
    return eng().cat(pair, 0).slice(0, 0, n, 1).reshape(shape)


@lower("uniform.default")
def uniform(self: ET, from_: float = 0.0, to: float = 1.0, *, generator: Any = None, **kw: Any) -> ET:
    generator = _device_generator(generator)
    dtype = _float_dtype(self)
    if "from" in kw:
        from_ = kw.pop("from")
    u = uniform01(list(self.shape), _SIGNIFICAND[dtype], generator)
    return u.binary("mul", float(to) - float(from_)).binary("add", float(from_)).cast(dtype)


@lower("normal.default", "normal.functional")
def normal(self: ET, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> ET:
    generator = _device_generator(generator)
    dtype = _float_dtype(self)
    if std < 0:
        raise Unsupported("negative std (the CPU raises PyTorch's error)")
    z = standard_normal(list(self.shape), generator)
    return z.binary("mul", float(std)).binary("add", float(mean)).cast(dtype)


@lower("exponential.default")
def exponential(self: ET, lambd: float = 1.0, *, generator: Any = None) -> ET:
    generator = _device_generator(generator)
    dtype = _float_dtype(self)
    if not lambd > 0:
        raise Unsupported("a rate that is not positive (the CPU raises PyTorch's error)")
    u = _open01(list(self.shape), generator)
    return u.unary("log").binary("mul", -1.0 / float(lambd)).cast(dtype)


def _bernoulli(shape: list[int], p: Any, dtype: str, generator: Any = None) -> ET:
    if isinstance(p, ET):
        p = p.cast("f32")
    elif not 0.0 <= float(p) <= 1.0:
        raise Unsupported("a probability outside [0, 1] (the CPU raises PyTorch's error)")
    else:
        p = float(p)
    return uniform01(shape, generator=_device_generator(generator)).binary("lt", p).cast(dtype)


@lower("bernoulli.float", "bernoulli.p")
def bernoulli_float(self: ET, p: float = 0.5, *, generator: Any = None) -> ET:
    return _bernoulli(list(self.shape), p, self.dtype, generator)


@lower("bernoulli.Tensor")
def bernoulli_tensor(self: ET, p: ET, *, generator: Any = None) -> ET:
    if not isinstance(p, ET):
        raise Unsupported("a probability tensor that is not on tpu")
    return _bernoulli(list(self.shape), p.expand(list(self.shape)), self.dtype, generator)


@lower("bernoulli.default")
def bernoulli(self: ET, *, generator: Any = None) -> ET:
    """`torch.bernoulli(probs)`: one draw per probability."""
    return _bernoulli(list(self.shape), self, self.dtype, generator)


@lower("native_dropout.default")
def native_dropout(input: ET, p: float, train: bool | None) -> tuple[ET, ET]:
    shape = list(input.shape)
    if train is False or p == 0.0:
        return input, eng().full(1.0, shape, "bool")
    if p == 1.0:
        return eng().full(0.0, shape, input.dtype), eng().full(0.0, shape, "bool")
    if not 0.0 <= p <= 1.0:
        raise Unsupported("a dropout probability outside [0, 1] (the CPU raises PyTorch's error)")
    keep = uniform01(shape).binary("lt", 1.0 - float(p))
    scaled = input.binary("mul", keep.cast(input.dtype)).binary("mul", 1.0 / (1.0 - float(p)))
    return scaled, keep


def _normal_of(mean: Any, std: Any, generator: Any) -> ET:
    """`torch.normal` with a tensor mean or std: one draw per element of
    their broadcast shape, in the dtype of the tensor operand (mean first)."""
    if any(hasattr(v, "shape") and not isinstance(v, ET) for v in (mean, std)):
        raise Unsupported("a mean or std that is not on tpu")
    tensors = [v for v in (mean, std) if isinstance(v, ET)]
    dtype = _float_dtype(tensors[0])
    shape = broadcast_batch(list(tensors[0].shape), list(tensors[-1].shape))
    if isinstance(std, ET):
        # PyTorch raises for a negative std; one flag read sends it to the CPU.
        if math.prod(std.shape):
            _refuse_if(std.binary("lt", 0.0), "a negative std (the CPU raises PyTorch's error)")
        std = std.cast("f32")
    elif std < 0:
        raise Unsupported("negative std (the CPU raises PyTorch's error)")
    if isinstance(mean, ET):
        mean = mean.cast("f32")
    z = standard_normal(shape, _device_generator(generator))
    return z.binary("mul", std).binary("add", mean).cast(dtype)


@lower("normal.Tensor_Tensor")
def normal_tensor_tensor(mean: ET, std: ET, *, generator: Any = None) -> ET:
    return _normal_of(mean, std, generator)


@lower("normal.Tensor_float")
def normal_tensor_float(mean: ET, std: float = 1.0, *, generator: Any = None) -> ET:
    return _normal_of(mean, float(std), generator)


@lower("normal.float_Tensor")
def normal_float_tensor(mean: float, std: ET, *, generator: Any = None) -> ET:
    return _normal_of(float(mean), std, generator)


@lower("log_normal.default")
def log_normal(self: ET, mean: float = 1.0, std: float = 2.0, *, generator: Any = None) -> ET:
    if not std > 0:
        raise Unsupported("a std that is not positive (the CPU raises PyTorch's error)")
    dtype = _float_dtype(self)
    z = standard_normal(list(self.shape), _device_generator(generator))
    return z.binary("mul", float(std)).binary("add", float(mean)).unary("exp").cast(dtype)


@lower("cauchy.default")
def cauchy(self: ET, median: float = 0.0, sigma: float = 1.0, *, generator: Any = None) -> ET:
    """median + sigma * tan(pi * (u - 1/2)), u on (0, 1]: the angle stays
    inside (-pi/2, pi/2], so the cosine is never 0 but at u = 1 (0 in f32
    rounding: an infinite draw, as PyTorch's own can be)."""
    if not sigma > 0:
        raise Unsupported("a sigma that is not positive (the CPU raises PyTorch's error)")
    dtype = _float_dtype(self)
    angle = _open01(list(self.shape), _device_generator(generator)).binary("sub", 0.5).binary("mul", math.pi)
    tan = angle.unary("sin").binary("div", angle.unary("cos"))
    return tan.binary("mul", float(sigma)).binary("add", float(median)).cast(dtype)


@lower("geometric.default")
def geometric(self: ET, p: float, *, generator: Any = None) -> ET:
    """The number of Bernoulli(p) trials up to the first success (1, 2, ...):
    ceil(log(u) / log(1 - p)) for u on (0, 1], at least 1."""
    if not 0.0 < p < 1.0:
        raise Unsupported(
            "a probability outside (0, 1) (the CPU raises PyTorch's error, or fills 1 at p = 1)"
        )
    u = _open01(list(self.shape), _device_generator(generator))
    trials = u.unary("log").binary("div", math.log1p(-float(p)))
    ceil = trials.unary("neg").unary("floor").unary("neg")
    return ceil.binary("maximum", 1.0).cast(self.dtype)


@lower("random.to")
def random_to(self: ET, to: int, *, generator: Any = None) -> ET:
    return random_int(self, 0, to, generator=generator)


@lower("random.from")
def random_int(self: ET, from_: int, to: int | None = None, *, generator: Any = None) -> ET:
    """`random_(from, to)` and so `randint`: integers in [from, to). The
    draw's 24 bits are scaled to the range, which is exact and unbiased for
    ranges that are powers of two and biased by at most range / 2^24 otherwise."""
    generator = _device_generator(generator)
    if to is None:
        raise Unsupported("random_ up to the dtype's maximum")
    if to <= from_:
        raise Unsupported("an empty range (the CPU raises PyTorch's error)")
    span = to - from_
    if span > _MAX_ELEMENTS:
        raise Unsupported(f"a range wider than 2^24 ({span})")
    steps = uniform01(list(self.shape), generator=generator).binary("mul", float(span)).unary("floor")
    if self.dtype in _SIGNIFICAND:
        return steps.binary("add", float(from_)).cast(self.dtype)
    return steps.cast("i64").binary("add", int(from_)).cast(self.dtype)


#: `random_()`'s range without bounds, [0, top]: a float dtype's integers
#: with no gap (2^significand), an integer dtype's largest value.
_RANDOM_TOP = {"f32": 1 << 24, "bf16": 1 << 8, "f16": 1 << 11, "i32": (1 << 31) - 1, "i64": (1 << 63) - 1}


def _bits(shape: list[int], bits: int, generator: Any) -> ET:
    """i64 integers of `bits` uniform bits (at most 63): the top bits of
    24-bit draws, one more draw for every 24 bits."""
    n = _numel(shape)
    out = None
    while bits > 0:
        take = min(bits, 24)
        word = _permuted(n, generator)
        if take < 24:
            word = word.binary("div", float(1 << (24 - take))).unary("floor")
        word = word.cast("i64")
        out = word if out is None else out.binary("mul", 1 << take).binary("add", word)
        bits -= take
    assert out is not None
    return out.reshape(shape)


@lower("random.default")
def random(self: ET, *, generator: Any = None) -> ET:
    """`random_()`: integers on [0, top] (`_RANDOM_TOP`; bool: 0 or 1).
    Ranges of a power of two take the draws' top bits, exactly uniform; the
    others scale a draw to the range (bias below range / 2^24, or 2^-24 for
    f32's [0, 2^24], which scales a 48-bit draw)."""
    generator = _device_generator(generator)
    if self.dtype == "bool":
        return random_int(self, 0, 2, generator=generator)
    top = _RANDOM_TOP[self.dtype]
    if (top + 1) & top == 0:  # 2^b - 1: b bits
        return _bits(list(self.shape), top.bit_length(), generator).cast(self.dtype)
    if top < _MAX_ELEMENTS:
        return random_int(self, 0, top + 1, generator=generator)
    # floor((a 2^24 + b) (2^24 + 1) / 2^48) for two 24-bit draws a and b is
    # a, plus 1 where a + b >= 2^24: every step exact in f32.
    shape = list(self.shape)
    n = _numel(shape)
    a, b = _permuted(n, generator), _permuted(n, generator)
    carry = a.binary("ge", b.binary("mul", -1.0).binary("add", float(_MAX_ELEMENTS)))
    return a.binary("add", carry.cast("f32")).reshape(shape).cast(self.dtype)


# ---- permutations and categorical draws -----------------------------------------


@lower("randperm.default", "randperm.generator")
def randperm(
    n: int,
    *,
    generator: Any = None,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> ET:
    """The ranks of n distinct keyed draws (`_permuted`): element i is the
    number of draws below draw i, so the result is a permutation of 0..n-1
    whose order the keys decide. The ranks cost an n x n comparison; past
    `ONE_HOT_LIMIT` the draws' positions in sorted order are taken instead,
    from a sorting network (another permutation of the same draws)."""
    generator = _device_generator(generator)
    name = dt(dtype if dtype is not None else torch.int64)
    if n < 0 or name == "bool":
        raise Unsupported("a negative n or a bool randperm (the CPU raises PyTorch's error)")
    if name in _SIGNIFICAND and n > 1 << _SIGNIFICAND[name]:
        raise Unsupported("a randperm past the dtype's exact integers")
    if n == 0:
        return eng().full(0.0, [0], name)
    keys = _permuted(n, generator)
    if n * n > ONE_HOT_LIMIT:
        return _network_order(keys).cast(name)
    return _ranks(keys, False).cast(name)


#: The key of a zero weight: below every other key, and finite (Debug mode
#: checks every op's output for infinities).
_NEVER = -3.0e38


def _categorical_keys(weights: ET, draws: list[int], generator: Any) -> ET:
    """log(w) + Gumbel noise of shape `draws` (the weights broadcast to it):
    the largest key of a row is a draw from the categorical distribution of
    its weights, and the k largest are k draws without replacement in the
    order they were drawn (the Gumbel-max and Gumbel-top-k tricks). u takes
    23 bits plus half a step, so it lies inside (0, 1) and both logs are
    finite; a zero weight's key is `_NEVER`."""
    w = weights.cast("f32")
    positive = w.binary("gt", 0.0)
    log_w = positive.where_(w, eng().full(1.0, [], "f32")).unary("log")
    u = uniform01(draws, 23, generator).binary("add", 2.0**-24)
    gumbel = u.unary("log").unary("neg").unary("log").unary("neg")
    return positive.where_(log_w, eng().full(_NEVER, [], "f32")).binary("add", gumbel)


@lower("multinomial.default")
def multinomial(self: ET, num_samples: int, replacement: bool = False, *, generator: Any = None) -> ET:
    """Draws `num_samples` category indices per row of weights. Invalid
    weights (negative, inf, NaN, a row of zeros) cost one flag read and go
    to the CPU for PyTorch's error. Without replacement, a row with fewer
    positive weights than draws continues with its zero-weight categories
    in order, as PyTorch's CPU kernel does."""
    generator = _device_generator(generator)
    if self.dtype not in _SIGNIFICAND or len(self.shape) not in (1, 2):
        raise Unsupported("multinomial of a non-float or non-1D/2D tensor (PyTorch raises)")
    n = self.shape[-1]
    rows = self.shape[0] if len(self.shape) == 2 else 1
    k = int(num_samples)
    if n == 0 or k <= 0 or (not replacement and k > n):
        raise Unsupported("an empty distribution or sample (PyTorch raises)")
    w = self.reshape([rows, n]).cast("f32")
    if rows:
        bad = w.binary("lt", 0.0).binary("logical_or", w.binary("ne", w))
        bad = bad.binary("logical_or", w.binary("eq", math.inf))
        positive = w.binary("gt", 0.0).cast("i64").reduce("sum", [-1], True)
        bad = bad.binary("logical_or", positive.binary("eq", 0))
        _refuse_if(bad, "invalid multinomial weights (the CPU raises PyTorch's error)")
    if replacement or k == 1:
        # Each draw is the largest of its own keys.
        if rows * k * n > _MAX_ELEMENTS:
            raise Unsupported("a multinomial of more than 2^24 keys")
        keys = _categorical_keys(w.reshape([rows, 1, n]), [rows, k, n], generator)
        picked = keys.arg_reduce("argmax", -1, False)
    else:
        _check_square(rows, n)
        keys = _categorical_keys(w, [rows, n], generator)
        index = eng().arange(0, n, 1, "i64").expand([rows, n])
        picked = _place(_ranks(keys, True), index, k)
    return picked.reshape(list(self.shape[:-1]) + [k])
