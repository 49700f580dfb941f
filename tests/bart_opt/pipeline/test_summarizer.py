"""The Summarizer pipeline on the demo checkpoint: order, parity, truncation, budgets, OOM, ROUGE."""

from __future__ import annotations

import contextlib
import random
import threading

import pytest
import torch
from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration

from bart_opt.demo import random_article
from bart_opt.pipeline.rouge import RougeScorer
from bart_opt import InvalidRequest
from bart_opt.pipeline.summarizer import CANCELLED, Summarizer, summarization_prefix

GEN = {"max_length": 16, "min_length": 4}


class FakeOOM(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError on CPU."""


@pytest.fixture(scope="module")
def summarizer(demo_checkpoint) -> Summarizer:
    # The CPU tensor counter is on by default; tests that do not read memory skip its cost.
    return Summarizer.from_pretrained(demo_checkpoint, device="cpu", count_cpu_tensors=False)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rng = random.Random(1)
    return [random_article(rng, n) for n in (1, 8, 3, 14, 5, 2, 6)]


@pytest.fixture(scope="module")
def baseline(summarizer, texts):
    """Summaries with everything in one batch."""
    return summarizer.summarize(texts, **GEN)


def hf_summaries(checkpoint: str, texts: list[str], max_input: int | None = None, **kwargs) -> list[str]:
    """transformers' tokenize + generate + decode, as the reference scripts do it."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = BartForConditionalGeneration.from_pretrained(checkpoint).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_input, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, **kwargs)
    return tokenizer.batch_decode(out, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_summaries_equal_transformers_generate_and_decode(demo_checkpoint, summarizer, texts, baseline):
    assert baseline.summaries == hf_summaries(demo_checkpoint, texts, **GEN)
    assert all(baseline.summaries)


def test_input_order_restored_whatever_the_batching(demo_checkpoint, texts, baseline):
    small = Summarizer.from_pretrained(demo_checkpoint, device="cpu", max_batch_size=2, max_batch_tokens=4000,
                                       count_cpu_tensors=False)
    result = small.summarize(texts, **GEN)
    assert len(result.batches) > 2
    assert result.summaries == baseline.summaries
    singles = [small.summarize([text], **GEN).summaries[0] for text in texts[:3]]
    assert singles == baseline.summaries[:3]
    # Each model call covered some inputs; together they cover each input exactly once.
    covered = sorted(p for call in result.batches for p in call["positions"])
    assert covered == list(range(len(texts)))


def test_batches_respect_budgets_and_report_padding(demo_checkpoint, texts):
    s = Summarizer.from_pretrained(demo_checkpoint, device="cpu", max_batch_tokens=2000, max_batch_size=3,
                                   count_cpu_tensors=False)
    result = s.summarize(texts, **GEN)
    for call in result.batches:
        assert call["size"] <= 3
        assert call["budget_tokens"] == call["size"] * call["columns"] * call["num_beams"]
        assert call["budget_tokens"] <= 2000 or call["size"] == 1
        lengths = [result.items[p]["input_tokens"] for p in call["positions"]]
        assert call["columns"] == max(lengths)  # trimmed to the longest input of the call
        assert call["tokens"] == sum(lengths)
        assert call["padding_computed"] == call["size"] * call["columns"] - sum(lengths)
        assert call["padding_avoided"] == call["size"] * (s.max_input_tokens - call["columns"])
        assert call["padding_avoided"] > 0
    assert sum(i["padding_avoided"] for i in result.items) == sum(c["padding_avoided"] for c in result.batches)
    assert sum(i["padding_computed"] for i in result.items) == sum(c["padding_computed"] for c in result.batches)


def test_long_inputs_are_truncated_and_flagged(make_checkpoint):
    checkpoint = make_checkpoint(init_std=0.2, max_position_embeddings=48)
    s = Summarizer.from_pretrained(checkpoint, device="cpu", count_cpu_tensors=False)
    rng = random.Random(2)
    texts = [random_article(rng, 8), "Short text here."]
    result = s.summarize(texts, **GEN)
    assert [item["truncated"] for item in result.items] == [True, False]
    assert result.items[0]["input_tokens"] == 48
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    ids = tokenizer(texts[0], truncation=True, max_length=48)["input_ids"]
    assert s.encode(texts[:1])[0].ids == ids and ids[-1] == tokenizer.eos_token_id
    assert result.summaries == hf_summaries(checkpoint, texts, max_input=48, **GEN)


@contextlib.contextmanager
def injected_oom(summarizer, inject):
    """Run with `inject` called before every model call and FakeOOM treated as out of memory."""
    summarizer.before_model_call, summarizer.oom_errors = inject, (FakeOOM,)
    try:
        yield
    finally:
        summarizer.before_model_call, summarizer.oom_errors = None, (torch.cuda.OutOfMemoryError,)


def test_oom_split_retries_smaller_batches(summarizer, texts, baseline):
    seen = []

    def inject(positions):
        seen.append(len(positions))
        if len(positions) > 2:
            raise FakeOOM("CUDA out of memory (injected)")

    with injected_oom(summarizer, inject):
        result = summarizer.summarize(texts, **GEN)
    assert seen[0] == len(texts)
    assert result.oom_splits >= 2
    assert all(call["size"] <= 2 for call in result.batches)
    assert result.errors == [None] * len(texts)
    assert result.summaries == baseline.summaries


def test_oom_on_a_single_input_reports_that_input_only(summarizer, texts, baseline):
    def inject(positions):
        if 3 in positions:
            raise FakeOOM("CUDA out of memory (injected)")

    with injected_oom(summarizer, inject):
        result = summarizer.summarize(texts, **GEN)
    assert [e is not None for e in result.errors] == [i == 3 for i in range(len(texts))]
    assert "out of memory" in result.errors[3]
    assert result.items[3]["error"] == result.errors[3] and result.summaries[3] == ""
    assert [s for i, s in enumerate(result.summaries) if i != 3] == [s for i, s in enumerate(baseline.summaries) if i != 3]


def test_items_timing_memory_and_generation_settings(baseline, texts):
    assert len(baseline.items) == len(texts)
    for item in baseline.items:
        assert item["output_tokens"] >= 4 and item["input_tokens"] > 2 and item["truncated"] is False
        assert item["rouge"] is None and item["error"] is None
    assert set(baseline.timing) == {"tokenize", "generate", "decode", "score", "total"}
    assert baseline.timing["total"] >= baseline.timing["generate"] > 0
    shares = sum(item["timing"]["generate"] for item in baseline.items)
    assert shares == pytest.approx(baseline.timing["generate"])
    assert baseline.memory["peak_source"] == "none"
    assert baseline.generation["num_beams"] == 4 and baseline.generation["max_length"] == 16
    assert baseline.rouge is None


def test_memory_report_counts_live_tensors(demo_checkpoint, texts):
    s = Summarizer.from_pretrained(demo_checkpoint, device="cpu")
    result = s.summarize(texts[:2], **GEN)
    assert result.memory["peak_source"] == "live_tensors"
    assert result.memory["peak_bytes"] > 0
    phases = {phase["name"]: phase for phase in result.memory["phases"]}
    assert {"tokenize", "generate", "encode", "detokenize", "score"} <= set(phases)
    assert phases["generate"]["peak_bytes"] >= phases["encode"]["peak_bytes"] > 0
    assert s.model.memory_log is None  # detached after the call


def test_rouge_per_item_and_aggregate(summarizer, texts):
    references = [text.split(".")[0] + "." for text in texts]
    result = summarizer.summarize(texts, references, **GEN)
    scorer = RougeScorer()
    for summary, reference, item in zip(result.summaries, references, result.items):
        assert item["rouge"] == scorer.score(summary, reference)
    assert result.rouge == scorer.aggregate([item["rouge"] for item in result.items])


def test_summarize_groups_splits_a_shared_call(summarizer, texts, baseline):
    groups = [(texts[:3], None), (texts[3:], [t[:40] for t in texts[3:]])]
    summarizer.max_batch_size = 3
    try:
        first, second = summarizer.summarize_groups(groups, **GEN)
    finally:
        summarizer.max_batch_size = 64
    assert first.summaries + second.summaries == baseline.summaries
    assert first.rouge is None and [i["rouge"] for i in first.items] == [None] * 3
    assert second.rouge == RougeScorer().aggregate([i["rouge"] for i in second.items])
    assert first.memory["share"] + second.memory["share"] == pytest.approx(1.0)
    for result, (group_texts, _) in zip((first, second), groups):
        assert len(result.items) == len(result.summaries) == len(result.errors) == len(group_texts)
        assert result.timing["generate"] == pytest.approx(sum(i["timing"]["generate"] for i in result.items))
        # Call stats are renumbered within the request: positions and item -> call links are local.
        assert sorted(p for call in result.batches for p in call["positions"]) == list(range(len(group_texts)))
        for position, item in enumerate(result.items):
            assert position in result.batches[item["call"]]["positions"]


def test_cancelled_inputs_stop_and_the_rest_of_the_call_is_unchanged(summarizer, texts, baseline, monkeypatch):
    # Calls of 3 texts, longest first: [3, 1, 4], [6, 2, 5], [0]. Position 6 is withdrawn before
    # its call starts, position 1 once its call has run three decoder steps.
    steps = []
    original = summarizer.model.decode_step

    def counting_step(tokens, *args, **kwargs):
        steps.append(tokens.shape[0])
        return original(tokens, *args, **kwargs)

    monkeypatch.setattr(summarizer.model, "decode_step", counting_step)
    monkeypatch.setattr(summarizer, "max_batch_size", 3)
    withdrawn = {6}

    def cancelled():
        if len(steps) == 3:
            withdrawn.add(1)
        return withdrawn

    result = summarizer.summarize(texts, cancelled=cancelled, **GEN)
    for p in range(len(texts)):
        if p in (1, 6):
            assert result.summaries[p] == "" and result.errors[p] == CANCELLED and result.items[p]["error"] == CANCELLED
        else:
            assert result.summaries[p] == baseline.summaries[p] and result.errors[p] is None
    assert sorted(p for call in result.batches for p in call["positions"]) == [0, 1, 2, 3, 4, 5]
    # The first call held positions 3, 1 and 4 (the longest); position 1 left it right after the third step.
    beams = summarizer.generation_spec(GEN).num_beams
    assert steps[:4] == [3 * beams] * 3 + [2 * beams]


def test_iter_batches_yields_each_input_once_with_its_memory(summarizer, texts, baseline):
    summarizer.max_batch_size, summarizer.count_cpu_tensors = 3, True
    try:
        outcomes = list(summarizer.iter_batches(texts, **GEN))
    finally:
        summarizer.max_batch_size, summarizer.count_cpu_tensors = 64, False
    assert len(outcomes) == 3
    positions = [p for outcome in outcomes for p in outcome.positions]
    assert sorted(positions) == list(range(len(texts)))
    lengths = [outcome.items[outcome.positions[0]]["input_tokens"] for outcome in outcomes]
    assert lengths == sorted(lengths, reverse=True)
    for outcome in outcomes:
        assert outcome.memory["peak_bytes"] > 0
        for p in outcome.positions:
            assert outcome.summaries[p] == baseline.summaries[p]


def test_iter_batches_scores_a_batch_while_the_next_one_is_on_the_model(summarizer, texts, baseline, monkeypatch):
    score = summarizer.scorer.score
    calls, second_call, waited = [], threading.Event(), []

    def scoring_waits_for_the_next_call(prediction, reference):
        # Serially, the next model call would only start after this returns: the wait would time out.
        waited.append((threading.current_thread().name, second_call.wait(timeout=30)))
        return score(prediction, reference)

    def model_call(positions):
        calls.append(len(positions))
        if len(calls) == 2:
            second_call.set()

    monkeypatch.setattr(summarizer.scorer, "score", scoring_waits_for_the_next_call)
    summarizer.max_batch_size, summarizer.before_model_call = 3, model_call
    try:
        outcomes = list(summarizer.iter_batches(texts, texts, **GEN))
    finally:
        summarizer.max_batch_size, summarizer.before_model_call = 64, None
    assert calls == [3, 3, 1]  # 7 texts
    assert waited and all(name.startswith("bart-opt-finish") and ok for name, ok in waited)
    for outcome in outcomes:  # the same summaries and scores as the serial path
        for p in outcome.positions:
            assert outcome.summaries[p] == baseline.summaries[p]
            assert outcome.items[p]["rouge"] == score(baseline.summaries[p], texts[p])


def test_summarization_prefix_is_applied(summarizer):
    config = BartConfig(task_specific_params={"summarization": {"prefix": "summarize: ", "num_beams": 4}})
    assert summarization_prefix(config) == "summarize: "
    config.prefix = "tl;dr: "
    assert summarization_prefix(config) == "tl;dr: "
    assert summarization_prefix(BartConfig()) == ""
    summarizer.prefix = "summarize: "
    try:
        encoded = summarizer.encode(["The cat sat."])
    finally:
        summarizer.prefix = ""
    assert encoded[0].ids == summarizer.tokenizer("summarize: The cat sat.")["input_ids"]


def test_bad_calls_are_value_errors(summarizer):
    with pytest.raises(InvalidRequest, match="texts: is empty"):
        summarizer.summarize([])
    with pytest.raises(InvalidRequest, match="single string"):
        summarizer.summarize("one text")
    with pytest.raises(InvalidRequest, match="references: 1 references for 2 texts"):
        summarizer.summarize(["a b c", "d e f"], ["x"])
    with pytest.raises(InvalidRequest, match=r"texts\[1\]: must be a string"):
        summarizer.summarize(["a b c", None])
    with pytest.raises(InvalidRequest, match=r"texts\[1\]: character 2 \(U\+DC80\) is a lone surrogate"):
        summarizer.summarize(["a b c", "ab\udc80"])
    with pytest.raises(InvalidRequest, match=r"references\[0\]: character 0 \(U\+D800\)"):
        summarizer.summarize(["a b c"], ["\ud800"])
    with pytest.raises(InvalidRequest, match="do_sample"):
        summarizer.summarize(["a b c"], do_sample=True)
    with pytest.raises(InvalidRequest, match="max_beams|above the limit of 2"):
        Summarizer(summarizer.model, summarizer.tokenizer, max_beams=2).summarize(["a b c"], num_beams=3)


def test_pre_encoded_inputs_are_not_tokenized_again(demo_checkpoint, monkeypatch):
    s = Summarizer.from_pretrained(demo_checkpoint, count_cpu_tensors=False)
    texts = ["Police said the storm hit the city on monday.", "A football club won the match at home."]
    expected = s.summarize(texts, num_beams=2, max_length=12)
    encoded = s.encode(texts)

    def refuse(_texts):
        raise AssertionError("encode was called although encoded inputs were given")

    monkeypatch.setattr(s, "encode", refuse)
    got = s.summarize_groups([(texts[:1], None), (texts[1:], None)], encoded=encoded, num_beams=2, max_length=12)
    assert [r.summaries[0] for r in got] == expected.summaries
    with pytest.raises(ValueError, match="encoded has 1 entries for 2 texts"):
        s.summarize(texts, encoded=encoded[:1])
