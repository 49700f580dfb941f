"""EL-attention with the static search (`Bart(el_attention=True, static=True)`): transformers' ids on the
static parity suite, the one-copy state shrinking with the bucket, cancellation, host syncs counted, and
the published agreement with the static search without EL-attention at d_model 256. (The decoder step
under `torch.compile(fullgraph=True)`: `test_static_generation.py`, with and without EL-attention.)"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import BartForConditionalGeneration

from bart_opt import Bart
from bart_opt.bench.fidelity import make_inputs, padded, strip
from bart_opt.cache import StaticKVCache
from bart_opt.el_attention import BatchedELCrossAttention
from bart_opt.static_generation import CHECK_EVERY
from tests.bart_opt.reference import batch
from tests.bart_opt.test_el_attention import WORK, assert_published_agreement, d256  # noqa: F401  (d256: a fixture)
from tests.bart_opt.test_fidelity import one_thread  # noqa: F401  (autouse: one thread, as the published figures)
from tests.bart_opt.test_generation import CHECKPOINTS, _assert_rows_1_and_3_cancelled, _steps_and_ids, reference_generate
from tests.bart_opt.test_static_generation import STATIC_CASES, counted_before_and_after


def el_static(path: str, dtype: torch.dtype = torch.float32) -> Bart:
    return Bart.from_pretrained(path, dtype=dtype, static=True, el_attention=True)


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint) -> str:
    return make_checkpoint(**CHECKPOINTS["base"])


@pytest.mark.parametrize("case", sorted(STATIC_CASES))
def test_uneven_batch_matches_transformers(checkpoint, case):
    ids, mask = batch(checkpoint, (1, 5, 2, 3, 1), seed=3)
    expected = reference_generate(checkpoint, ids, mask, **STATIC_CASES[case])
    got = el_static(checkpoint).generate(ids, mask, **STATIC_CASES[case])
    assert torch.equal(got, expected), f"ours:\n{got}\ntransformers:\n{expected}"


def test_the_state_is_one_batched_copy_of_the_encoder_output(checkpoint):
    model = el_static(checkpoint)
    ids, mask = batch(checkpoint, (1, 5, 2), seed=3)
    with torch.inference_mode():
        memory = model.encode(ids, mask)
        cross = model.cross_attention(memory, mask, beams=4)
    assert type(cross) is BatchedELCrossAttention  # the static search's layout on every device, CPU included
    assert cross.memory.shape == (3, 1, *memory.shape[1:]) and cross.memory.data_ptr() == memory.data_ptr()
    assert torch.equal(cross.key_bias[:, 0, 0] == 0, mask.bool())  # (B, 1, 1, S): 0 at tokens, -inf at padding


@pytest.mark.parametrize("beams", [1, 4])
def test_the_state_leaves_with_the_bucket_and_the_ids_match_transformers(make_checkpoint, monkeypatch, beams):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 6, 2, 5, 1, 4, 3, 2), seed=3)
    kept, cache_rows = [], []
    keep, cache_keep = BatchedELCrossAttention.keep, StaticKVCache.keep
    monkeypatch.setattr(BatchedELCrossAttention, "keep",
                        lambda self, rows: (keep(self, rows), kept.append(self.memory.shape[0])))
    monkeypatch.setattr(StaticKVCache, "keep",
                        lambda self, rows: (cache_rows.append(len(rows)), cache_keep(self, rows)))
    options = dict(num_beams=beams, min_length=0)
    _, got = _steps_and_ids(el_static(path), ids, mask, None, **options)
    assert torch.equal(got, reference_generate(path, ids, mask, **options))
    assert kept, "inputs finished at different steps: the batch should have shrunk"
    assert kept == [rows // beams for rows in cache_rows], "the encoder output leaves with the cache's rows"
    assert all(k in (4, 2, 1) for k in kept), kept


@pytest.mark.parametrize("beams", [1, 3])
def test_cancelled_rows_stop_and_the_others_match_transformers(make_checkpoint, beams):
    path = make_checkpoint(**CHECKPOINTS["base"])
    ids, mask = batch(path, (1, 5, 2, 3, 1), seed=3)
    options = dict(num_beams=beams, min_length=12, max_length=20)
    expected = reference_generate(path, ids, mask, **options)
    polls = []

    def cancelled():  # rows 1 and 3 are withdrawn once two decoder steps have run
        polls.append(len(polls))
        return {1, 3} if len(polls) >= 2 else set()

    model = el_static(path)
    rows, got = _steps_and_ids(model, ids, mask, cancelled, **options)
    _assert_rows_1_and_3_cancelled(model, got, expected)
    assert rows[0] == 5 * beams and rows[-1] < 5 * beams, "the cancelled rows left with a bucket"


def test_host_syncs_are_those_of_the_static_search(make_checkpoint):
    """Counted on the CPU: EL-attention adds no host sync to the static search's loop (one a check)."""
    static, el = counted_before_and_after(make_checkpoint, "el_attention", static=True)
    assert el.steps == static.steps > 2 * CHECK_EVERY
    loop = lambda c: {key: n for key, n in c.syncs.items() if not key.startswith("prepare")}  # noqa: E731
    assert loop(el) == loop(static), (el.syncs, static.syncs)
    assert sum(loop(el).values()) <= el.steps // CHECK_EVERY + 2, el.syncs
    assert all(key.split(": ")[1] == "item" for key in loop(el)), el.syncs  # no nonzero, no copy to the host


# ---------------------------------------------------------------- published agreement at d_model 256

# The static search with EL-attention against the static search without it: identical outputs (greedy,
# beam) among the first padded batch of 8 of the published fidelity workload (this fixture, one thread),
# per CPU capability; over all 40 inputs:
#   python -m bart_opt.bench.fidelity --static --el-attention --shape d256 --threads 1  (docs/el-attention.md)
# AVX512: Xeon (Sapphire Rapids class) with AVX512_BF16 and AMX; AVX2: the same machine with
# ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2. Other capabilities are
# held to the near-tie property only (`test_el_attention.NEAR_TIE`, as EL-attention's default search).
PUBLISHED_EL_STATIC_IDENTICAL = {
    "AVX512": {"float32": (8, 8), "float16": (6, 5), "bfloat16": (1, 0)},
    "AVX2": {"float32": (8, 8), "float16": (5, 4), "bfloat16": (0, 1)},
}
# Where a capability's published largest gap is above NEAR_TIE: under the AVX2 limits the static search itself
# differs from the default in bfloat16 beam search by up to 0.0101 (test_static_generation.PUBLISHED_STATIC),
# and EL-attention's outputs against it by up to 0.0100 over the 40 inputs (docs/el-attention.md); against the
# default they stay within 0.0029.
PUBLISHED_EL_STATIC_GAPS = {"AVX2": {("bfloat16", "beam"): 1.01e-2}}


@pytest.fixture(scope="module", params=["float32", "float16", "bfloat16"])
def wide(request, d256):
    """The static search's outputs with and without EL-attention for the d256 batch, in one dtype."""
    dtype = getattr(torch, request.param)
    model = Bart.from_pretrained(d256, dtype=dtype, static=True)
    inputs = make_inputs(model.config, WORK)[: WORK.batch_size]
    ids, mask = padded(inputs, model.config.pad_token_id)
    assert (mask == 0).any() and ids.shape[1] > 100, "a padded batch with long inputs"
    out = {"dtype": request.param, "model": model, "inputs": inputs}
    for search, beams in (("greedy", 1), ("beam", WORK.num_beams)):
        kwargs = WORK.settings(beams)
        runs = []
        for el in (False, True):
            model.el_attention = el
            got = model.generate(ids, mask, **kwargs)
            assert got.shape[1] == 1 + WORK.new_tokens, "outputs run to the full 40 new tokens"
            runs.append([strip(row, model.config.pad_token_id) for row in got])
        model.el_attention = False
        out[search] = runs
    return out


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_wide_padded_batch_keeps_the_published_agreement_with_the_static_search(wide, d256, search):
    hf = BartForConditionalGeneration.from_pretrained(d256, dtype=getattr(torch, wide["dtype"])).eval()
    spec = wide["model"].generation_spec(WORK.settings(1 if search == "greedy" else WORK.num_beams))
    assert_published_agreement(PUBLISHED_EL_STATIC_IDENTICAL, wide["dtype"], search, *wide[search], hf,
                               wide["inputs"], spec, PUBLISHED_EL_STATIC_GAPS)


def test_the_fidelity_bench_measures_the_static_search_with_el_attention(tmp_path, capsys):
    from bart_opt.bench import fidelity

    with pytest.raises(SystemExit):
        fidelity.parse_args(["--el-attention"])  # the default search's EL-attention is `--modes el`
    out = tmp_path / "fidelity.json"
    assert fidelity.main(["--static", "--el-attention", "--shape", "small", "--dtypes", "float32,float16", "--n", "3",
                          "--batch-size", "3", "--new-tokens", "6", "--max-len", "20", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    for dtype, searches in results.items():
        for search in ("beam", "greedy"):
            block = searches[search]
            assert [k for k in block if k != "vs_float32"] == ["static", *fidelity.STATIC_REFERENCES]
            assert all(block[ref]["total"] == 3 for ref in fidelity.STATIC_REFERENCES)
    assert list(results["float16"]["beam"]["vs_float32"]) == ["default (GPU layout)", "static", "static + el"]
    printed = capsys.readouterr().out
    assert "of the static search with EL-attention" in printed and "| = static | its score gaps |" in printed
    assert "transformers fp32: default (GPU layout) / static / static + el |" in printed
