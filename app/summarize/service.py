"""The summarize service: validation, the cost budget, queueing, waiting (or cancelling), the response.

Routes stay thin: they parse the body and call :meth:`SummarizeService.summarize`, which
returns the response dict or raises a domain error (`app.domain_errors`) / `bart_opt.InvalidRequest`,
which `app.errors` maps to the answer.
The model and its device worker are the app's shared :class:`app.device.engine.Engine`.

A request's work is cancelled wherever it is when its client disconnects or its deadline
passes (the deadline middleware cancels the handler): dropped from the queue, or withdrawn
from the model call it is in between two decoder steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from anyio import to_thread

from app.device.runner import ItemResult
from app.device.engine import Engine
from app.domain_errors import Busy, ClientGone
from app.summarize.limits import RequestLimits
from app.metrics import Metrics
from app.schemas import SummarizeRequest
from app.settings import Settings
from app.device.worker import NotAccepting, QueueFull, State, WorkerDied, WorkItem
from bart_opt.engine.fingerprint import Fingerprint
from bart_opt.pipeline.summarizer import check_text

class ClientDisconnected(ClientGone):
    """The client went away while its request waited; the answer has nowhere to go."""

    def __init__(self) -> None:
        super().__init__("client_closed_request", "the client disconnected; its work was cancelled")


class SummarizeService:
    """Turns ``POST /summarize`` bodies into responses on the shared `Engine`."""

    poll_seconds = 0.05  # how often a waiting request checks that its client is still there

    def __init__(self, settings: Settings, metrics: Metrics, engine: Engine) -> None:
        self.settings = settings
        self.metrics = metrics
        self.engine = engine

    @property
    def state(self) -> State:
        return self.engine.state

    @property
    def model_name(self) -> str:
        """The model as clients see it (see `app.device.engine.shown_model`)."""
        return self.engine.shown_name

    @property
    def device(self) -> str | None:
        """The model's device (None before it is loaded)."""
        return self.engine.device

    @property
    def dtype(self) -> tuple[str, str | None] | None:
        """The model's dtype and why (`Engine.dtype`)."""
        return self.engine.dtype

    @property
    def fingerprint(self) -> Fingerprint | None:
        """The loaded checkpoint's fingerprint (`Engine.fingerprint`)."""
        return self.engine.fingerprint

    def check_ready(self) -> None:
        """The engine's `Unavailable` unless it takes work (`Engine.check_ready`)."""
        self.engine.check_ready()

    def check_alive(self) -> None:
        """The engine's `Unavailable` once the device worker died (`Engine.check_alive`)."""
        self.engine.check_alive()

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
        generation = self.engine.request_spec(body.generation)
        limits.check_cost(len(body.texts), generation)
        for i, reference in enumerate(body.references or ()):
            check_text(reference, f"references[{i}]")
        encoded = await to_thread.run_sync(self.engine.encode, body.texts)  # as Starlette's run_in_threadpool
        limits.check_input(encoded)
        item = WorkItem(texts=body.texts, generation=generation, longest=max(len(e.ids) for e in encoded),
                        references=body.references, encoded=encoded)
        self._submit(item)
        done = await self._wait(item, is_disconnected)
        return self._respond(done, item, started, request_id)

    def _submit(self, item: WorkItem) -> None:
        try:
            self.engine.submit(item)
        except QueueFull as error:
            self.metrics.rejected.labels(reason="queue_full").inc()
            raise Busy("queue_full", f"{error}; retry after {error.retry_after} s",
                       retry_after=error.retry_after) from error
        except NotAccepting as error:
            raise self.engine.unavailable(error.state) from error

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
            raise self.engine.unavailable(State.DEAD) from error
        finally:
            if not future.done():
                self.engine.cancel(item)
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
