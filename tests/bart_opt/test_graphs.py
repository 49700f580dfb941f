"""CUDA graphs of the static search's step (`bart_opt.graphs`): eager and untouched off CUDA; on CUDA
(the tests named *cuda*, run by `python -m bart_opt.bench.device`) graph replays that give the eager
static search's ids bit for bit, without a host sync, and the default's length-penalty rounding."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import sdpa_kernel

import bart_opt.graphs as graphs
from bart_opt import Bart
from bart_opt.generation import HostLength
from bart_opt.graphs import StepGraphs, strict_replays, uses_graphs
from bart_opt.static_generation import DeviceLength
from tests.bart_opt.reference import batch
from tests.bart_opt.test_generation import CASES, CHECKPOINTS

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_off_cuda_the_step_runs_eagerly_once_per_run():
    calls = []
    steps = StepGraphs(lambda: calls.append(1), torch.device("cpu"))
    with strict_replays():
        for bucket in (4, 4, 2, 2, 2):
            steps.run(bucket)
    assert calls == [1] * 5 and steps.graphs is False and steps.captures == 0
    assert uses_graphs(torch.device("cuda", 0)) and not uses_graphs(torch.device("cpu"))


def test_strict_replays_is_scoped():
    assert not graphs._STRICT.get()
    with strict_replays():
        assert graphs._STRICT.get()
        with strict_replays():
            assert graphs._STRICT.get()
        assert graphs._STRICT.get()
    assert not graphs._STRICT.get()


@needs_cuda
@pytest.mark.parametrize("penalty", [2.0, 1.0, 0.5, -1.0, -0.5, 1.7])
def test_cuda_device_length_penalizes_as_a_python_scalar_division_does(penalty):
    """On CUDA torch multiplies by the reciprocal of a Python-scalar divisor; the device-side table must match."""
    from bart_opt.spec import GenerationSpec

    spec = GenerationSpec(num_beams=4, max_length=150, min_length=0, length_penalty=penalty, no_repeat_ngram_size=0,
                          early_stopping=True, forced_bos_token_id=None, forced_eos_token_id=None,
                          decoder_start_token_id=2, eos_token_id=(2,), pad_token_id=1)
    scores = -torch.rand(64, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(0)) * 50
    host, device = HostLength(spec), DeviceLength(spec, torch.device("cuda"))
    for _ in range(spec.max_length - 2):
        host.advance()
        device.advance()
        assert torch.equal(device.finished_scores(scores), host.finished_scores(scores)), host.value
        assert torch.equal(device.best_running(scores), host.best_running(scores)), host.value


def _cuda_model(path: str, static: bool, dtype=torch.float32, el_attention: bool = False):
    return Bart.from_pretrained(path, device="cuda", dtype=dtype, static=static, el_attention=el_attention)


@needs_cuda
@pytest.mark.parametrize("el_attention", [False, True], ids=["standard", "el"])
@pytest.mark.parametrize("beams", [1, 4])
def test_cuda_graph_replays_equal_the_eager_static_search_across_buckets(make_checkpoint, monkeypatch, beams,
                                                                         el_attention):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = (t.cuda() for t in batch(path, (1, 6, 2, 5, 1, 4, 3, 2), seed=3))
    model = _cuda_model(path, static=True, el_attention=el_attention)
    captured = []
    capture = StepGraphs._capture
    monkeypatch.setattr(StepGraphs, "_capture", lambda self: (captured.append(self.bucket), capture(self)))
    with strict_replays():  # a host sync inside a warm-up or a replay raises
        got = model.generate(ids, mask, num_beams=beams, min_length=0)
    assert len(captured) >= 2 and captured == sorted(captured, reverse=True), "largest bucket first, then smaller"
    monkeypatch.setattr(graphs, "uses_graphs", lambda device: False)
    with sdpa_kernel(graphs.PINNED_ATTENTION):  # the kernels the graphs were captured with, eagerly
        assert torch.equal(got, model.generate(ids, mask, num_beams=beams, min_length=0))


@needs_cuda
def test_cuda_a_step_that_syncs_fails_under_strict_replays():
    flag = torch.ones(1, device="cuda")
    steps = StepGraphs(lambda: bool(flag.sum() > 0), torch.device("cuda"))
    with strict_replays(), pytest.raises(RuntimeError):
        steps.run(1)  # the warm-up step reads the device on the host


@needs_cuda
@pytest.mark.parametrize("case", ["greedy", "checkpoint_defaults", "early_stopping_never", "greedy_ngram_min_length"])
def test_cuda_static_search_matches_transformers_in_float32(make_checkpoint, case):
    from transformers import BartForConditionalGeneration

    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = (t.cuda() for t in batch(path, (1, 5, 2, 3, 1), seed=3))
    reference = BartForConditionalGeneration.from_pretrained(path).cuda().eval()
    with torch.no_grad():
        expected = reference.generate(input_ids=ids, attention_mask=mask, **CASES[case])
    with strict_replays():
        got = _cuda_model(path, static=True).generate(ids, mask, **CASES[case])
    assert torch.equal(got, expected)
