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

from .. import _generator
from .._engine import Tensor as ET
from ._registry import Unsupported, eng, lower

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


def standard_normal(shape: list[int], generator: Any = None) -> ET:
    """f32 standard normal values (Box-Muller on two independent draws)."""
    n = _numel(shape)
    if n == 0:
        return eng().full(0.0, shape, "f32")
    u1 = (
        uniform01([n], generator=generator).binary("mul", -1.0).binary("add", 1.0)
    )  # (0, 1]: its log is finite
    u2 = uniform01([n], generator=generator)
    radius = u1.unary("log").binary("mul", -2.0).unary("sqrt")
    return radius.binary("mul", u2.binary("mul", 2.0 * math.pi).unary("cos")).reshape(shape)


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
    u = uniform01(list(self.shape), generator=generator).binary("mul", -1.0).binary("add", 1.0)  # (0, 1]
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
