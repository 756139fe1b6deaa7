"""LSTM and GRU cells on `tpu`.

On every device but the CPU, PyTorch runs the cells of `nn.LSTM`, `nn.GRU`,
`nn.LSTMCell` and `nn.GRUCell` through two fused ops,
`_thnn_fused_lstm_cell` and `_thnn_fused_gru_cell`, whose only kernels are
CUDA's; their backward ops likewise. Here they are the CPU's cell written
out in torch ops (same gate order, same formulas) and registered above
autograd as well as for the device, so autograd differentiates those ops
(the fused backward ops are never called) and DeferAndFuse fuses a step's
gates into one loop like any elementwise chain.

The third output of the LSTM cell and the second of the GRU cell are
CUDA's workspace for its backward kernel: the activated gates (and, for the
GRU, `hx` and the hidden new gate), laid out as CUDA lays them out. Nothing
here reads them, and DeferAndFuse never computes them unless a caller does.
"""

from __future__ import annotations

from typing import Callable

import torch


def _biased(gates: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return gates if bias is None else gates + bias


def lstm_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    cx: torch.Tensor,
    input_bias: torch.Tensor | None = None,
    hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gates = _biased(input_gates, input_bias) + _biased(hidden_gates, hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def gru_cell(
    input_gates: torch.Tensor,
    hidden_gates: torch.Tensor,
    hx: torch.Tensor,
    input_bias: torch.Tensor | None = None,
    hidden_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    ir, iz, in_ = _biased(input_gates, input_bias).chunk(3, 1)
    hr, hz, hn = _biased(hidden_gates, hidden_bias).chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = (hx - n) * z + n
    return hy, torch.cat([r, z, n, hx, hn], 1)


#: The fused cell ops, by name, and their torch-op form.
CELLS: dict[str, Callable[..., tuple[torch.Tensor, ...]]] = {
    "_thnn_fused_lstm_cell": lstm_cell,
    "_thnn_fused_gru_cell": gru_cell,
}
