"""The matrix-product kernel behind every projection, chosen per mode.

transformers' BART runs its projections through `F.linear`, which on a CPU is MKL's GEMM in
float32; exact mode must use the same kernel to round the same way. The default mode may round
differently in the last bits, and on a CPU in float32 oneDNN's inner product is faster on the
same plain weights: measured on this 2-core CPU, one thread, decoder-step shapes (48 rows)
1.1-1.2x for the layers' projections and 1.9x for the 50k-wide vocabulary projection. It reads
the weights as they are stored (no prepacked copy, so no memory beside the weights); a
prepacked copy would be 10-20% faster again at the price of a second copy of every weight.

In bfloat16 on a CPU with oneDNN's bfloat16 kernels (AVX-512), `F.linear` already reaches oneDNN
(through its matmul), and calling oneDNN's inner product directly gives the same bits at every
shape measured (1 to 2,048 rows, with and without a bias) for less overhead: 1.07x at the decoder
step's (48, 768) x (768, 3072), 1.15x at (48, 768) x (768, 768), 1.07x at the encoder's
(2048, 768) x (768, 3072). The default mode takes it in both dtypes where the CPU allows. float16,
bfloat16 without those kernels, and CUDA keep `F.linear`.

oneDNN builds a primitive for each new shape and keeps it in two caches, its own and ideep's (torch's
wrapper), 1,024 entries each unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` and ``LRU_CACHE_CAPACITY``
say otherwise; an entry holds about 0.3 and 0.6 MB (its generated code) whatever the weight's size.
The default mode packs each batch's real tokens, so nearly every batch brings new row counts: a
server's RSS grew by about 650 MB over its first 1,400 CNN-like records before the caches filled. This
module bounds both caches at `PRIMITIVE_CACHE_CAPACITY` entries, unless those variables are already
set, before any primitive exists (the caches read them when first used). A decoder step's
projections need about 8 primitives, reused by every layer, so the bound costs no speed measured
(docs/engine.md, "oneDNN's primitive caches").
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
# oneDNN builds a bfloat16 inner product only on CPUs with AVX-512 (or AVX-NE-CONVERT); elsewhere
# `F.linear` has a kernel of its own and the direct call would fail.
ONEDNN_DTYPES = (torch.float32, torch.bfloat16) if ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported() else (
    torch.float32,)


PRIMITIVE_CACHE_CAPACITY = 64  # entries in each of oneDNN's two primitive caches (see the module docstring)
PRIMITIVE_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's
for _variable in PRIMITIVE_CACHE_VARIABLES:
    os.environ.setdefault(_variable, str(PRIMITIVE_CACHE_CAPACITY))


def uses_onednn(x: torch.Tensor) -> bool:
    """Whether `linear(x, ..., fast=True)` takes oneDNN's kernel: float32, and bfloat16 where the CPU
    has oneDNN's bfloat16 kernels, on a CPU with oneDNN."""
    return ONEDNN and x.dtype in ONEDNN_DTYPES and x.device.type == "cpu"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fast: bool) -> torch.Tensor:
    """`x @ weight.T + bias` over (..., K) -> (..., N); `fast` allows oneDNN's kernel (see module docstring)."""
    # Inductor lowers the direct call only for frozen (constant) weights: a compiled step takes F.linear.
    if fast and uses_onednn(x) and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """`nn.Linear` whose kernel follows `exact` (set by `Bart.exact`): `F.linear` in exact mode,
    `linear(..., fast=True)` otherwise."""

    exact = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, fast=not self.exact)
