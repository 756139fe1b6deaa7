"""`GradScaler`'s two bookkeeping ops, on the engine.

PyTorch's CPU kernels would read every gradient back to the host on each
scaler step (and, in DeferAndFuse, flush the backward pass to do so). Built
from engine ops, the non-finite check, the unscaling and the scale update
become part of the pending trace; the only value the step reads is the one
`found_inf` flag that `GradScaler.step` reads itself, as it does on CUDA.

The results equal the CPU kernels' bit for bit: a gradient is multiplied by
the float32 inverse scale in float32 (in float32 too for float16 and
bfloat16 gradients, then rounded once), and the scale is multiplied by the
growth or backoff factor rounded to float32. (The CPU kernel multiplies the
float32 scale by the factor in float64 before rounding: the same for the
default factors 2.0 and 0.5, and for any factor that float32 holds exactly.)
"""

from __future__ import annotations

import functools
import struct

import torch


def non_finite_check_and_unscale_(
    grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    """`_amp_foreach_non_finite_check_and_unscale_`: set `found_inf` to 1 if
    any gradient holds an inf or a NaN, and multiply every gradient by
    `inv_scale`, in place."""
    if not grads:
        return
    for g in grads:
        if not g.is_floating_point():
            raise RuntimeError(
                f"_amp_foreach_non_finite_check_and_unscale_: gradients must be floating point, got {g.dtype}"
            )
    bad = torch.stack([torch.isfinite(g).logical_not().any() for g in grads]).any()
    found_inf.copy_(torch.where(bad, torch.ones_like(found_inf), found_inf))
    for g in grads:
        if g.dtype == torch.float32:
            g.mul_(inv_scale)
        else:
            g.copy_(g.float() * inv_scale)


def update_scale_(
    scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> torch.Tensor:
    """`_amp_update_scale_`: after a step with an inf or NaN, back off the
    scale and restart counting; after `growth_interval` clean steps in a
    row, grow it (unless it would overflow) and restart counting."""
    overflow = found_inf > 0
    counted = growth_tracker + 1
    grow = overflow.logical_not() & (counted == growth_interval)
    # Grow only a scale whose product stays finite, and never compute the
    # infinite product (Debug mode would report it as the op's output).
    fits = scale <= _largest_growable(growth_factor)
    grown = torch.where(fits, scale, torch.zeros_like(scale)) * growth_factor
    grown = torch.where(fits, grown, scale)
    new_scale = torch.where(overflow, scale * backoff_factor, torch.where(grow, grown, scale))
    growth_tracker.copy_(torch.where(overflow | grow, torch.zeros_like(counted), counted))
    scale.copy_(new_scale)
    return scale


@functools.lru_cache(maxsize=16)
def _largest_growable(factor: float) -> float:
    """The largest float32 `s` whose float32 product with `factor` is
    finite (products grow with `s`: a binary search over the bit patterns
    of the positive float32 values)."""
    f = torch.tensor(factor, dtype=torch.float32)

    def finite(bits: int) -> bool:
        s = struct.unpack("<f", struct.pack("<I", bits))[0]
        return bool(torch.isfinite(torch.tensor(s, dtype=torch.float32) * f))

    lo, hi = 0, 0x7F800000  # +0.0 and +inf
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if finite(mid) else (lo, mid)
    return struct.unpack("<f", struct.pack("<I", lo))[0]
