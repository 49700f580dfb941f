"""What the `bart_opt.pipeline.summarizer.Summarizer` gives back: `SummaryResult`, `BatchOutcome`, `Encoded`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

PHASES = ("tokenize", "generate", "decode", "score")
CANCELLED = "cancelled: the caller withdrew this input before its summary was finished"
FAILED = "the model failed on this example (internal error; the server log has the details)"


@dataclass
class SummaryResult:
    """The result of one `summarize` call (lists in input order).

    summaries: one string per text ("" for an input in `errors`).
    rouge: aggregate ROUGE with bootstrap intervals over the items that have a reference,
        or None when no reference was given.
    items: per text ``{"input_tokens", "truncated", "output_tokens", "rouge", "error",
        "padding_computed", "padding_avoided", "call", "timing"}``; ``call`` indexes
        `batches`, ``timing`` is this item's share of each phase in seconds.
    memory: the `bart_opt.engine.memory.MemoryLog.report()` dict of the call.
    timing: seconds per phase: tokenize, generate, decode, score, total.
    batches: one dict per model call: size, columns, tokens, padding_computed,
        padding_avoided, num_beams, budget_tokens, seconds, positions.
    errors: per text None, or why it has no summary (out of memory even alone, or `CANCELLED`).
    generation: the `GenerationSpec` that ran, as a dict (`GenerationSpec.to_dict`).
    oom_splits: how many times a batch was halved after running out of memory.
    """

    summaries: list[str]
    rouge: dict | None
    items: list[dict]
    memory: dict
    timing: dict
    batches: list[dict] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    generation: dict = field(default_factory=dict)
    oom_splits: int = 0

    def to_dict(self) -> dict:
        """A JSON-serialisable dict of every field."""
        return asdict(self)


@dataclass
class Encoded:
    """One tokenized input: its ids (special tokens included) and whether they were cut."""

    ids: list[int]
    truncated: bool


@dataclass
class BatchOutcome:
    """One planned batch, finished: what `Summarizer.iter_batches` yields.

    positions: input positions of the batch (into the texts given), longest first.
    summaries / items / errors: keyed by input position (items as in `SummaryResult`).
    calls: the batch's model-call stats; more than one when it was split after OOM.
    memory: this batch's memory report when yielded by `iter_batches`, else None.
    timing: seconds per phase spent on this batch (tokenize excluded).
    """

    positions: list[int]
    summaries: dict[int, str]
    items: dict[int, dict]
    errors: dict[int, str]
    calls: list[dict]
    oom_splits: int
    timing: dict[str, float]
    memory: dict | None = None


__all__ = ["CANCELLED", "FAILED", "PHASES", "BatchOutcome", "Encoded", "SummaryResult"]
