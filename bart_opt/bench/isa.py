"""Which instruction set each engine's libraries really run on, in their own words: the check behind
``bart-opt bench --peers ctranslate2 --isa avx2``.

The limits (`bart_opt.engine.hardware.AVX2_LIMITS`, and ``CT2_FORCE_CPU_ISA`` for CTranslate2) are read
by each library at its start, so they are checked in a fresh process with the same environment
as the engines', with the libraries' verbose switches on, running one small product each:

* ATen: `torch.backends.cpu.get_cpu_capability()`;
* oneDNN: its ``isa:`` line (``ONEDNN_VERBOSE=1``);
* MKL, torch's and the one linked into CTranslate2: its banner (``MKL_VERBOSE=1``);
* CTranslate2: its ``Selected ISA`` line (``CT2_VERBOSE=1``), after loading the converted model;
* fbgemm says nothing about itself: its limit (``FBGEMM_ENABLE_INSTRUCTIONS``) is reported as set.
  Timed instead when this was written: a (48, 768) x (768, 3072) int8 product 0.27 ms with the other
  limits only, 0.58-0.72 ms with it (docs/cpu.md).

Measured on this AVX-512 machine without ``MKL_ENABLE_INSTRUCTIONS``, CTranslate2 selected its AVX2
code even unforced, while the MKL inside it ran AVX-512 with AMX int8: ``CT2_FORCE_CPU_ISA`` alone
does not limit CTranslate2 int8's products; every engine gets every limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bart_opt.engine import hardware

ISAS = ("native", "avx2")
VERBOSE = {"ONEDNN_VERBOSE": "1", "MKL_VERBOSE": "1", "CT2_VERBOSE": "1"}


def isa_env(isa: str) -> dict[str, str]:
    """The environment that limits every engine's libraries to `isa` ("native": nothing set)."""
    if isa not in ISAS:
        raise ValueError(f"isa {isa!r} is not one of {list(ISAS)}")
    return {} if isa == "native" else {**hardware.AVX2_LIMITS, "CT2_FORCE_CPU_ISA": "AVX2"}


def parse(text: str, mkl: str = "mkl") -> dict[str, str]:
    """The ISA each library reported in `text` (one probe's output), by library; MKL's under the name `mkl`."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("bart_opt_probe "):
            found.update(json.loads(line.removeprefix("bart_opt_probe ")))
        elif "onednn_verbose" in line and ",isa:" in line:
            found["onednn"] = _isa_words(line.split(",isa:", 1)[1])
        elif line.startswith("MKL_VERBOSE") and "Intel(R) 64 architecture" in line:
            found[mkl] = _isa_words(line)
        elif "Selected ISA:" in line:
            found["ctranslate2"] = line.split("Selected ISA:", 1)[1].strip()
    return found


UNKNOWN = "unknown"
"""What a library that does not name its ISA reports: MKL on an AMD processor prints "Intel(R) Architecture
processors" and no instruction set (seen on an AMD EPYC, family 25, oneMKL 2024.0)."""


def _isa_words(text: str) -> str:
    """"AVX2", "AVX-512", "AVX-512+AMX" ... from a library's description of its ISA; `UNKNOWN` when it names none."""
    if "AVX-512" in text or "AVX512" in text or "AVX10" in text:
        isa = "AVX-512"
    elif "AVX2" in text:
        isa = "AVX2"
    else:
        return UNKNOWN
    return isa + ("+AMX" if "Advanced Matrix Extensions" in text or "Intel AMX" in text else "")


def report(env: dict[str, str], ct2_folder: str | None = None) -> tuple[dict[str, str], dict]:
    """What the libraries run on in a fresh process with `env` (torch's; CTranslate2's too given its
    converted model), by library, fbgemm's limit as set; and that process's
    `bart_opt.engine.hardware.CpuCapability` (as a dict)."""
    full = {**os.environ, **env, **VERBOSE}
    found: dict[str, str] = {}
    capability: dict = {}
    for args in (["torch"], *([["ctranslate2", ct2_folder]] if ct2_folder else [])):
        run = subprocess.run([sys.executable, "-m", "bart_opt.bench.isa", *args], env=full, capture_output=True,
                             text=True, timeout=300)
        if run.returncode:
            raise RuntimeError(f"the ISA probe ({' '.join(args)}) failed: {run.stderr.strip()[-500:]}")
        found.update(parse(run.stdout + "\n" + run.stderr, mkl="mkl" if args[0] == "torch" else "ctranslate2_mkl"))
        capability = capability or json.loads(next(line.removeprefix("bart_opt_capability ") for line in
                                                    run.stdout.splitlines() if line.startswith("bart_opt_capability ")))
    found["fbgemm"] = env.get("FBGEMM_ENABLE_INSTRUCTIONS", "native (not self-reported)")
    return found, capability


def unmet(found: dict[str, str], isa: str) -> list[str]:
    """The libraries in `found` that reported another ISA than `isa` ("avx2"; nothing for "native"). One that
    names none (`UNKNOWN`) cannot be held to it and is not counted: the CPU line shows it as unknown."""
    if isa == "native":
        return []
    return [f"{lib}: {value}" for lib, value in found.items() if value.upper() not in ("AVX2", UNKNOWN.upper())]


def _probe_torch() -> None:
    import torch
    import torch.nn.functional as F

    x, w = torch.randn(64, 256), torch.randn(256, 256)
    F.linear(x, w)  # MKL's SGEMM: its banner
    if torch.backends.mkldnn.is_available():
        torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")  # oneDNN: its isa line
    print("bart_opt_probe " + json.dumps({"aten": torch.backends.cpu.get_cpu_capability()}), flush=True)
    print("bart_opt_capability " + json.dumps(hardware.probe().as_dict()), flush=True)


def _probe_ctranslate2(folder: str) -> None:
    import ctranslate2

    translator = ctranslate2.Translator(folder, device="cpu", compute_type="int8", intra_threads=1)
    translator.translate_batch([["id0", "id2"]], max_decoding_length=2)


if __name__ == "__main__":
    _probe_torch() if sys.argv[1] == "torch" else _probe_ctranslate2(sys.argv[2])
