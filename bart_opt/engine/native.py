"""bart_opt's own CPU kernel for decoding attention in bfloat16, used by the fast mode and by the int8 mode's
bfloat16 attention state (`bart_opt.engine.quantize.attention_state_dtype`).

The kernel (`bart_opt/engine/csrc/decode_attention.cpp`) has two builds (`BUILDS`): one for AVX512-BF16, which reads
and multiplies bfloat16 natively, and one for AVX2 with FMA, which widens bfloat16 to float32 with a shift (any
AVX2 CPU: AMD Zen 1-3, Intel since Haswell). `kernel_isa` picks the best this CPU runs; torch's extension
builder compiles it the first time it is asked for (30-90 s, then cached by torch under `TORCH_EXTENSIONS_DIR`,
by default `~/.cache/torch_extensions`). Where the CPU has neither (or a limit keeps torch below AVX2:
`bart_opt.engine.hardware`), or it cannot be built (no ninja, which the ``fast`` extra installs, or no C++ compiler),
the modes log why once and run torch's attention kernel instead: only the speed differs.

The kernel spreads its (row, head) pairs over torch's intra-op threads (`torch.set_num_threads`;
the module's `parallel_threads()` says how many its loop runs on), each pair on one thread in one
order, so its bits do not depend on the thread count. Both builds keep scores, softmax and the weighted sum
in float32 and round once, so each is closer to float32 attention than torch's flash kernel, which rounds the
softmax weights to bfloat16 before the second product; the two builds may differ from each other in the last
float32 bits (exp and the sums' order), so the ids they lead to are tested as near-ties, not as equal
(docs/fidelity.md, "The test policy").

Measured on a 2-core Zen 4 CPU (AVX512-BF16 build), one thread, bart-base shape, against torch's flash kernel
on the same bfloat16 inputs: a cross-attention call of one input's 4 beams over 1,024 keys
0.42 -> 0.20 ms; self-attention of 48 beams over 70 and 140 cached positions 5.0 -> 0.35 ms and
9.0 -> 0.61 ms (best of 3). The AVX2 build's figures are in docs/cpu.md.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

from bart_opt.engine import hardware

SOURCE = Path(__file__).with_name("csrc") / "decode_attention.cpp"
HEAD_DIMS = (32, 64, 96, 128)  # the head widths the kernel is built for (BART's: 64)

log = logging.getLogger(__name__)


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU has the AVX512-BF16 instructions the kernel is built from and torch runs bfloat16
    natively (no limit such as ``ATEN_CPU_CAPABILITY=avx2`` in force: `bart_opt.engine.hardware`)."""
    cpu = hardware.probe()
    return "avx512_bf16" in cpu.flags and cpu.native_bf16


def kernel_isa() -> str | None:
    """Which build of the kernel runs here: "avx512_bf16", "avx2" (AVX2 and FMA, which every AVX2 CPU has; torch
    not limited below it), or None."""
    if cpu_has_avx512_bf16():
        return "avx512_bf16"
    cpu = hardware.probe()
    return "avx2" if "avx2" in cpu.flags and cpu.torch_isa.startswith(("AVX2", "AVX512")) else None


BUILDS = {"avx512_bf16": ("bart_opt_decode_attention", ["-mavx512f", "-mavx512bf16"]),
          "avx2": ("bart_opt_decode_attention_avx2", ["-mavx2", "-mfma"])}
"""The module name and ISA flags of each build (not -march=native: torch's build cache is keyed on source and
flags, so a cache shared across machines must not hold code for one CPU model only)."""


def kernel():
    """The compiled kernel module for this CPU (`kernel_isa`), built on first use; None where it cannot run here
    (logged once)."""
    return build(kernel_isa())


def runnable_isas() -> tuple[str, ...]:
    """The builds this CPU can execute, whichever `kernel_isa` picks: an AVX512-BF16 CPU runs the AVX2 build too
    (the tests hold both where they can)."""
    return ((("avx512_bf16",) if cpu_has_avx512_bf16() else ()) + (("avx2",) if kernel_isa() is not None else ()))


@functools.cache
def build(isa: str | None):
    """The kernel module built for `isa` (a key of `BUILDS`), compiled on first use and cached by torch; None for
    None or where the build fails (logged once)."""
    if isa is None:
        log.warning("bart_opt's attention kernel: this CPU lacks AVX512-BF16 and AVX2 (or torch is limited below "
                    "them); decoding attention uses torch's kernel")
        return None
    from torch.utils.cpp_extension import is_ninja_available, load

    if not is_ninja_available():
        log.warning("bart_opt's attention kernel needs ninja to build (pip install 'bart-opt[fast]'); decoding "
                    "attention uses torch's kernel")
        return None
    name, flags = BUILDS[isa]
    try:
        # -fopenmp: at::parallel_for is OpenMP code in torch's headers; without it the kernel runs on one
        # thread whatever torch.set_num_threads says. The process's libgomp (torch's own) is the one used.
        return load(name, [str(SOURCE)], extra_cflags=["-O3", *flags, "-fopenmp"], extra_ldflags=["-fopenmp"])
    except Exception as error:  # a missing compiler or ninja shows as one of several error types
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        log.warning("building bart_opt's attention kernel failed (%s); decoding attention uses torch's kernel",
                    reason)
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
    `bart_opt.engine.cache.KVCache`). Only where `handles(q, d)`; elsewhere a RuntimeError."""
    if kernel() is None:
        raise RuntimeError("bart_opt's attention kernel is not available here (see the warning logged by bart_opt.engine.native)")
    if out is None:
        g, h, m, d = q.shape
        out = q.new_empty(g, m, h, d).transpose(1, 2)  # (G, H, M, d) view of (G, M, H, d)
    kernel().decode_attention(q, k, v, out, scale, rows)
    return out
