"""The device-side runner: one Summarizer call per micro-batch, split per request."""

from __future__ import annotations

import pytest

from app.metrics import Metrics
from app.device.runner import SummarizerRunner, share_memory
from app.device.worker import WorkItem
from bart_opt.pipeline.summarizer import CANCELLED
from tests.app.helpers import FAST, articles


def test_share_memory_scales_bytes_and_seconds_and_keeps_the_call_numbers():
    report = {
        "device": "cpu", "peak_bytes": 1000, "change_bytes": 10, "rss_bytes": 5000, "seconds": 2.0,
        "phases": [{"name": "encode", "count": 1, "seconds": 1.0, "peak_bytes": 400}],
        "peak_source": "live_tensors", "share": 0.25,
    }  # fmt: skip
    shared = share_memory(report, requests=3, texts=5)
    assert (shared["peak_bytes"], shared["change_bytes"], shared["rss_bytes"]) == (250, 2, 5000)
    assert shared["seconds"] == 0.5
    assert shared["phases"] == [{"name": "encode", "count": 1, "seconds": 0.25, "peak_bytes": 100}]
    assert shared["batch"] == {"requests": 3, "texts": 5, "peak_bytes": 1000, "seconds": 2.0}
    assert shared["share"] == 0.25 and shared["device"] == "cpu"


def work(summarizer, texts, references=None) -> WorkItem:
    return WorkItem(texts=texts, generation=summarizer.generation_spec(FAST), longest=50, references=references)


def test_merged_items_get_the_summaries_and_rouge_of_their_own_texts(direct):
    texts = articles(3, seed=20)
    runner = SummarizerRunner(direct, Metrics())
    first, second = runner([work(direct, texts[:1]), work(direct, texts[1:], references=["a reference", "another one"])])
    assert first.result.summaries == direct.summarize(texts[:1], **FAST).summaries
    alone = direct.summarize(texts[1:], ["a reference", "another one"], **FAST)
    assert second.result.summaries == alone.summaries
    assert second.result.rouge == alone.rouge and first.result.rouge is None
    assert first.memory["batch"]["requests"] == second.memory["batch"]["requests"] == 2
    assert first.memory["share"] + second.memory["share"] == pytest.approx(1.0)
    assert first.memory["batch"]["texts"] == 3


def test_an_abandoned_item_leaves_the_call_and_the_others_are_unchanged(direct, monkeypatch):
    texts = articles(3, seed=22)
    items = [work(direct, texts[:1]), work(direct, texts[1:2]), work(direct, texts[2:])]
    steps = []
    original = direct.model.decode_step

    def step(tokens, *args, **kwargs):  # the second request is withdrawn after two decoder steps
        steps.append(tokens.shape[0])
        if len(steps) == 2:
            items[1].abandon()
        return original(tokens, *args, **kwargs)

    monkeypatch.setattr(direct.model, "decode_step", step)
    first, second, third = SummarizerRunner(direct, Metrics())(items)
    monkeypatch.undo()
    assert steps[:3] == [3 * FAST["num_beams"]] * 2 + [2 * FAST["num_beams"]]
    assert second.result.summaries == [""] and second.result.errors == [CANCELLED]
    assert first.result.summaries == direct.summarize(texts[:1], **FAST).summaries
    assert third.result.summaries == direct.summarize(texts[2:], **FAST).summaries


def test_a_failing_merged_call_is_retried_item_by_item(direct, monkeypatch):
    real = direct.summarize_groups

    def refuse_bad(groups, **kwargs):
        if any("BAD" in text for texts, _ in groups for text in texts):
            raise ValueError("this input is bad")
        return real(groups, **kwargs)

    monkeypatch.setattr(direct, "summarize_groups", refuse_bad)
    good_text = articles(1, seed=21)
    good, bad = SummarizerRunner(direct, Metrics())([work(direct, good_text), work(direct, ["BAD input"])])
    assert good.result.summaries == real([(good_text, None)], **FAST)[0].summaries
    assert good.memory["batch"]["requests"] == 1
    assert isinstance(bad, ValueError) and "bad" in str(bad)
