"""The capability probe and the dtype it chooses: by capability (the probe replaced), with one warning
for bfloat16 where it is slow; the real probe under AVX2 limits in a fresh process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from bart_opt.engine import hardware
from bart_opt.engine.hardware import AVX2_LIMITS, CpuCapability

SAPPHIRE = CpuCapability("Intel(R) Xeon(R) Processor", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16",
                                                                 "amx_bf16", "amx_int8"}), "AVX512", True)
EPYC = CpuCapability("AMD EPYC 7B13", frozenset({"avx2"}), "AVX2", False)
LIMITED = CpuCapability("Intel(R) Xeon(R) Processor", SAPPHIRE.flags, "AVX2", False, tuple(AVX2_LIMITS.items()))


@pytest.fixture
def cpu(monkeypatch):
    """`cpu(capability)` makes the probe report it; the once-only warning is forgotten before and after."""
    hardware._warn_once.cache_clear()

    def use(capability: CpuCapability) -> None:
        monkeypatch.setattr(hardware, "probe", lambda: capability)

    yield use
    hardware._warn_once.cache_clear()


def test_capabilities_say_what_runs_natively():
    assert SAPPHIRE.native_bf16 and SAPPHIRE.int8_vnni and SAPPHIRE.isa == "AVX512+BF16+AMX"
    assert not EPYC.native_bf16 and not EPYC.int8_vnni and EPYC.isa == "AVX2"
    # An AVX-512 CPU limited to AVX2 is an AVX2 CPU for every library, whatever its flags say.
    assert not LIMITED.native_bf16 and not LIMITED.int8_vnni and LIMITED.isa == "AVX2"
    zen4 = CpuCapability("AMD Ryzen", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}), "AVX512", True)
    assert zen4.isa == "AVX512+BF16" and zen4.native_bf16
    skylake = CpuCapability("Intel Xeon Gold", frozenset({"avx2", "avx512f"}), "AVX512", False)
    assert skylake.isa == "AVX512" and not skylake.native_bf16 and not skylake.int8_vnni
    fbgemm_limited = CpuCapability("x", SAPPHIRE.flags, "AVX512", True, (("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2"),))
    assert fbgemm_limited.native_bf16 and not fbgemm_limited.int8_vnni
    line = EPYC.describe()
    assert line.startswith("AMD EPYC 7B13; torch ISA AVX2;") and "avx512_bf16 no" in line and "avx2 yes" in line
    assert "limited by ATEN_CPU_CAPABILITY=avx2" in LIMITED.describe()


def test_auto_is_float32_on_every_cpu_and_says_why(cpu, caplog):
    cpu(EPYC)
    with caplog.at_level(logging.INFO, logger="bart_opt.engine.hardware"):
        choice = hardware.choose_dtype("auto", "cpu")
    assert choice.dtype == torch.float32 and "no native bfloat16" in choice.reason and "AVX2" in choice.reason
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.INFO, f"dtype {choice.reason}")], \
        "auto logs its choice and never warns: it picked the fast dtype"
    cpu(SAPPHIRE)
    dtype, reason = hardware.choose_dtype(None, "cpu")
    assert dtype == torch.float32 and "bfloat16 is native" in reason and "transformers' float32" in reason
    assert hardware.choose_dtype("auto", "cuda") == (torch.float16, "auto: float16 on CUDA")
    assert hardware.choose_dtype("auto", "mps") == (torch.float32, "auto: float32 on mps")


def test_engine_options_resolve_auto_through_the_probe(cpu, caplog):
    from bart_opt.engine.options import EngineOptions

    cpu(EPYC)
    with caplog.at_level(logging.INFO, logger="bart_opt.engine.hardware"):
        assert EngineOptions(model="m").torch_dtype(torch.device("cpu")) == torch.float32
        assert EngineOptions(model="m", dtype="bfloat16").torch_dtype(torch.device("cpu")) == torch.bfloat16
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("dtype auto: float32 on this CPU (AVX2): it has no native bfloat16")
    assert sum("bfloat16 runs emulated on this CPU" in m for m in messages) == 1


def test_explicit_dtypes_are_kept(cpu):
    cpu(SAPPHIRE)
    assert hardware.choose_dtype("bf16", "cpu").dtype == torch.bfloat16
    assert hardware.choose_dtype(torch.float16, "cpu") == (torch.float16, "float16, as asked")
    with pytest.raises(ValueError, match="int4"):
        hardware.choose_dtype("int4", "cpu")


def test_bfloat16_without_native_support_warns_once_with_the_measured_reason(cpu, caplog):
    cpu(EPYC)
    with caplog.at_level(logging.WARNING, logger="bart_opt.engine.hardware"):
        first = hardware.choose_dtype("bfloat16", "cpu")
        hardware.choose_dtype(torch.bfloat16, "cpu")
        assert hardware.warn_slow_bfloat16(torch.bfloat16, "cpu")
    assert first.dtype == torch.bfloat16 and "4.4-5.0x slower than a float32 one" in first.reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert message.startswith("bfloat16 runs emulated on this CPU (AVX2") and "4.4-5.0x slower" in message
    caplog.clear()
    cpu(SAPPHIRE)
    hardware._warn_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="bart_opt.engine.hardware"):
        assert not hardware.warn_slow_bfloat16(torch.bfloat16, "cpu")
        assert not hardware.warn_slow_bfloat16(torch.float32, "cpu")
    assert caplog.text == ""


def test_loading_a_bfloat16_model_on_such_a_cpu_warns(cpu, caplog, make_checkpoint):
    from bart_opt import Bart

    cpu(EPYC)
    folder = make_checkpoint(with_tokenizer=False)
    with caplog.at_level(logging.WARNING, logger="bart_opt.engine.hardware"):
        Bart.from_pretrained(folder, dtype="bfloat16")
        Bart.from_pretrained(folder, dtype="bfloat16")
        Bart.from_pretrained(folder)
    assert sum("slower than a float32 one" in r.getMessage() for r in caplog.records) == 1


def test_fast_modes_name_the_slow_ones_and_the_fastest():
    modes = hardware.fast_modes(EPYC)
    assert modes["bfloat16"].startswith("slow: emulated bfloat16 (a bfloat16 linear layer is 4.4-5.0x slower")
    assert modes["bfloat16 --fast"] == modes["int8 with bfloat16 --fast"] == modes["bfloat16"]
    assert modes["int8 (float32)"].endswith("7-bit activations; the fastest mode here")
    fast = hardware.fast_modes(SAPPHIRE)
    assert fast["bfloat16"].startswith("fast") and "AMX" in fast["bfloat16"]
    assert "VNNI, 8-bit" in fast["int8 (float32)"] and fast["int8 with bfloat16 --fast"].endswith("the fastest mode here")


def test_the_real_probe_sees_the_avx2_limits():
    """In a fresh process with `AVX2_LIMITS` set, torch's libraries and the probe report AVX2; the flags
    still say what the hardware has."""
    code = "import json; from bart_opt.engine import hardware; print(json.dumps(hardware.probe().as_dict()))"
    here = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    env = {**os.environ, **AVX2_LIMITS}
    limited = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                        env=env).stdout)
    assert limited["torch_isa"] == "AVX2" and limited["isa"] == "AVX2"
    assert not limited["native_bf16"] and not limited["onednn_bf16"] and not limited["int8_vnni"]
    assert limited["limits"] == AVX2_LIMITS and limited["flags"] == here["flags"] and limited["model"] == here["model"]
