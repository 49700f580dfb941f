"""Parity at a real width, in every dtype on CPU: exact mode identical, the default, the fast and the
int8 mode at their published agreement, per ISA.

The batch is the first padded batch of 8 of the published fidelity workload (docs/fidelity.md,
"On a CPU"; docs/cpu.md per ISA; `python -m bart_opt.bench.fidelity --shape d256 --threads 1`): d_model 256,
3+3 layers, 8 heads, inputs of 8-120 tokens, 40 new tokens, 4 beams, length_penalty 2.0,
no_repeat_ngram_size 3, on one thread as published.

The default's agreement is a property of the processor as much as of the code: which kernels the
libraries pick, and how they block a sum, decides which near-tie wins. So the figures are published
per ISA (`bart_opt.hardware.CpuCapability.isa`), each from the machines measured under that key,
and each ISA is held to its own: at least as many identical outputs, and every difference within
the published score gap. On an ISA with no published figures the counts are not held, and every
difference must still be a near-tie: within `NEAR_TIE`, the largest gap by which transformers'
own outputs differ when only the batch around an input changes (a property of the code's rounding,
not of one processor). Exact mode is identical everywhere.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BartForConditionalGeneration

import bart_opt.model as model_module
from bart_opt import Bart, hardware
from bart_opt.bench.fidelity import SHAPES, Workload, make_inputs, padded, sequence_score, strip

WORK = Workload()
NEAR_TIE = {"float32": 2.4e-3, "float16": 5.1e-3, "bfloat16": 8.1e-3}
"""transformers' own largest score gap between its outputs for one input alone and in a padded batch
(README, "Exact mode and fidelity": d256 in half precision; float32 at bart-base shape, where d256 has none)."""

# Per ISA and dtype: (identical outputs among these 8, the largest transformers score gap of an output
# that differed over all 40 inputs of the published run). "beam"/"greedy": the default mode; "fast":
# beam search in the fast mode (in float32 it is the default mode, tested as such); "int8": beam and
# greedy in the int8 mode (quantize="int8", float32), against transformers float32.
PUBLISHED = {
    # This machine: Intel Xeon (Sapphire Rapids class, family 6 model 167), AVX-512 with AVX512-BF16 and AMX.
    "AVX512+BF16+AMX": {
        "beam": {"float32": (8, 0.0), "float16": (6, 2.4e-3), "bfloat16": (3, 2.5e-3)},
        "greedy": {"float32": (8, 0.0), "float16": (8, 0.0), "bfloat16": (8, 0.0)},
        "fast": {"float16": (2, 5.3e-3), "bfloat16": (0, 6.7e-3)},
        "int8": {"beam": (0, 8.8e-2), "greedy": (0, 8.2e-2)},
    },
    # Two machines: an AMD EPYC (family 25 model 1, AVX2 only) as issue 26 reported it (beam 7, 5 and
    # at least 3 of 8; greedy 8 of 8; fast float16 at least 2; its gaps within the AVX-512 figures where
    # it passed, not scored where it failed), and this Xeon limited to AVX2 (bart_opt.hardware.AVX2_LIMITS:
    # beam 8, 5, 4; greedy 8, 7, 8; docs/cpu.md). Counts are the lower of the two, gaps the larger; the
    # float32 beam gap, measured on neither, is held to NEAR_TIE. The fast bfloat16 figures (torch's
    # attention: no AVX512-BF16 kernel) and int8 are the emulation's only.
    "AVX2": {
        "beam": {"float32": (7, NEAR_TIE["float32"]), "float16": (5, 2.4e-3), "bfloat16": (3, 2.7e-3)},
        "greedy": {"float32": (8, 0.0), "float16": (7, 2.4e-4), "bfloat16": (8, 0.0)},
        "fast": {"float16": (2, 5.3e-3), "bfloat16": (1, 4.6e-3)},
        "int8": {"beam": (0, 8.8e-2), "greedy": (0, 8.3e-2)},
    },
}
INT8_GAP = max(gap for figures in PUBLISHED.values() for _, gap in figures["int8"].values())
"""Where an ISA has no int8 figures: int8's gaps come from its quantization error, the same on both
ISAs measured (8-bit activations on AVX-512 VNNI, 7-bit on AVX2), and are no near-ties."""


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint) -> str:
    return make_checkpoint(with_tokenizer=False, init_std=0.2, eos_bias=0.0, **SHAPES["d256"])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=["float32", "float16", "bfloat16"])
def run(request, checkpoint):
    """transformers' and the three modes' outputs for the batch, greedy and beam, in one dtype."""
    dtype = getattr(torch, request.param)
    hf = BartForConditionalGeneration.from_pretrained(checkpoint, dtype=dtype).eval()
    ours = Bart.from_pretrained(checkpoint, dtype=dtype)
    inputs = make_inputs(ours.config, WORK)[: WORK.batch_size]
    ids, mask = padded(inputs, ours.config.pad_token_id)
    assert (mask == 0).any() and ids.shape[1] > 100, "a padded batch with long inputs"
    out = {"dtype": request.param, "hf": hf, "ours": ours, "inputs": inputs}
    for search, beams in (("beam", WORK.num_beams), ("greedy", 1)):
        kwargs = WORK.settings(beams)
        with torch.inference_mode():
            out[search, "transformers"] = hf.generate(input_ids=ids, attention_mask=mask, **kwargs)
        for mode in ("exact", "default", "fast"):
            ours.mode = mode
            out[search, mode] = ours.generate(ids, mask, **kwargs)
        with pytest.MonkeyPatch.context() as patch:  # the default mode's layout off the CPU, run here
            patch.setattr(model_module.packing_rules, "attends_per_input", lambda device: False)
            ours.mode = "default"
            out[search, "batched"] = ours.generate(ids, mask, **kwargs)
    return out


def test_exact_mode_equals_transformers_bit_for_bit(run):
    for search in ("beam", "greedy"):
        expected = run[search, "transformers"]
        assert expected.shape[1] == 1 + WORK.new_tokens, "outputs run to the full 40 new tokens"
        assert torch.equal(run[search, "exact"], expected), f"{run['dtype']} {search}"


def published(kind: str, key: str, near_tie: float) -> tuple[int, float]:
    """This ISA's (identical among the 8, largest gap) for `kind` and `key`; where none is published,
    no count and the `near_tie` bound (see the module docstring)."""
    figures = PUBLISHED.get(hardware.probe().isa)
    return figures[kind][key] if figures is not None else (0, near_tie)


@pytest.mark.parametrize("layout", ["default", "batched"])
def test_default_mode_keeps_its_published_agreement(run, layout):
    """`batched`: one attention call for the whole batch, the default mode's layout on a GPU, run here.
    On this CPU it gave the per-input layout's outputs on all 40 inputs of the published workload in
    every dtype, so the per-input layout's published figures hold it."""
    dtype = run["dtype"]
    for search in ("greedy", "beam"):
        floor, gap = published(search, dtype, NEAR_TIE[dtype])
        _assert_agreement(run, search, layout, floor, gap, reference="transformers")


def test_fast_mode_keeps_its_published_agreement(run):
    if run["dtype"] == "float32":  # the fast mode changes nothing in float32
        assert all(torch.equal(run[search, "fast"], run[search, "default"]) for search in ("beam", "greedy"))
        return
    floor, gap = published("fast", run["dtype"], NEAR_TIE[run["dtype"]])
    _assert_agreement(run, "beam", "fast", floor, gap, reference="transformers")


@pytest.fixture(scope="module")
def int8_run(checkpoint):
    """transformers float32's and the int8 mode's outputs for the batch, greedy and beam."""
    hf = BartForConditionalGeneration.from_pretrained(checkpoint).eval()
    ours = Bart.from_pretrained(checkpoint, quantize="int8")
    inputs = make_inputs(ours.config, WORK)[: WORK.batch_size]
    ids, mask = padded(inputs, ours.config.pad_token_id)
    out = {"dtype": "float32", "hf": hf, "ours": ours, "inputs": inputs}
    for search, beams in (("beam", WORK.num_beams), ("greedy", 1)):
        with torch.inference_mode():
            out[search, "transformers"] = hf.generate(input_ids=ids, attention_mask=mask, **WORK.settings(beams))
        out[search, "int8"] = ours.generate(ids, mask, **WORK.settings(beams))
    return out


@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_int8_mode_keeps_its_published_agreement(int8_run, search):
    """The int8 mode against transformers float32: at this width its quantization error changes every
    output of the peaked random checkpoint (no near-ties: gaps ten times the float modes'), and every
    output stays within the published gap; on a trained checkpoint the outputs are transformers'
    (`test_int8_mode_on_the_trained_demo_model`)."""
    floor, gap = published("int8", search, INT8_GAP)
    _assert_agreement(int8_run, search, "int8", floor, gap, reference="transformers")


def test_int8_mode_on_the_trained_demo_model(tmp_path):
    """The shipped trained checkpoint (d_model 128) on 48 held-out stories, the checkpoint's own settings
    (4 beams): int8's ids equal transformers float32's on all 48, as measured (docs/cpu.md)."""
    import json

    from transformers import AutoTokenizer

    from bart_opt.demo import write_demo_model

    folder = write_demo_model(tmp_path / "demo", n_samples=48)
    texts = [json.loads(line)["article"] for line in (folder / "sample.jsonl").read_text().splitlines()]
    batch = AutoTokenizer.from_pretrained(str(folder))(texts, return_tensors="pt", padding=True)
    hf = BartForConditionalGeneration.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        expected = hf.generate(**batch)
    got = Bart.from_pretrained(str(folder), quantize="int8").generate(batch["input_ids"], batch["attention_mask"])
    pad = hf.config.pad_token_id
    assert expected.shape[1] > 40, "summaries of real length"
    assert [strip(row, pad) for row in got] == [strip(row, pad) for row in expected]


def _assert_agreement(run, search: str, mode: str, floor: int, bound: float, reference: str) -> None:
    """At least `floor` of the 8 outputs identical to the reference's, and every one that differs within
    `bound` of it under transformers' own scoring (a near-tie, for the float modes)."""
    pad = run["ours"].config.pad_token_id
    expected = [strip(row, pad) for row in run[search, reference]]
    got = [strip(row, pad) for row in run[search, mode]]
    identical = sum(a == b for a, b in zip(expected, got))
    assert identical >= floor, f"{mode} {search}: {identical}/8 in {run['dtype']} on {hardware.probe().isa}"
    settings = run["ours"].generation_spec(WORK.settings(WORK.num_beams if search == "beam" else 1))
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            gap = abs(sequence_score(run["hf"], run["inputs"][i], a, settings, "cpu")
                      - sequence_score(run["hf"], run["inputs"][i], b, settings, "cpu"))
            assert gap <= bound, (mode, search, run["dtype"], hardware.probe().isa, i, gap)
