"""What this processor runs fast, probed once: the owner of `dtype="auto"` and of the ISA key.

Three libraries decide how a CPU product rounds and how fast it runs, and each reads the
processor and its own limit on its own:

* ATen's vectorized kernels (softmax, layer norm, attention): `torch.backends.cpu.get_cpu_capability()`,
  limited by ``ATEN_CPU_CAPABILITY``;
* oneDNN's products (the default mode's projections, bfloat16 everywhere): its own ISA, limited by
  ``ONEDNN_MAX_CPU_ISA``; `torch.ops.mkldnn._is_mkldnn_bf16_supported()` says whether it has native
  bfloat16 kernels under that limit;
* fbgemm's int8 products (`bart_opt.engine.quantize`): limited by ``FBGEMM_ENABLE_INSTRUCTIONS``
  (and MKL, transformers' float32 GEMM, by ``MKL_ENABLE_INSTRUCTIONS``).

`probe()` reads them all into one `CpuCapability`. Tests replace `probe` (``monkeypatch.setattr(
hardware, "probe", ...)``): every caller goes through the module attribute.

On an AVX-512 machine the four variables in `AVX2_LIMITS` make every library behave as on an
AVX2-only CPU (an AMD EPYC of family 25, say). The issue's three are not enough: without
``FBGEMM_ENABLE_INSTRUCTIONS`` fbgemm keeps its AVX-512 VNNI kernels (measured: a (48, 768) x
(768, 3072) int8 product 0.27 ms with it unset, 0.58-0.72 ms with it set to AVX2).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from bart_opt.engine.config import resolve_dtype

log = logging.getLogger(__name__)

AVX2_LIMITS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
}
"""Environment that limits torch's libraries to AVX2 in a fresh process (they read it at import)."""

# The hardware flags that decide a mode's speed here (names as /proc/cpuinfo spells them).
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")

BF16_SLOWDOWN = (
    "a bfloat16 linear layer is 4.4-5.0x slower than a float32 one on such a CPU (at (48, 768) x (768, 3072): "
    "13.1 against 2.97 ms on an AMD EPYC with AVX2, 5.8 against 1.16 ms on a Xeon limited to AVX2; docs/cpu.md)")
"""The measured reason behind the warning for an explicit bfloat16 on such a CPU."""


@dataclass(frozen=True)
class CpuCapability:
    """This CPU as torch's libraries see it (see the module docstring)."""

    model: str  # the processor's name, as lscpu prints it ("" where unknown)
    flags: frozenset[str]  # the hardware's flags among `FLAGS`, whatever the limits say
    torch_isa: str  # torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...
    onednn_bf16: bool  # oneDNN has native bfloat16 kernels under its ISA limit
    limits: tuple[tuple[str, str], ...] = ()  # the `AVX2_LIMITS` variables set in this process

    @property
    def avx512(self) -> bool:
        """Whether ATen runs its AVX-512 kernels (the hardware has them and nothing limits it)."""
        return self.torch_isa.startswith("AVX512")

    @property
    def native_bf16(self) -> bool:
        """Whether bfloat16 runs natively: AVX512-BF16 or AMX in the hardware, used by oneDNN and ATen."""
        return bool({"avx512_bf16", "amx_bf16"} & self.flags) and self.onednn_bf16 and self.avx512

    @property
    def int8_vnni(self) -> bool:
        """Whether fbgemm and oneDNN run int8 products with AVX-512 VNNI (or AMX): no 16-bit overflow
        in their inner loop, so activations may use all 8 bits (`bart_opt.engine.quantize`)."""
        limited = dict(self.limits).get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper() in ("AVX2", "AVX512")
        return bool({"avx512_vnni", "amx_int8"} & self.flags) and self.avx512 and not limited

    @property
    def isa(self) -> str:
        """The key under which agreement figures are published: what decides the default mode's rounding
        (ATen's ISA, oneDNN's bfloat16 kernels and whether they use AMX), e.g. "AVX512+BF16+AMX", "AVX2"."""
        key = self.torch_isa
        if self.native_bf16:
            key += "+BF16" + ("+AMX" if "amx_bf16" in self.flags else "")
        return key

    def describe(self) -> str:
        """One line for a report: model, ISA and the flags that matter, and any limit in effect."""
        flags = ", ".join(f"{name} {'yes' if name in self.flags else 'no'}" for name in FLAGS)
        text = f"{self.model or 'unknown CPU'}; torch ISA {self.torch_isa}; {flags}"
        if self.limits:
            text += "; limited by " + " ".join(f"{k}={v}" for k, v in self.limits)
        return text

    def as_dict(self) -> dict:
        return {"model": self.model, "flags": sorted(self.flags), "torch_isa": self.torch_isa,
                "onednn_bf16": self.onednn_bf16, "native_bf16": self.native_bf16, "int8_vnni": self.int8_vnni,
                "isa": self.isa, "limits": dict(self.limits)}


@functools.cache
def probe() -> CpuCapability:
    """This process's `CpuCapability` (read once; the libraries read their limits at import anyway)."""
    model, flags = _cpuinfo()
    onednn_bf16 = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    limits = tuple((k, os.environ[k]) for k in AVX2_LIMITS if os.environ.get(k))
    return CpuCapability(model, frozenset(flags), torch.backends.cpu.get_cpu_capability(), onednn_bf16, limits)


def _cpuinfo() -> tuple[str, set[str]]:
    """The processor's name and its flags among `FLAGS`: from /proc/cpuinfo on Linux, else torch's cpuinfo."""
    if sys.platform.startswith("linux"):
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = ""
        model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
        words = next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())
        if words:
            return model, words & set(FLAGS)
    caps = getattr(torch.cpu, "get_capabilities", dict)()  # torch >= 2.10; spelled avx512_f there
    names = {"avx512f": "avx512_f"}
    return str(caps.get("cpu_name", "")), {f for f in FLAGS if caps.get(names.get(f, f))}


class DtypeChoice(NamedTuple):
    """A resolved dtype and why it was chosen (for logs and the service's /ready)."""

    dtype: torch.dtype
    reason: str


def choose_dtype(requested: DtypeChoice | torch.dtype | str | None, device: str | torch.device) -> DtypeChoice:
    """The dtype to run in on `device`, and why: the one owner of ``dtype="auto"``.

    ``"auto"`` (or None): float16 on CUDA; float32 on a CPU, with or without native bfloat16; the
    choice and its reason are logged (INFO, logger ``bart_opt.engine.hardware``).
    Where bfloat16 is native it is faster (the CTranslate2 benchmark: 1.4x float32 in the fast
    mode), but its ids equal transformers' float32 ids on 2 of 12 documents where float32's
    equal them on 12 of 12 (docs/cpu.md): a default's results must be the trustworthy ones,
    and bfloat16 stays one flag away. An explicit dtype is kept; bfloat16 on a CPU without
    native bfloat16 also logs `warn_slow_bfloat16`'s warning (once per process). A `DtypeChoice` is a
    choice already made (for `device`, by the caller that resolved it: `bart_opt.Summarizer.from_options`)
    and is returned as it is.
    """
    if isinstance(requested, DtypeChoice):
        return requested
    device = torch.device(device)
    if requested is None or requested == "auto":
        choice = _auto(device)
        log.info("dtype %s", choice.reason)
        return choice
    dtype = resolve_dtype(requested)
    reason = f"{str(dtype).removeprefix('torch.')}, as asked"
    if warn_slow_bfloat16(dtype, device):
        reason += f", though this CPU has no native bfloat16: {BF16_SLOWDOWN}"
    return DtypeChoice(dtype, reason)


def _auto(device: torch.device) -> DtypeChoice:
    """What ``dtype="auto"`` means on `device` (see `choose_dtype`)."""
    if device.type == "cuda":
        return DtypeChoice(torch.float16, "auto: float16 on CUDA")
    if device.type != "cpu":
        return DtypeChoice(torch.float32, f"auto: float32 on {device.type}")
    cpu = probe()
    if cpu.native_bf16:
        return DtypeChoice(torch.float32, f"auto: float32 on this CPU ({cpu.isa}), whose bfloat16 is native and "
                           "faster, for ids equal to transformers' float32 (choose bfloat16 or int8 for speed)")
    return DtypeChoice(torch.float32, f"auto: float32 on this CPU ({cpu.isa}): it has no native bfloat16 "
                       "(no AVX512-BF16 or AMX, or a limit set)")


def warn_slow_bfloat16(dtype: torch.dtype, device: str | torch.device) -> bool:
    """Whether `dtype` is bfloat16 on a CPU without native bfloat16; the first time, log why it is slow."""
    if dtype != torch.bfloat16 or torch.device(device).type != "cpu" or probe().native_bf16:
        return False
    _warn_once(f"bfloat16 runs emulated on this CPU ({probe().isa}: no AVX512-BF16 or AMX in use): {BF16_SLOWDOWN}; "
               "float32 (dtype='auto') or quantize='int8' is faster here")
    return True


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def host_reads_are_free(device: torch.device) -> bool:
    """Whether the host reading a tensor of `device` costs no more than the read: on a CPU. On a GPU it
    waits for every kernel queued before it (a sync: the GPU then idles while the host queues the next),
    so the default search's bookkeeping takes the sync-free form there where one exists at the price of
    some arithmetic (the n-gram ban: `bart_opt.engine.processors.process_scores`)."""
    return device.type == "cpu"


def fast_modes(cpu: CpuCapability) -> dict[str, str]:
    """Which modes are fast on `cpu`, each with a one-line verdict (for ``bart-opt check``; figures in docs/cpu.md)."""
    native = "fast: native bfloat16 products (oneDNN, AVX512-BF16" + (" and AMX)" if "amx_bf16" in cpu.flags else ")")
    slow = f"slow: emulated bfloat16 ({BF16_SLOWDOWN.split(' (')[0]})"
    int8 = ("fast: fbgemm's int8 products, " + ("AVX-512 VNNI, 8-bit activations" if cpu.int8_vnni
                                               else "no VNNI: 7-bit activations"))
    return {
        "float32 (auto)": "transformers' ids; oneDNN's float32 products" if torch.backends.mkldnn.is_available()
        else "transformers' ids; MKL's float32 products",
        "bfloat16": native if cpu.native_bf16 else slow,
        "bfloat16 --fast": native + "; bart_opt's AVX512-BF16 attention kernel" if cpu.native_bf16 else slow,
        "int8 (float32)": int8 + ("" if cpu.native_bf16 else "; the fastest mode here"),
        "int8 with bfloat16 --fast": int8 + "; with native bfloat16 attention: the fastest mode here" if cpu.native_bf16
        else slow,
    }
