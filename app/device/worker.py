"""The single thread that owns the device: loads the model, then runs queued work in micro-batches.

Two kinds of work share the thread:

- **interactive** items (one ``POST /summarize`` each) wait in a bounded FIFO queue; a full
  queue refuses new ones (:class:`QueueFull`; the summarize service reports `app.domain_errors.Busy`).
  When the device frees up, the worker takes the oldest item and, with micro-batching on, every other waiting item
  with the *same generation settings* while the merged call stays within the token budget
  (``longest input x texts x beams <= max_batch_tokens`` and ``texts <= max_batch_size``).
- **job** items (one model call of an evaluation job each: a callable, `WorkItem.job`) wait in
  their own small queue and are never merged.

Interleaving: interactive work goes first, but after ``interactive_burst`` interactive calls in
a row a waiting job batch gets its turn. So a request waits at most one job batch, and a job
still advances under a steady stream of requests.

The worker knows nothing about models: ``load()`` runs on the thread and returns the *runner*,
``runner(items) -> results`` (one result, or one exception instance, per item, in order), which
runs interactive items; a job item is its own call.

The thread cannot die silently: a failing batch fails only its items, and anything else that
escapes the serving loop puts the worker in the ``dead`` state, fails every waiting item with
:class:`WorkerDied` and is logged once. A submitter that no longer wants a running item's result
calls ``item.abandon()``; the runner polls ``item.abandoned`` and stops that item's work.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from bart_opt.pipeline.batching import fits_budget
from bart_opt.engine.spec import GenerationSpec

logger = logging.getLogger("app.device.worker")

Runner = Callable[[list["WorkItem"]], Sequence[Any]]


class Kind(str, Enum):
    """What a work item is; decides its queue and its priority."""

    INTERACTIVE = "interactive"
    JOB = "job"


class State(str, Enum):
    """Life cycle of the worker: loading -> ready -> stopping -> stopped (or loading -> failed, or
    ready -> dead when the serving loop ends unexpectedly)."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    DEAD = "dead"
    STOPPING = "stopping"
    STOPPED = "stopped"


class QueueFull(Exception):
    """The queue for this kind of work is full; retry after ``retry_after`` seconds."""

    def __init__(self, kind: Kind, capacity: int, retry_after: int) -> None:
        super().__init__(f"the {kind.value} queue is full ({capacity} waiting)")
        self.retry_after = retry_after


class WorkerDied(Exception):
    """The device thread stopped unexpectedly; this item will never run."""


class NotAccepting(Exception):
    """The worker is not taking work (model still loading, failed to load, or shutting down)."""

    def __init__(self, state: State, reason: str) -> None:
        super().__init__(reason)
        self.state = state


@dataclass(eq=False)
class WorkItem:
    """One unit of queued work and the future its submitter waits on.

    ``generation`` is the resolved `bart_opt.GenerationSpec` (frozen, so equal settings compare
    equal and it is the micro-batching key); ``longest`` is the token count of the longest text;
    ``references`` (optional, one per text) are passed through to the runner, and so is
    ``encoded`` (the summarizer's `encode` output for ``texts``), so nothing is tokenized twice.
    ``enqueued`` and ``started`` are ``time.perf_counter()`` stamps; ``started`` is set by the
    worker just before the runner is called. ``abandoned`` is set by `abandon`. A job item
    (`job`) has only ``call``, which the worker runs on the device thread for its result.
    """

    texts: list[str]
    generation: GenerationSpec | None
    longest: int
    references: list[str] | None = None
    encoded: list | None = None
    kind: Kind = Kind.INTERACTIVE
    call: Callable[[], Any] | None = None
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.perf_counter)
    started: float | None = None
    _abandoned: threading.Event = field(default_factory=threading.Event, repr=False)

    @classmethod
    def job(cls, call: Callable[[], Any]) -> WorkItem:
        """A job item: `call` runs on the device thread and its return value is the item's result."""
        return cls(texts=[], generation=None, longest=0, kind=Kind.JOB, call=call)

    def abandon(self) -> None:
        """The submitter no longer wants the result: a running item's work stops (see the runner)."""
        self._abandoned.set()

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    @property
    def key(self) -> Hashable:
        """Items with equal keys may share a model call."""
        return self.generation

    @property
    def beams(self) -> int:
        return self.generation.num_beams

    @property
    def queue_seconds(self) -> float:
        """Seconds between submission and the start of the model call (0 while still queued)."""
        return 0.0 if self.started is None else self.started - self.enqueued


class Worker:
    """Owns the device thread, the two queues and the batching policy (see the module docstring)."""

    def __init__(
        self,
        load: Callable[[], Runner],
        *,
        queue_size: int,
        max_batch_tokens: int,
        max_batch_size: int,
        micro_batch: bool = True,
        job_queue_size: int = 2,
        interactive_burst: int = 4,
    ) -> None:
        self._load = load
        self.queue_size = queue_size
        self.job_queue_size = job_queue_size
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.micro_batch = micro_batch
        self.interactive_burst = interactive_burst
        self._queues: dict[Kind, deque[WorkItem]] = {Kind.INTERACTIVE: deque(), Kind.JOB: deque()}
        self._cond = threading.Condition()
        self._state = State.LOADING
        self._runner: Runner | None = None
        self._streak = 0
        self._item_seconds = 0.0  # moving average of device seconds per item, for Retry-After
        self._running: list[WorkItem] = []  # the batch on the device
        self.load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="bart-opt-device", daemon=True)

    # ---- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the device thread; it loads the model, then serves the queues."""
        self._thread.start()

    @property
    def state(self) -> State:
        return self._state

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the model is loaded (True) or loading failed / timed out (False)."""
        with self._cond:
            self._cond.wait_for(lambda: self._state is not State.LOADING, timeout)
            return self._state is State.READY

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new work, finish the interactive items already queued, drop queued job items, join.

        Dropped job items get their future cancelled; a job resumes from its store on restart.
        """
        with self._cond:
            if self._state in (State.LOADING, State.READY):
                self._state = State.STOPPING
            for item in self._queues[Kind.JOB]:
                item.future.cancel()
            self._queues[Kind.JOB].clear()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with self._cond:
            if self._state is State.STOPPING and not self._thread.is_alive():
                self._state = State.STOPPED

    # ---- submitting -------------------------------------------------------------------

    def submit(self, item: WorkItem) -> WorkItem:
        """Queue `item`; raises :class:`NotAccepting` or :class:`QueueFull` instead of waiting."""
        with self._cond:
            if self._state is not State.READY:
                raise NotAccepting(self._state, self._refusal_reason())
            queue = self._queues[item.kind]
            capacity = self.queue_size if item.kind is Kind.INTERACTIVE else self.job_queue_size
            if len(queue) >= capacity:
                raise QueueFull(item.kind, capacity, self._retry_after_locked())
            item.enqueued = time.perf_counter()
            queue.append(item)
            self._cond.notify_all()
        return item

    def cancel(self, item: WorkItem) -> bool:
        """Drop `item` if it is still queued (True); a running item finishes and its result is discarded."""
        with self._cond:
            queue = self._queues[item.kind]
            if item in queue and item.future.cancel():
                queue.remove(item)
                return True
            return False

    def queue_length(self, kind: Kind = Kind.INTERACTIVE) -> int:
        """Items of `kind` waiting (not counting the batch on the device)."""
        return len(self._queues[kind])

    def retry_after(self) -> int:
        """Whole seconds a refused client should wait: the queue ahead of it at the recent pace."""
        with self._cond:
            return self._retry_after_locked()

    def _retry_after_locked(self) -> int:
        waiting = len(self._queues[Kind.INTERACTIVE]) + len(self._queues[Kind.JOB])
        return max(1, math.ceil(self._item_seconds * waiting))

    def _refusal_reason(self) -> str:
        if self._state is State.LOADING:
            return "the model is still loading"
        if self._state is State.FAILED:
            return "the model failed to load"
        if self._state is State.DEAD:
            return "the device worker stopped unexpectedly"
        return "the server is shutting down"

    # ---- the device thread ------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._runner = self._load()
        except BaseException as error:  # noqa: BLE001 - any load failure must reach /ready, not kill silently
            logger.exception("model load failed")
            with self._cond:
                self.load_error = error
                self._state = State.FAILED
                self._cond.notify_all()
            return
        with self._cond:
            if self._state is State.LOADING:
                self._state = State.READY
            self._cond.notify_all()
        try:
            self._serve()
        except BaseException:  # noqa: BLE001 - the thread ends here either way; /ready and waiters must know
            logger.exception("the device worker stopped unexpectedly")
            self._die()
            return
        with self._cond:
            self._state = State.STOPPED
            self._cond.notify_all()

    def _serve(self) -> None:
        """Run batches until stopping with nothing left to do."""
        while (batch := self._next_batch()) is not None:
            self._running = batch
            self._execute(batch)
            self._running = []

    def _die(self) -> None:
        """Refuse new work and fail the running and waiting items at once."""
        with self._cond:
            self._state = State.DEAD
            items = [*self._running, *self._queues[Kind.INTERACTIVE], *self._queues[Kind.JOB]]
            for queue in self._queues.values():
                queue.clear()
            self._cond.notify_all()
        for item in items:
            if not item.future.done():
                item.future.set_exception(WorkerDied("the device worker stopped unexpectedly"))

    def _next_batch(self) -> list[WorkItem] | None:
        """Wait for work and pick the next batch; None once stopping with nothing left to do."""
        with self._cond:
            while True:
                interactive, jobs = self._queues[Kind.INTERACTIVE], self._queues[Kind.JOB]
                if interactive and not (jobs and self._streak >= self.interactive_burst):
                    self._streak += 1
                    batch = self._take_interactive()
                elif jobs:
                    self._streak = 0
                    batch = [jobs.popleft()]
                elif self._state is State.STOPPING:
                    return None
                else:
                    self._cond.wait()
                    continue
                # An item cancelled before this point is skipped; the rest can no longer be cancelled.
                batch = [item for item in batch if item.future.set_running_or_notify_cancel()]
                if batch:
                    return batch

    def _take_interactive(self) -> list[WorkItem]:
        """The oldest interactive item plus, when micro-batching, compatible items that fit the budget."""
        queue = self._queues[Kind.INTERACTIVE]
        first = queue.popleft()
        batch = [first]
        if not self.micro_batch:
            return batch
        longest, size = first.longest, len(first.texts)
        left: deque[WorkItem] = deque()
        while queue:
            item = queue.popleft()
            new_longest, new_size = max(longest, item.longest), size + len(item.texts)
            fits = fits_budget(new_longest, new_size, first.beams, max_batch_tokens=self.max_batch_tokens,
                               max_batch_size=self.max_batch_size)
            if item.key == first.key and fits:
                batch.append(item)
                longest, size = new_longest, new_size
            else:
                left.append(item)
        self._queues[Kind.INTERACTIVE] = left
        return batch

    def _execute(self, batch: list[WorkItem]) -> None:
        started = time.perf_counter()
        for item in batch:
            item.started = started
        try:
            results = [batch[0].call()] if batch[0].call is not None else list(self._runner(batch))
            if len(results) != len(batch):
                raise RuntimeError(f"runner returned {len(results)} results for {len(batch)} items")
        except BaseException as error:  # noqa: BLE001 - the thread must survive any failed batch
            logger.exception("batch of %d items failed", len(batch))
            results = [error] * len(batch)
        for item, result in zip(batch, results):
            if isinstance(result, BaseException):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)
        per_item = (time.perf_counter() - started) / len(batch)
        with self._cond:
            self._item_seconds = per_item if self._item_seconds == 0 else 0.8 * self._item_seconds + 0.2 * per_item
