"""The matrix-product kernel behind every projection, chosen per mode.

transformers' BART runs its float32 projections through `F.linear`, which on a CPU is MKL's
GEMM; exact mode must use the same kernel to round the same way. The default mode may round
differently in the last bits, and on a CPU in float32 oneDNN's inner product is faster on the
same plain weights: measured on this 2-core CPU, one thread, decoder-step shapes (48 rows)
1.1-1.2x for the layers' projections and 1.9x for the 50k-wide vocabulary projection. It reads
the weights as they are stored (no prepacked copy, so no memory beside the weights); a
prepacked copy would be 10-20% faster again at the price of a second copy of every weight.
bfloat16 `F.linear` already runs through oneDNN on a CPU, and CUDA has its own GEMMs, so both
keep `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def uses_onednn(x: torch.Tensor) -> bool:
    """Whether `linear(x, ..., fast=True)` takes oneDNN's kernel: float32 on a CPU with oneDNN."""
    return ONEDNN and x.dtype == torch.float32 and x.device.type == "cpu"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fast: bool) -> torch.Tensor:
    """`x @ weight.T + bias` over (..., K) -> (..., N); `fast` allows oneDNN's kernel (see module docstring)."""
    if fast and uses_onednn(x) and not torch.is_grad_enabled():
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """`nn.Linear` whose kernel follows `exact` (set by `Bart.exact`): `F.linear` in exact mode,
    `linear(..., fast=True)` otherwise."""

    exact = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, fast=not self.exact)
