"""bart_opt's own CPU kernel for decoding attention in bfloat16, used by the fast mode.

The kernel (`bart_opt/csrc/decode_attention.cpp`) needs AVX512-BF16 and is compiled on the
machine that runs it by torch's extension builder the first time it is asked for (about 30 s,
then cached by torch under `TORCH_EXTENSIONS_DIR`, by default `~/.cache/torch_extensions`).
Where the CPU lacks AVX512-BF16 (or a limit keeps torch below AVX-512: `bart_opt.hardware`), or
the build fails (no C++ compiler), the fast mode logs why once and runs torch's attention kernel
instead: only the speed differs.

The kernel spreads its (row, head) pairs over torch's intra-op threads (`torch.set_num_threads`;
the module's `parallel_threads()` says how many its loop runs on), each pair on one thread in one
order, so its bits do not depend on the thread count.

Measured on this 2-core Zen 4 CPU, one thread, bart-base shape, against torch's flash kernel
on the same bfloat16 inputs: a cross-attention call of one input's 4 beams over 1,024 keys
0.42 -> 0.20 ms; self-attention of 48 beams over 70 and 140 cached positions 5.0 -> 0.35 ms and
9.0 -> 0.61 ms (best of 3). It keeps scores, softmax and the weighted sum in float32 and rounds once,
so it is closer to float32 attention than the flash kernel, which rounds the softmax weights
to bfloat16 before the second product; but it rounds differently, so the ids it leads to are
not transformers' bfloat16 ids (see docs/fidelity.md, "The fast mode").
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

from bart_opt import hardware

SOURCE = Path(__file__).with_name("csrc") / "decode_attention.cpp"
HEAD_DIMS = (32, 64, 96, 128)  # the head widths the kernel is built for (BART's: 64)

log = logging.getLogger(__name__)


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU has the AVX512-BF16 instructions the kernel is built from and torch runs bfloat16
    natively (no limit such as ``ATEN_CPU_CAPABILITY=avx2`` in force: `bart_opt.hardware`)."""
    cpu = hardware.probe()
    return "avx512_bf16" in cpu.flags and cpu.native_bf16


@functools.cache
def kernel():
    """The compiled kernel module, built on first use; None where it cannot run here (logged once)."""
    if not cpu_has_avx512_bf16():
        log.warning("fast mode: this CPU lacks AVX512-BF16 (or torch is limited below it); decoding attention "
                    "uses torch's kernel")
        return None
    from torch.utils.cpp_extension import load

    try:
        # For any CPU with AVX512-BF16 (not -march=native: torch's build cache is keyed on source and flags,
        # so a cache shared across machines must not hold code for one CPU model only).
        # -fopenmp: at::parallel_for is OpenMP code in torch's headers; without it the kernel runs on one
        # thread whatever torch.set_num_threads says. The process's libgomp (torch's own) is the one used.
        return load("bart_opt_decode_attention", [str(SOURCE)],
                    extra_cflags=["-O3", "-mavx512f", "-mavx512bf16", "-fopenmp"], extra_ldflags=["-fopenmp"])
    except Exception as error:  # a missing compiler or ninja shows as one of several error types
        log.warning("fast mode: building bart_opt's attention kernel failed (%s); decoding attention uses "
                    "torch's kernel", str(error).splitlines()[0] if str(error) else type(error).__name__)
        return None


def handles(x: torch.Tensor, head_dim: int) -> bool:
    """Whether `decode_attention` takes heads of `head_dim` in `x`'s dtype and device here: bfloat16 on a
    CPU, a width in `HEAD_DIMS`, and the kernel available."""
    return x.dtype == torch.bfloat16 and x.device.type == "cpu" and head_dim in HEAD_DIMS and kernel() is not None


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     out: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v without a mask: q (G, H, M, d), k and v (G, H, N, d), any strides with
    a contiguous last dimension; written into `out` (G, H, M, d) when given, else into a new tensor laid
    out (G, M, H, d) underneath so that merging the heads is a view. `rows` (G, N) int32, rows contiguous:
    position j of group g is read from group `rows[g, j]` of k and v (an indirect cache,
    `bart_opt.cache.KVCache`). Only where `handles(q, d)`; elsewhere a RuntimeError."""
    if kernel() is None:
        raise RuntimeError("bart_opt's attention kernel is not available here (see the warning logged by bart_opt.native)")
    if out is None:
        g, h, m, d = q.shape
        out = q.new_empty(g, m, h, d).transpose(1, 2)  # (G, H, M, d) view of (G, M, H, d)
    kernel().decode_attention(q, k, v, out, scale, rows)
    return out
