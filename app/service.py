"""The summarize service: validation, the cost budget, queueing, waiting (or cancelling), the response.

Routes stay thin: they parse the body and call :meth:`SummarizeService.summarize`, which
returns the response dict or raises :class:`app.errors.ApiError` / `bart_opt.InvalidRequest`.
The service owns the :class:`app.worker.Worker`; the model is loaded on the worker's thread
when the service starts (the app's lifespan), so the process answers ``/health`` while it loads.

A request's work is cancelled wherever it is when its client disconnects or its deadline
passes (the deadline middleware cancels the handler): dropped from the queue, or withdrawn
from the model call it is in between two decoder steps.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import torch
from starlette.concurrency import run_in_threadpool

from app.errors import ApiError
from app.limits import RequestLimits
from app.metrics import Metrics
from app.runner import ItemResult, SummarizerRunner, resident_bytes
from app.schemas import GenerationOptions, SummarizeRequest
from app.settings import Settings
from app.worker import Kind, NotAccepting, QueueFull, State, WorkerDied, WorkItem, Worker
from bart_opt.errors import CheckpointError, InvalidRequest
from bart_opt.spec import GenerationSpec
from bart_opt.summarizer import Summarizer, check_text

SummarizerLoader = Callable[[Settings], Summarizer]

logger = logging.getLogger("app.service")

_NOT_READY_RETRY_AFTER = "5"


def load_summarizer(settings: Settings, **summarizer_options) -> Summarizer:
    """Load the Summarizer the settings describe ('auto' device and dtype left to the pipeline).

    `summarizer_options` go to the Summarizer's constructor (e.g. its ``before_model_call`` hook).
    """
    return Summarizer.from_pretrained(
        settings.model,
        device=None if settings.device == "auto" else settings.device,
        dtype=None if settings.dtype == "auto" else getattr(torch, settings.dtype),
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_size=settings.max_batch_size,
        max_beams=settings.max_beams,
        exact=settings.exact,
        fast=settings.fast,
        **summarizer_options,
    )



def shown_model(model: str) -> str:
    """A model as clients see it: a hub id or relative folder as given, an absolute folder by its
    last component only (server paths stay out of responses)."""
    path = Path(model)
    return path.name if path.is_absolute() else model

class ClientDisconnected(ApiError):
    """The client went away while its request waited; the answer has nowhere to go."""

    def __init__(self) -> None:
        super().__init__(499, "client_closed_request", "the client disconnected; its work was cancelled")


class SummarizeService:
    """Owns the worker and turns ``POST /summarize`` bodies into responses."""

    poll_seconds = 0.05  # how often a waiting request checks that its client is still there

    def __init__(self, settings: Settings, metrics: Metrics, load: SummarizerLoader = load_summarizer) -> None:
        self.settings = settings
        self.metrics = metrics
        self._load_summarizer = load
        self.summarizer: Summarizer | None = None
        self.worker: Worker | None = None
        self._counter: Summarizer | None = None
        self._counter_lock = threading.Lock()
        for kind in Kind:
            metrics.track_queue(kind.value, lambda kind=kind: self.worker.queue_length(kind) if self.worker else 0)

    # ---- life cycle (called from the app's lifespan) ---------------------------------------

    def start(self) -> None:
        """Start a worker; it loads the model on its own thread."""
        s = self.settings
        self.worker = Worker(
            self._load,
            queue_size=s.queue_size,
            max_batch_tokens=s.max_batch_tokens,
            max_batch_size=s.max_batch_size,
            micro_batch=s.micro_batch,
        )
        self.worker.start()

    def stop(self) -> None:
        """Finish what is queued and stop the worker (blocks; run it off the event loop)."""
        if self.worker is not None:
            self.worker.stop(timeout=self.settings.shutdown_timeout)

    def _load(self) -> SummarizerRunner:
        if self.settings.torch_threads is not None:
            torch.set_num_threads(self.settings.torch_threads)
        started = time.perf_counter()
        summarizer = self._load_summarizer(self.settings)
        logger.info("loaded %s on %s in %.1f s", summarizer.name, summarizer.device, time.perf_counter() - started)
        # A checkpoint whose own generation config cannot run fails here, not on every request.
        summarizer.generation_spec()
        # Token counting for the batcher runs on request threads; a private tokenizer copy keeps
        # it from touching the tokenizer the device thread is using.
        counter = copy.copy(summarizer)
        counter.tokenizer = copy.deepcopy(summarizer.tokenizer)
        self._counter = counter
        self.summarizer = summarizer
        self.metrics.track_device(lambda: resident_bytes(summarizer))
        return SummarizerRunner(summarizer, self.metrics)

    @property
    def state(self) -> State:
        return self.worker.state if self.worker is not None else State.LOADING

    @property
    def model_name(self) -> str:
        """The model as clients see it (see `shown_model`)."""
        return shown_model(self.settings.model)

    def check_ready(self) -> None:
        """Raise the 503 that fits the worker's state unless it takes work."""
        if self.state is not State.READY:
            raise self._unavailable(self.state)

    def check_alive(self) -> None:
        """Raise a 503 when the process can no longer serve without a restart (the device worker died)."""
        if self.state is State.DEAD:
            raise self._unavailable(State.DEAD)

    def _unavailable(self, state: State) -> ApiError:
        """The 503 for a worker in `state`; the reason's details are in the server log, not here."""
        retry = {"Retry-After": _NOT_READY_RETRY_AFTER}
        if state is State.LOADING:
            return ApiError(503, "not_ready", "the model is still loading", headers=retry)
        if state is State.FAILED:
            error = self.worker.load_error if self.worker is not None else None
            problem = f" ({error.problem})" if isinstance(error, CheckpointError) else ""  # no server path in it
            message = f"the model failed to load{problem}; the server log has the reason"
            return ApiError(503, "model_load_failed", message, headers=retry)
        if state is State.DEAD:
            message = "the device worker stopped unexpectedly; the server needs a restart (the log has the reason)"
            return ApiError(503, "worker_dead", message)
        return ApiError(503, "shutting_down", "the server is shutting down", headers=retry)

    def generation_spec(self, options: GenerationOptions | None) -> GenerationSpec:
        """A request's generation options resolved once over the checkpoint's defaults.

        Raises `InvalidRequest` with the field under ``generation.`` (the 422 mapping is in app.errors).
        """
        try:
            return self.summarizer.generation_spec(options.overrides() if options is not None else {})
        except InvalidRequest as error:
            raise error.within("generation") from None

    # ---- POST /summarize -------------------------------------------------------------------

    async def summarize(
        self,
        body: SummarizeRequest,
        request_id: str,
        is_disconnected: Callable[[], Awaitable[bool]],
        *,
        limits: RequestLimits,
    ) -> dict:
        """Validate, check the budget, queue, wait for the device and build the response dict.

        `is_disconnected` is polled while the request waits; `limits` is the budget of the
        settings in effect (the route takes it from the settings dependency). Everything that
        can refuse the request does so before it is queued.
        """
        started = time.perf_counter()
        self.check_ready()
        limits.check_texts(len(body.texts))
        generation = self.generation_spec(body.generation)
        limits.check_cost(len(body.texts), generation)
        for i, reference in enumerate(body.references or ()):
            check_text(reference, f"references[{i}]")
        encoded = await run_in_threadpool(self._encode, body.texts)
        limits.check_input(encoded)
        item = WorkItem(texts=body.texts, generation=generation, longest=max(len(e.ids) for e in encoded),
                        references=body.references, encoded=encoded)
        self._submit(item)
        done = await self._wait(item, is_disconnected)
        return self._respond(done, item, started, request_id)

    def _encode(self, texts: list[str]) -> list:
        with self._counter_lock:
            return self._counter.encode(texts)

    def _submit(self, item: WorkItem) -> None:
        try:
            self.worker.submit(item)
        except QueueFull as error:
            self.metrics.rejected.labels(reason="queue_full").inc()
            raise ApiError(
                429, "queue_full", f"{error}; retry after {error.retry_after} s",
                headers={"Retry-After": str(error.retry_after)},
            ) from error  # fmt: skip
        except NotAccepting as error:
            raise self._unavailable(error.state) from error

    async def _wait(self, item: WorkItem, is_disconnected: Callable[[], Awaitable[bool]]) -> ItemResult:
        """Await the item's result; if the client goes away or the handler is cancelled (deadline),
        drop the item from the queue or withdraw it from its model call."""
        future = asyncio.wrap_future(item.future)
        try:
            while True:
                done, _ = await asyncio.wait({future}, timeout=self.poll_seconds)
                if done:
                    return future.result()
                if await is_disconnected():
                    raise ClientDisconnected()
        except WorkerDied as error:
            raise self._unavailable(State.DEAD) from error
        finally:
            if not future.done():
                self.worker.cancel(item)
                item.abandon()
                future.cancel()
                self.metrics.cancelled.inc()

    def _respond(self, done: ItemResult, item: WorkItem, started: float, request_id: str) -> dict:
        result = done.result
        timing = {"queue": item.queue_seconds}
        timing.update({phase: result.timing[phase] for phase in ("tokenize", "generate", "decode", "score")})
        timing["total"] = time.perf_counter() - started
        items = [
            {key: entry[key] for key in ("input_tokens", "truncated", "output_tokens", "rouge", "error")}
            for entry in result.items
        ]
        response = {
            "summaries": result.summaries,
            "rouge": result.rouge,
            "items": items,
            "memory": done.memory,
            "timing": timing,
            "model": self.model_name,
            "generation": result.generation,
            "request_id": request_id,
        }
        self.metrics.request_peak_memory.observe(done.memory["peak_bytes"])
        self.metrics.record_request({
            "request_id": request_id,
            "time": time.time(),
            "texts": len(item.texts),
            "input_tokens": sum(entry["input_tokens"] for entry in items),
            "output_tokens": sum(entry["output_tokens"] for entry in items),
            "memory": done.memory,
            "timing": timing,
        })  # fmt: skip
        return response
