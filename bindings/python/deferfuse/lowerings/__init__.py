"""aten ops as engine ops. Each lowering gets the op's arguments with `tpu`
tensors replaced by engine tensors (and CPU zero-dimensional tensors by Python
numbers) and returns engine tensors. It raises `Unsupported` for arguments it
does not handle, and the op then runs through the CPU fallback.

One module per family; importing them fills `LOWERINGS`.
"""

from . import (  # noqa: F401  (they register)
    binning,
    elementwise,
    factories,
    householder,
    linalg,
    lookups,
    matmul,
    nn,
    pooling,
    random,
    reductions,
    scatter,
    search,
    sorting,
    windows,
)
from ._registry import LOWERINGS, Unsupported
from .matmul import convolution, convolution_backward

__all__ = ["LOWERINGS", "Unsupported", "convolution", "convolution_backward"]
