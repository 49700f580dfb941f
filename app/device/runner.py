"""What the device thread does with one micro-batch: one Summarizer call, split per work item.

:class:`SummarizerRunner` is the *runner* the :class:`app.device.worker.Worker` calls. It hands the
texts of all items to ``Summarizer.summarize_groups`` (one model call for the lot, planned by
the pipeline under the token budget) and gives each item an :class:`ItemResult`: its own
summaries, items, ROUGE, and its share of the memory and timing report. A merged call that
fails is retried item by item (the pipeline's one failure-split policy,
`bart_opt.pipeline.batching.run_with_oom_split`), so one bad request cannot fail the requests it rode with.
An item whose submitter abandons it (client gone, deadline passed) has its texts withdrawn
from the call between decoder steps; the other items of the call run on unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from app.metrics import Metrics
from app.device.worker import WorkItem
from bart_opt.pipeline.batching import run_with_oom_split
from bart_opt.pipeline.summarizer import SummaryResult, Summarizer

logger = logging.getLogger("app.device.runner")

_SCALED_MEMORY_KEYS = ("peak_bytes", "change_bytes")


@dataclass
class ItemResult:
    """One work item's part of a model call.

    ``result`` is the pipeline's per-group `SummaryResult` (summaries, rouge, items, errors,
    timing shares); ``memory`` is the call's memory report scaled to this item's share, with
    the call's own numbers (and how many requests and texts it held) under ``"batch"``.
    """

    result: SummaryResult
    memory: dict


def share_memory(report: dict, *, requests: int, texts: int) -> dict:
    """Scale a call's memory report to the request's ``report["share"]`` (bytes and seconds; RSS stays absolute)."""
    share = report["share"]
    scaled = dict(report)
    for key in _SCALED_MEMORY_KEYS:
        scaled[key] = round(report[key] * share)
    scaled["seconds"] = report["seconds"] * share
    scaled["phases"] = [
        {**phase, "seconds": phase["seconds"] * share, "peak_bytes": round(phase["peak_bytes"] * share)}
        for phase in report["phases"]
    ]
    scaled["batch"] = {
        "requests": requests, "texts": texts, "peak_bytes": report["peak_bytes"], "seconds": report["seconds"]
    }
    return scaled


def resident_bytes(summarizer: Summarizer) -> int:
    """Device memory held between calls: the CUDA allocator's count, or on CPU the weights' bytes."""
    if summarizer.device.type == "cuda":
        return torch.cuda.memory_allocated(summarizer.device)
    model = summarizer.model
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def _abandoned_positions(items: list[WorkItem]):
    """The summarizer's ``cancelled`` callback: positions (into all items' texts) of abandoned items."""
    spans, start = [], 0
    for item in items:
        spans.append((item, range(start, start + len(item.texts))))
        start += len(item.texts)

    def cancelled() -> list[int]:
        return [p for item, span in spans if item.abandoned for p in span]

    return cancelled


class SummarizerRunner:
    """Runs micro-batches of :class:`WorkItem` through one Summarizer and records batch metrics."""

    def __init__(self, summarizer: Summarizer, metrics: Metrics) -> None:
        self.summarizer = summarizer
        self.metrics = metrics

    def __call__(self, items: list[WorkItem]) -> list[ItemResult | Exception]:
        """One result per item; an item that fails even alone gets its exception (its submitter's)."""
        split = run_with_oom_split(lambda positions: self._run([items[p] for p in positions]), range(len(items)),
                                   isolate=True)
        if split.failures or split.errors or len(split.calls) > 1:
            logger.warning("merged call of %d requests failed; ran them one by one (%d failed)", len(items),
                           len(split.failures) + len(split.errors))
        return [split.results[p] if p in split.results else split.failures.get(p) or RuntimeError(split.errors[p])
                for p in range(len(items))]

    def _run(self, items: list[WorkItem]) -> list[ItemResult]:
        before = resident_bytes(self.summarizer)
        groups = [(item.texts, item.references) for item in items]
        encoded = None
        if all(item.encoded is not None for item in items):
            encoded = [e for item in items for e in item.encoded]
        results = self.summarizer.summarize_groups(
            groups, encoded=encoded, generation=items[0].generation, cancelled=_abandoned_positions(items)
        )
        call_memory = results[0].memory
        texts = sum(len(item.texts) for item in items)
        self._record(results, texts, before + call_memory["peak_bytes"])
        return [
            ItemResult(result=result, memory=share_memory(result.memory, requests=len(items), texts=texts))
            for result in results
        ]

    def _record(self, results: list[SummaryResult], texts: int, absolute_peak: int) -> None:
        m = self.metrics
        m.batch_requests.observe(len(results))
        m.batch_texts.observe(texts)
        m.observe_peak(absolute_peak)
        m.oom_splits.inc(results[0].oom_splits)
        for result in results:
            m.input_tokens.inc(sum(item["input_tokens"] for item in result.items))
            m.output_tokens.inc(sum(item["output_tokens"] for item in result.items))
            m.padding_avoided.inc(sum(item["padding_avoided"] for item in result.items))
