"""The evaluation core: one loop that every way of evaluating composes.

`evaluate_records(source, sink, executor, spec)` takes

- a **source** of pending records, a window at a time (`ListSource`: records in memory; the
  service's jobs read theirs from the jobs database), each a `Pending` that may carry why it
  was refused before the model;
- a **sink** that stores `RowBatch`es (a run folder's ``predictions.jsonl``; the jobs database);
- an **executor** that turns the source into row batches: `SummarizerExecutor` (a `Summarizer`,
  its model calls on this thread or on the service's device worker) or a Ray replica pool
  (`bart_opt.distributed.ReplicaPool`, whose replicas run a `SummarizerExecutor` each).

The rules live here, once each:

- **dedupe by id**: a record whose id came earlier in the source, or whose row this run already
  stored, is not run; a row whose id this run already stored (a batch a Ray replica ran twice) is
  dropped (`SeenIds`);
- **refused and failed rows**: `bart_opt.evaluate.rows.refused_row`, for records the source
  refused or that are not valid text (`screened`: `REFUSED`) and for inputs the model failed on
  alone (`FAILED`, one `RowBatch` each);
- **failure splitting**: the pipeline's `run_with_oom_split` with ``isolate``: out of memory
  halves a batch down to one input, any other failure retries it input by input;
  `MAX_FAILURE_STREAK` model failures in a row stop the run (`FailureStreak`);
- **batch planning and the token budget**: `Summarizer.plan`, inside the executor;
- **overlap** of device work with decoding and scoring: `bart_opt.pipeline.batching.pipelined`;
- **metrics beyond ROUGE** (`bart_opt.scoring`): each stored row that has ROUGE is scored with the
  run's other metrics before it is stored (`bart_opt.evaluate.rows.add_scores`), against its record's
  text, remembered from the source's windows only until the row is stored (a source the executor
  reads otherwise, a Ray dataset, may give texts by id: ``texts(ids)``; an executor whose record texts
  are not sources says so, ``texts_are_sources = False``, and scores without them);
- **metrics**, baselines included: `bart_opt.evaluate.metrics.RowTotals`.

`RunControl` is how a run is stopped from another thread: `stop` finishes what is on the device
(its rows are stored) and starts nothing new; `cancel` drops everything.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bart_opt.pipeline.batching import Device, InlineDevice
from bart_opt.pipeline.data import Record
from bart_opt.errors import InvalidRequest
from bart_opt.evaluate.rows import FAILED, MODEL, REFUSED, RowBatch, add_scores, prediction_row, refused_row
from bart_opt.pipeline.rouge import RougeSettings
from bart_opt.scoring.base import Metric
from bart_opt.engine.spec import GenerationSpec
from bart_opt.pipeline.summarizer import CANCELLED, BatchOutcome, Encoded, Summarizer, check_text

MAX_FAILURE_STREAK = 5


@dataclass(frozen=True, slots=True)
class Pending:
    """A record to evaluate: its position in its source, the record, and why it cannot run (or None)."""

    position: int
    record: Record
    refused: str | None = None


def screened(pending: Pending) -> Pending:
    """`pending`, refused when its text or its reference is not valid text (a lone surrogate, which
    no tokenizer, file or database takes): the bad value dropped, the reason kept."""
    if pending.refused is not None:
        return pending
    record, reasons = pending.record, []
    for field, value in (("text", record.text), ("reference", record.reference)):
        try:
            if value is not None:
                check_text(value, field)
        except InvalidRequest as error:
            reasons.append((field, str(error)))
    if not reasons:
        return pending
    bad = dict(reasons)
    kept = Record(record.id, "" if "text" in bad else record.text, None if "reference" in bad else record.reference)
    return Pending(pending.position, kept, reasons[0][1])


class FailureStreak(RuntimeError):
    """`MAX_FAILURE_STREAK` records in a row failed on the model; the message is fit for a client."""

    def __init__(self, streak: int, last_error: str):
        super().__init__(f"{streak} examples in a row failed on the model; the last one: {last_error}")


class RunControl:
    """Stop or cancel a run from another thread, and hear what it waits for.

    `stop()`: what is on the device finishes and is stored, nothing new starts. `cancel()`: nothing
    more is stored. Callbacks given to `on_change` run (on the caller's thread) at either.
    `status(message)` passes a line about what the run waits for or runs on to `on_status`.
    """

    def __init__(self, on_status: Callable[[str], None] = lambda message: None):
        self._stopping = threading.Event()
        self._cancelled = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        self.on_status = on_status

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set() or self._cancelled.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def stop(self) -> None:
        self._stopping.set()
        self._changed()

    def cancel(self) -> None:
        self._cancelled.set()
        self._changed()

    def on_change(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, less once stopping; whether the run is stopping."""
        return self._stopping.wait(timeout) or self.stopping

    def status(self, message: str) -> None:
        self.on_status(message)

    def _changed(self) -> None:
        for callback in list(self._listeners):
            callback()


class SeenIds:
    """Ids of one run as 16-byte digests (an id may be a long string; a million cost about 60 MB)."""

    def __init__(self, ids: Iterable[str] = ()):
        self._digests: set[bytes] = set()
        for record_id in ids:
            self.add(record_id)

    def add(self, record_id: str) -> bool:
        """Note `record_id`; False when it was already there."""
        digest = hashlib.blake2b(record_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if digest in self._digests:
            return False
        self._digests.add(digest)
        return True


class Source(Protocol):
    """Records without a stored row, a bounded window at a time, in order."""

    def windows(self) -> Iterator[list[Pending]]: ...


class Sink(Protocol):
    """Where row batches go. `done` holds the ids stored before this run; `write` stores one batch
    (it raises to stop the run: the run's rows so far stay stored)."""

    done: Container[str]

    def write(self, batch: RowBatch) -> None: ...


class Executor(Protocol):
    """Turns a source into row batches. `model` describes the model for the metrics (see
    `bart_opt.evaluate.metrics.ModelInfo`), `identity` is what a resumed run must match,
    `fingerprint` the content digest of the checkpoint the model calls run on (`bart_opt.engine.fingerprint`;
    a resumed run must match it too), `engine_record` the engine as resolved and `processor` what runs it
    (`bart_opt.evaluate.record`: a resumed run must match the engine), and `in_process` says whether
    the model calls run in this process. `run` scores references with the scorer of `rouge`
    (`bart_opt.pipeline.rouge.RougeSettings`; None: the model's own scorer)."""

    in_process: bool

    @property
    def model(self) -> Any: ...

    @property
    def fingerprint(self) -> str | None: ...

    def identity(self) -> dict[str, Any]: ...

    def engine_record(self) -> dict[str, Any]: ...

    def processor(self) -> dict[str, Any]: ...

    def generation_spec(self, overrides: Mapping[str, Any] | None = None) -> GenerationSpec: ...

    def run(self, source: Source, spec: GenerationSpec, control: RunControl,
            rouge: RougeSettings | None = None) -> Iterator[RowBatch]: ...


@dataclass
class RunReport:
    """What one `evaluate_records` stored: rows, and the device seconds of its in-process model calls."""

    rows: int = 0
    model_seconds: float = 0.0


def evaluate_records(source: Source, sink: Sink, executor: Executor, spec: GenerationSpec, *,
                     control: RunControl | None = None, max_failure_streak: int = MAX_FAILURE_STREAK,
                     rouge: RougeSettings | None = None, metrics: Sequence[Metric] = ()) -> RunReport:
    """Run every pending record of `source` through `executor` and store the rows in `sink`, their
    references scored with `rouge`'s scorer (None: the model's own) and with `metrics` (those beyond
    ROUGE, `bart_opt.scoring.registry.build_metrics`; ROUGE's own entry is skipped).

    Returns once every record has a row, or early when `control` stops or cancels the run.
    Raises `FailureStreak` after `max_failure_streak` model failures in a row (what was stored
    stays), and whatever the sink or the executor raise.
    """
    control = control or RunControl()
    stored = SeenIds()
    report = RunReport()
    streak, last_error = 0, ""
    extra = [metric for metric in metrics if metric.name != "rouge"]
    pending = _Deduped(source, sink.done)
    texts = _Texts(pending, enabled=bool(extra) and getattr(executor, "texts_are_sources", True))
    batches = executor.run(texts, spec, control, rouge=rouge)
    try:
        for batch in batches:
            if control.cancelled:
                return report
            sources = texts.take([row["id"] for row in batch.rows])
            fresh = [k for k, row in enumerate(batch.rows) if stored.add(row["id"])]
            if not fresh:
                continue
            batch = batch if len(fresh) == len(batch.rows) else batch.subset(fresh)
            add_scores(batch.rows, extra, sources)
            sink.write(batch)
            report.rows += len(batch.rows)
            if batch.kind == MODEL:
                report.model_seconds += batch.seconds
                streak = 0
            elif batch.kind == FAILED:
                streak, last_error = streak + 1, batch.rows[0]["error"]
                if streak >= max_failure_streak:
                    raise FailureStreak(streak, last_error)
    finally:
        batches.close()
    return report


class _Deduped:
    """`source` without records stored before (`done`) or repeated within it (the first one runs)."""

    def __init__(self, source: Source, done: Container[str]):
        self.source = source
        self.done = done
        self._seen = SeenIds()

    def windows(self) -> Iterator[list[Pending]]:
        for window in self.source.windows():
            kept = [p for p in window if p.record.id not in self.done and self._seen.add(p.record.id)]
            if kept:
                yield kept

    def __getattr__(self, name: str) -> Any:  # a source's other ways of being read (a Ray dataset)
        return getattr(self.source, name)


class _Texts:
    """`source`, remembering the text of each record its windows hand out until `take` hands it over (only
    when `enabled`: a run that scores nothing beyond ROUGE keeps none)."""

    def __init__(self, source: Any, enabled: bool):
        self.source = source
        self.enabled = enabled
        self._texts: dict[str, str] = {}

    def windows(self) -> Iterator[list[Pending]]:
        for window in self.source.windows():
            if self.enabled:
                self._texts.update((p.record.id, p.record.text) for p in window)
            yield window

    def take(self, ids: Sequence[str]) -> dict[str, str | None]:
        """The texts of records `ids` (None where not known), forgotten here."""
        if not self.enabled:
            return {}
        found = {record_id: self._texts.pop(record_id, None) for record_id in ids}
        unknown = [record_id for record_id, text in found.items() if text is None]
        if unknown and hasattr(self.source, "texts"):  # records read around the windows (a Ray dataset)
            found.update(self.source.texts(unknown))
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


class ListSource:
    """Records in memory as one source (`window`: records per window; None: all in one, so the
    whole dataset is planned at once)."""

    def __init__(self, records: Sequence[Record], window: int | None = None):
        self.records = records
        self.window = window or max(len(records), 1)

    def windows(self) -> Iterator[list[Pending]]:
        for start in range(0, len(self.records), self.window):
            yield [Pending(start + k, record) for k, record in enumerate(self.records[start : start + self.window])]


class SummarizerExecutor:
    """A `Summarizer`'s model calls, on `device(control)` (default: this thread, `InlineDevice`;
    the service passes its device worker). Each window is tokenized here (texts the tokenizer
    refuses get `REFUSED` rows), planned and run through `Summarizer.iter_batches` with failures
    isolated."""

    in_process = True

    def __init__(self, summarizer: Summarizer, device: Callable[[RunControl], Device] = lambda control: InlineDevice()):
        self.summarizer = summarizer
        self._device = device

    @property
    def model(self) -> Summarizer:
        return self.summarizer

    @property
    def fingerprint(self) -> str | None:
        found = self.summarizer.fingerprint
        return None if found is None else str(found)

    def identity(self) -> dict[str, Any]:
        return {"model": self.summarizer.name}

    def engine_record(self) -> dict[str, Any]:
        return self.summarizer.engine_record()

    def processor(self) -> dict[str, Any]:
        from bart_opt.evaluate.record import processor

        return processor(str(self.summarizer.device))

    def generation_spec(self, overrides: Mapping[str, Any] | None = None) -> GenerationSpec:
        return self.summarizer.generation_spec(overrides)

    def run(self, source: Source, spec: GenerationSpec, control: RunControl,
            rouge: RougeSettings | None = None) -> Iterator[RowBatch]:
        for window in source.windows():
            if control.stopping:
                return
            yield from self.run_window(window, spec, control, rouge)

    def run_window(self, window: Sequence[Pending], spec: GenerationSpec, control: RunControl | None = None,
                   rouge: RougeSettings | None = None) -> Iterator[RowBatch]:
        """The row batches of one window: its refused records first, then its planned batches (references
        scored with `rouge`'s scorer, None: the summarizer's)."""
        control = control or RunControl()
        tick = time.perf_counter()
        window = self._encoded([screened(p) for p in window])
        refused = [p for p, _ in window if p.refused is not None]
        if refused:
            yield RowBatch([refused_row(p.record, p.refused) for p in refused], [p.position for p in refused], REFUSED)
        runnable = [(p, encoded) for p, encoded in window if p.refused is None]
        if not runnable:
            return
        tokenize_share = (time.perf_counter() - tick) / len(runnable)
        pending = [p for p, _ in runnable]
        everything = range(len(runnable))
        outcomes = self.summarizer.iter_batches(
            [p.record.text for p in pending], [p.record.reference for p in pending],
            encoded=[e for _, e in runnable], generation=spec, isolate=True, device=self._device(control),
            cancelled=lambda: everything if control.cancelled else (), scorer=None if rouge is None else rouge.scorer(),
        )
        try:
            for outcome in outcomes:
                yield from _row_batches(outcome, runnable, tokenize_share)
        finally:
            outcomes.close()


    def _encoded(self, window: list[Pending]) -> list[tuple[Pending, Encoded | None]]:
        """Each record with its token ids; one the tokenizer refuses (a token the model has no
        embedding for) refused with the reason, the others kept: the window is encoded once, and
        record by record only when that fails."""
        texts = [p.record.text for p in window if p.refused is None]
        try:
            encoded = iter(self.summarizer.encode(texts)) if texts else iter(())
            return [(p, None if p.refused is not None else next(encoded)) for p in window]
        except InvalidRequest:
            pass
        found = []
        for p in window:
            if p.refused is None:
                try:
                    found.append((p, self.summarizer.encode([p.record.text])[0]))
                    continue
                except InvalidRequest as error:
                    p = Pending(p.position, p.record, f"text: {error.message}")
            found.append((p, None))
        return found


def _row_batches(outcome: BatchOutcome, runnable: list[tuple[Pending, Encoded]],
                 tokenize_share: float) -> Iterator[RowBatch]:
    """One `MODEL` batch per model call of `outcome`, then one `FAILED` batch per input the model
    failed on alone (inputs withdrawn by a cancel get none: the run stores nothing more)."""
    peak = outcome.memory["peak_bytes"] if outcome.memory else 0
    for call in outcome.calls:
        done = [p for p in call["positions"] if p not in outcome.errors]
        if done:
            rows = [prediction_row(runnable[p][0].record, outcome.summaries[p], outcome.items[p], peak, tokenize_share)
                    for p in done]
            yield RowBatch(rows, [runnable[p][0].position for p in done], MODEL, peak, call["seconds"])
    for p, reason in outcome.errors.items():
        if reason != CANCELLED:
            pending, encoded = runnable[p]
            yield RowBatch([refused_row(pending.record, reason, encoded)], [pending.position], FAILED)


def iter_predictions(executor: Executor | Summarizer, records: Sequence[Record], spec: GenerationSpec, *,
                     skip_ids: Container[str] = ()) -> Iterator[RowBatch]:
    """The row batches of every record whose id is not in `skip_ids`, with no storage (a plain
    generator: the consumer decides where rows go and when to stop)."""
    executor = SummarizerExecutor(executor) if isinstance(executor, Summarizer) else executor
    return executor.run(_Deduped(ListSource(records), skip_ids), spec, RunControl())


__all__ = ["MAX_FAILURE_STREAK", "Executor", "FailureStreak", "ListSource", "Pending", "RunControl", "RunReport",
           "SeenIds", "Sink", "Source", "SummarizerExecutor", "evaluate_records", "iter_predictions", "screened"]
