"""The `tpu` device generator: a counter-based generator with CUDA's
Philox-style state, a 64-bit seed and a 64-bit offset.

Each random op takes the next offset(s) and draws a per-call key from
(seed, offset) on the host (SplitMix64, cheap and well mixed); the engine then
computes element `i`'s value as a keyed 24-bit permutation of `i`
(`lowerings/random.py`). The key reaches the engine as scalar operands,
which are runtime inputs: a training loop's dropout records the same trace
every step and hits the caches.

The numbers differ from the CPU generator's stream (as CUDA's do); what is
promised is the distribution and reproducibility for a given seed and
sequence of calls.
"""

from __future__ import annotations

import random
import threading

import torch

_MASK = (1 << 64) - 1
#: CUDA's default seed, so an unseeded program starts where CUDA's does (not the same numbers).
DEFAULT_SEED = 67280421310721

_lock = threading.Lock()
_seed = DEFAULT_SEED
_offset = 0


def splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def manual_seed(seed: int) -> None:
    global _seed, _offset
    seed = int(seed)
    if not -(1 << 63) <= seed < (1 << 64):
        raise RuntimeError(f"torch.tpu.manual_seed: seed must be within the range [-2^63, 2^64); got {seed}")
    with _lock:
        _seed, _offset = seed & _MASK, 0


def seed() -> int:
    """Seeds from a non-deterministic source and returns the seed."""
    s = random.SystemRandom().getrandbits(63)
    manual_seed(s)
    return s


def initial_seed() -> int:
    return _seed


#: Draws taken by this process, never reset (seeding and set_state reset the
#: offset): lets a caller tell whether an op drew random numbers.
_draws = 0


def draws() -> int:
    return _draws


def next_keys(words: int, bits: int, generator: torch.Generator | None = None) -> list[int]:
    """Takes the next offset of `generator` (a `torch.Generator(device="tpu")`,
    whose seed and offset live in its C++ object; None: the default one) and
    returns `words` key words of `bits` bits each. A generator seeded like
    the default one draws the same numbers."""
    global _offset, _draws
    with _lock:
        if generator is None:
            seed, offset = _seed, _offset
            _offset += 1
        else:
            seed, offset = generator.initial_seed(), generator.get_offset()
            generator.set_offset(offset + 1)
        _draws += 1
        state = splitmix64(seed ^ splitmix64(offset))
    per_draw = 64 // bits
    out: list[int] = []
    while len(out) < words:
        state = splitmix64(state)
        for k in range(per_draw):
            out.append((state >> (k * bits)) & ((1 << bits) - 1))
    return out[:words]


def get_state() -> torch.Tensor:
    """16 bytes (seed, offset; little endian) as a CPU uint8 tensor, like CUDA's state tensor."""
    data = _seed.to_bytes(8, "little") + _offset.to_bytes(8, "little")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def set_state(state: torch.Tensor) -> None:
    global _seed, _offset
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        raise RuntimeError(
            "torch.tpu.set_rng_state: expected a uint8 tensor of 16 bytes (from torch.tpu.get_rng_state)"
        )
    data = bytes(state.cpu().contiguous().tolist())
    with _lock:
        _seed = int.from_bytes(data[:8], "little")
        _offset = int.from_bytes(data[8:], "little")
