"""Helpers the binding's tests share (fixtures are in conftest.py)."""

import torch


def on_tpu(fn, *args, **kwargs):
    """`fn` on `tpu` copies of its tensor arguments, with its tensor results
    (alone, or in a tuple or a torch.return_types) copied back to the CPU."""

    def to_tpu(x):
        return x.to("tpu") if isinstance(x, torch.Tensor) else x

    def to_cpu(x):
        return x.cpu() if isinstance(x, torch.Tensor) else x

    out = fn(*map(to_tpu, args), **{k: to_tpu(v) for k, v in kwargs.items()})
    if isinstance(out, (tuple, list)):
        return type(out)([to_cpu(o) for o in out])
    return to_cpu(out)
