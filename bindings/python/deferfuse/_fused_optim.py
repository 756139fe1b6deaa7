"""The fused optimizer steps (`Adam(fused=True)`, `AdamW(fused=True)`,
`SGD(fused=True)`: `_fused_adam_`, `_fused_adamw_`, `_fused_sgd_`), on the
engine. The C++ layer runs the same steps without Python
(`bindings/src/native/ops.rs`) and leaves these Python kernels the
arguments it does not take (a learning rate on `tpu`, a view among the
tensors).

Each is the same arithmetic as PyTorch's CPU kernel, written as engine ops
on every parameter, so a step becomes part of the pending trace (one fused
kernel per parameter in DeferAndFuse) instead of reading every tensor back
to the CPU. Nothing is read on the host: the step count enters the bias
corrections as a tensor, and a `found_inf` flag (GradScaler) keeps every
tensor as it was through a `where`, where the CPU kernel returns early.
Parameters in bfloat16 or float16 are updated in float32 and rounded once,
as the CPU kernel does.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

Lr = Union[float, torch.Tensor]


def _math(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()


def _store(target: torch.Tensor, value: torch.Tensor, skip: Optional[torch.Tensor]) -> None:
    """`target = value`, or kept as it is where `skip` (found_inf) is set."""
    if skip is not None:
        value = torch.where(skip, _math(target), value)
    target.copy_(value)


def _power(base: float, step: torch.Tensor) -> torch.Tensor:
    """`base ** step` for a step count held in a tensor (no host read)."""
    if base == 0.0:
        return torch.zeros_like(step, dtype=torch.float32)
    return torch.exp(_math(step) * math.log(base))


def _gradient(
    grad: torch.Tensor, grad_scale: Optional[torch.Tensor], skip: Optional[torch.Tensor], maximize: bool
) -> torch.Tensor:
    """The gradient divided by GradScaler's scale (like the CPU kernel, the
    division is written back into the gradient), negated to maximize."""
    g = _math(grad)
    if grad_scale is not None:
        g = g / grad_scale
        _store(grad, g, skip)
    return -g if maximize else g


def _rate(lr: Lr) -> Lr:
    """A learning rate held in a CPU tensor is a number (reading it costs no
    device sync); one on `tpu` stays a tensor."""
    return lr.item() if isinstance(lr, torch.Tensor) and lr.device.type == "cpu" else lr


def _skip(found_inf: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if found_inf is None else found_inf == 1.0


def _adam(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    max_exp_avg_sqs: Sequence[torch.Tensor],
    state_steps: Sequence[torch.Tensor],
    *,
    lr: Lr,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    amsgrad: bool,
    maximize: bool,
    grad_scale: Optional[torch.Tensor],
    found_inf: Optional[torch.Tensor],
    decoupled: bool,
) -> None:
    skip, lr = _skip(found_inf), _rate(lr)
    for i, param in enumerate(params):
        p = _math(param)
        g = _gradient(grads[i], grad_scale, skip, maximize)
        if weight_decay != 0.0:
            if decoupled:
                p = p * (1.0 - lr * weight_decay)
            else:
                g = g + p * weight_decay
        exp_avg = _math(exp_avgs[i])
        exp_avg = exp_avg + (g - exp_avg) * (1.0 - beta1)
        exp_avg_sq = _math(exp_avg_sqs[i]) * beta2 + g * g * (1.0 - beta2)
        step = state_steps[i]
        step_size = lr / (1.0 - _power(beta1, step))
        correction2_sqrt = torch.sqrt(1.0 - _power(beta2, step))
        second = exp_avg_sq
        if amsgrad:
            second = torch.maximum(_math(max_exp_avg_sqs[i]), exp_avg_sq)
            _store(max_exp_avg_sqs[i], second, skip)
        denom = torch.sqrt(second) / correction2_sqrt + eps
        _store(exp_avgs[i], exp_avg, skip)
        _store(exp_avg_sqs[i], exp_avg_sq, skip)
        _store(param, p - step_size * exp_avg / denom, skip)


def adam_(*lists: Sequence[torch.Tensor], grad_scale=None, found_inf=None, **options) -> None:
    """`_fused_adam_` (and its `tensor_lr` overload)."""
    _adam(*lists, **options, grad_scale=grad_scale, found_inf=found_inf, decoupled=False)


def adamw_(*lists: Sequence[torch.Tensor], grad_scale=None, found_inf=None, **options) -> None:
    """`_fused_adamw_` (and its `tensor_lr` overload)."""
    _adam(*lists, **options, grad_scale=grad_scale, found_inf=found_inf, decoupled=True)


def sgd_(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    momentum_buffers: Sequence[torch.Tensor],
    *,
    weight_decay: float,
    momentum: float,
    lr: Lr,
    dampening: float,
    nesterov: bool,
    maximize: bool,
    is_first_step: bool,
    grad_scale: Optional[torch.Tensor] = None,
    found_inf: Optional[torch.Tensor] = None,
) -> None:
    """`_fused_sgd_` (and its `tensor_lr` overload)."""
    skip, lr = _skip(found_inf), _rate(lr)
    for i, param in enumerate(params):
        p = _math(param)
        g = _gradient(grads[i], grad_scale, skip, maximize)
        if weight_decay != 0.0:
            g = g + p * weight_decay
        if momentum != 0.0:
            buf = g if is_first_step else _math(momentum_buffers[i]) * momentum + g * (1.0 - dampening)
            _store(momentum_buffers[i], buf, skip)
            g = g + buf * momentum if nesterov else buf
        _store(param, p - g * lr, skip)
