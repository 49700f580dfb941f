"""EL-attention with the static search (`Bart(el_attention=True, static=True)`): transformers' ids on the
static parity suite (the same ids or near-ties, tests/bart_opt/agreement.py), the one-copy state shrinking
with the bucket, cancellation, host syncs counted, and near-ties only at d_model 256. (The decoder step
under `torch.compile(fullgraph=True)`: `test_static_generation.py`, with and without EL-attention.)"""

from __future__ import annotations

import json

import pytest
import torch

from bart_opt import Bart
from bart_opt.engine.cache import StaticKVCache
from bart_opt.engine.el_attention import BatchedELCrossAttention
from bart_opt.engine.static_generation import CHECK_EVERY
from tests.bart_opt.agreement import assert_agrees, generate_agreeing
from tests.bart_opt.reference import batch
from tests.bart_opt.engine.test_generation import CHECKPOINTS, _assert_rows_1_and_3_cancelled, _steps_and_ids, reference_generate
from tests.bart_opt.engine.test_static_generation import STATIC_CASES, counted_before_and_after


def el_static(path: str, dtype: torch.dtype = torch.float32) -> Bart:
    return Bart.from_pretrained(path, dtype=dtype, static=True, el_attention=True)


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint) -> str:
    return make_checkpoint(**CHECKPOINTS["base"])


@pytest.mark.parametrize("case", sorted(STATIC_CASES))
def test_uneven_batch_matches_transformers(checkpoint, case):
    ids, mask = batch(checkpoint, (1, 5, 2, 3, 1), seed=3)
    generate_agreeing(el_static(checkpoint), ids, mask, checkpoint, **STATIC_CASES[case])


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
    model = el_static(path)
    _, got, trace = _steps_and_ids(model, ids, mask, None, **options)
    assert_agrees(model, ids, mask, got, path, trace=trace, **options)
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
    rows, got, trace = _steps_and_ids(model, ids, mask, cancelled, **options)
    _assert_rows_1_and_3_cancelled(model, ids, mask, got, trace, path, expected, **options)
    assert rows[0] == 5 * beams and rows[-1] < 5 * beams, "the cancelled rows left with a bucket"


def test_host_syncs_are_those_of_the_static_search(make_checkpoint):
    """Counted on the CPU: EL-attention adds no host sync to the static search's loop (one a check)."""
    static, el = counted_before_and_after(make_checkpoint, "el_attention", static=True)
    assert el.steps == static.steps > 2 * CHECK_EVERY
    loop = lambda c: {key: n for key, n in c.syncs.items() if not key.startswith("prepare")}  # noqa: E731
    assert loop(el) == loop(static), (el.syncs, static.syncs)
    assert sum(loop(el).values()) <= el.steps // CHECK_EVERY + 2, el.syncs
    assert all(key.split(": ")[1] == "item" for key in loop(el)), el.syncs  # no nonzero, no copy to the host


# ---------------------------------------------------------------- agreement at d_model 256


@pytest.mark.parametrize("search", ["greedy", "beam"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_static_search_with_el_attention_differs_from_transformers_only_by_near_ties(published_batch, dtype,
                                                                                         search):
    """The published batch, every beam step checked; identical counts are figures
    (`python -m bart_opt.bench.fidelity --static --el-attention --shape d256 --threads 1`, docs/el-attention.md)."""
    batch = published_batch(dtype)
    batch.run(el_static(batch.path, getattr(torch, dtype)), search).report.assert_holds(f"static + EL {dtype} {search}")


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
