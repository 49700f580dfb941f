"""Parity at a real width, in every dtype on CPU: exact mode identical, the default and the fast mode at
their published agreement.

The batch is the first padded batch of 8 of the published fidelity workload (docs/fidelity.md,
"On a CPU"; `python -m bart_opt.bench.fidelity --shape d256 --threads 1`): d_model 256, 3+3
layers, 8 heads, inputs of 8-120 tokens, 40 new tokens, 4 beams, length_penalty 2.0,
no_repeat_ngram_size 3, on one thread as published.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BartForConditionalGeneration

import bart_opt.model as model_module
from bart_opt import Bart, native
from bart_opt.bench.fidelity import SHAPES, Workload, make_inputs, padded, sequence_score, strip

WORK = Workload()
# The default's identical outputs among these 8 in the published measurement, and the largest
# transformers score gap of a default output that differed (over all 40 inputs).
PUBLISHED_DEFAULT_IDENTICAL = {"float32": 8, "float16": 6, "bfloat16": 3}
PUBLISHED_MAX_SCORE_GAP = {"float32": 0.0, "float16": 2.4e-3, "bfloat16": 2.5e-3}
# The same for the fast mode (beam search; in float32 it is the default mode, tested as such).
PUBLISHED_FAST_IDENTICAL = {"float16": 2, "bfloat16": 0}
PUBLISHED_FAST_MAX_SCORE_GAP = {"float16": 5.3e-3, "bfloat16": 6.7e-3}


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
            patch.setattr(model_module, "attends_per_input", lambda device: False)
            ours.mode = "default"
            out[search, "batched"] = ours.generate(ids, mask, **kwargs)
    return out


def test_exact_mode_equals_transformers_bit_for_bit(run):
    for search in ("beam", "greedy"):
        expected = run[search, "transformers"]
        assert expected.shape[1] == 1 + WORK.new_tokens, "outputs run to the full 40 new tokens"
        assert torch.equal(run[search, "exact"], expected), f"{run['dtype']} {search}"


@pytest.mark.parametrize("layout", ["default", "batched"])
def test_default_mode_keeps_its_published_agreement(run, layout):
    """`batched`: one attention call for the whole batch, the default mode's layout on a GPU, run here.
    On this CPU it gave the per-input layout's outputs on all 40 inputs of the published workload in
    every dtype, so the per-input layout's published figures hold it."""
    pad = run["ours"].config.pad_token_id
    assert torch.equal(run["greedy", layout], run["greedy", "transformers"])
    expected = [strip(row, pad) for row in run["beam", "transformers"]]
    got = [strip(row, pad) for row in run["beam", layout]]
    identical = sum(a == b for a, b in zip(expected, got))
    assert identical >= PUBLISHED_DEFAULT_IDENTICAL[run["dtype"]], f"{identical}/8 in {run['dtype']}"
    _assert_near_ties(run, expected, got, PUBLISHED_MAX_SCORE_GAP[run["dtype"]])


def test_fast_mode_keeps_its_published_agreement(run):
    if run["dtype"] == "float32":  # the fast mode changes nothing in float32
        assert all(torch.equal(run[search, "fast"], run[search, "default"]) for search in ("beam", "greedy"))
        return
    if run["dtype"] == "bfloat16" and native.kernel() is None:
        pytest.skip("the bfloat16 figures were measured with bart_opt's kernel, which is not available here")
    pad = run["ours"].config.pad_token_id
    expected = [strip(row, pad) for row in run["beam", "transformers"]]
    got = [strip(row, pad) for row in run["beam", "fast"]]
    identical = sum(a == b for a, b in zip(expected, got))
    assert identical >= PUBLISHED_FAST_IDENTICAL[run["dtype"]], f"{identical}/8 in {run['dtype']}"
    _assert_near_ties(run, expected, got, PUBLISHED_FAST_MAX_SCORE_GAP[run["dtype"]])


def _assert_near_ties(run, expected, got, bound: float) -> None:
    """Every output that differs is a near-tie under transformers' own scoring: a gap of at most `bound`."""
    settings = run["ours"].generation_spec(WORK.settings(WORK.num_beams))
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            gap = abs(sequence_score(run["hf"], run["inputs"][i], a, settings, "cpu")
                      - sequence_score(run["hf"], run["inputs"][i], b, settings, "cpu"))
            assert gap <= bound, (run["dtype"], i, gap)
