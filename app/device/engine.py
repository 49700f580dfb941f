"""The service's one model: `Engine`, shared by ``POST /summarize`` and the evaluation jobs.

The app's lifespan builds one `Engine` from the settings' engine options
(`bart_opt.engine.options.EngineOptions`) and hands it to both services. It owns the device worker
(`app.device.worker.Worker`), which loads the model on its own thread when the engine starts, so the
process answers ``/health`` while it loads. Everything the services need from the model goes
through it: its state, name and device, generation settings resolved once, tokenizing from any
thread (`Summarizer.encode` borrows a tokenizer of its own), and the worker for model calls:
interactive work items, and the job batches of `WorkerDevice`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from app.device.runner import SummarizerRunner, resident_bytes
from app.jobs.paths import shown_model
from app.domain_errors import Unavailable
from app.metrics import Metrics
from app.schemas import GenerationOptions
from app.settings import Settings
from app.device.worker import Kind, NotAccepting, QueueFull, State, WorkItem, Worker
from bart_opt.errors import CheckpointError, InvalidRequest
from bart_opt.evaluate.core import Executor, RunControl, SummarizerExecutor
from bart_opt.engine.spec import GenerationSpec
from bart_opt.engine.fingerprint import Fingerprint
from bart_opt.pipeline.summarizer import Encoded, Summarizer

SummarizerLoader = Callable[[Settings], Summarizer]
T = TypeVar("T")

_NOT_READY_RETRY_AFTER_S = 5

logger = logging.getLogger("app.device.engine")


def load_summarizer(settings: Settings, **summarizer_options: Any) -> Summarizer:
    """Load the Summarizer the settings' engine options describe (`bart_opt.engine.options.EngineOptions`).

    `summarizer_options` go to the Summarizer's constructor (e.g. its ``before_model_call`` hook).
    """
    return Summarizer.from_options(settings.engine_options(), **summarizer_options)


def unavailable(state: State, load_error: BaseException | None = None) -> Unavailable:
    """The `Unavailable` for a worker in `state`; the reason's details are in the server log, not here.

    A checkpoint refused as a whole (`load_error` a `CheckpointError`) names its problem, which
    holds no server path.
    """
    retry = _NOT_READY_RETRY_AFTER_S
    if state is State.LOADING:
        return Unavailable("not_ready", "the model is still loading", retry_after=retry)
    if state is State.FAILED:
        problem = f" ({load_error.problem})" if isinstance(load_error, CheckpointError) else ""
        message = f"the model failed to load{problem}; the server log has the reason"
        return Unavailable("model_load_failed", message, retry_after=retry)
    if state is State.DEAD:
        message = "the device worker stopped unexpectedly; the server needs a restart (the log has the reason)"
        return Unavailable("worker_dead", message)
    return Unavailable("shutting_down", "the server is shutting down", retry_after=retry)


class Engine:
    """The loaded model and the device worker that runs it (see the module docstring).

    `load(settings)` builds the Summarizer on the device thread (tests wrap `load_summarizer` to
    hook every model call).
    """

    def __init__(self, settings: Settings, metrics: Metrics, load: SummarizerLoader = load_summarizer) -> None:
        self.settings = settings
        self.metrics = metrics
        self._load_summarizer = load
        self.summarizer: Summarizer | None = None
        self.worker = Worker(self._load, queue_size=settings.queue_size, max_batch_tokens=settings.max_batch_tokens,
                             max_batch_size=settings.max_batch_size, micro_batch=settings.micro_batch)
        for kind in Kind:
            metrics.track_queue(kind.value, lambda kind=kind: self.worker.queue_length(kind))

    # ---- life cycle (the app's lifespan) ----------------------------------------------------

    def start(self) -> None:
        """Start the device worker; it loads the model on its own thread."""
        self.worker.start()

    def stop(self) -> None:
        """Finish what is queued and stop the worker (blocks; run it off the event loop)."""
        self.worker.stop(timeout=self.settings.shutdown_timeout)

    def _load(self) -> SummarizerRunner:
        started = time.perf_counter()
        summarizer = self._load_summarizer(self.settings)
        logger.info("loaded %s on %s in %.1f s", summarizer.name, summarizer.device, time.perf_counter() - started)
        # A checkpoint whose own generation config cannot run fails here, not on every request.
        summarizer.generation_spec()
        self.summarizer = summarizer
        self.metrics.track_device(lambda: resident_bytes(summarizer))
        # The static search's CUDA graphs (None without: off CUDA, or a summarizer with no such model).
        self.metrics.track_graphs(lambda: getattr(getattr(summarizer, "model", None), "graph_stats", None))
        return SummarizerRunner(summarizer, self.metrics)

    @property
    def state(self) -> State:
        return self.worker.state

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the model is loaded (True) or loading failed / timed out (False)."""
        return self.worker.wait_ready(timeout)

    # ---- the model -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The model as the server names it (the setting as given; jobs store it)."""
        return self.settings.model

    @property
    def shown_name(self) -> str:
        """The model as clients see it (see `shown_model`)."""
        return shown_model(self.settings.model)

    @property
    def device(self) -> str | None:
        """The model's device, None before it is loaded."""
        return str(self.summarizer.device) if self.summarizer is not None else None

    @property
    def dtype(self) -> tuple[str, str | None] | None:
        """The model's dtype (``"float32"``) and why it was chosen (`bart_opt.engine.hardware.choose_dtype`),
        None before it is loaded."""
        if self.summarizer is None:
            return None
        return str(self.summarizer.model.dtype).removeprefix("torch."), self.summarizer.dtype_reason

    @property
    def fingerprint(self) -> Fingerprint | None:
        """The loaded checkpoint's fingerprint (`bart_opt.engine.fingerprint`); None before it is loaded
        or when the model came from elsewhere than a checkpoint folder."""
        return self.summarizer.fingerprint if self.summarizer is not None else None

    def weights_bytes(self) -> int | None:
        """The weights' bytes, None before the model is loaded."""
        return self.summarizer.model.weights_bytes() if self.summarizer is not None else None

    def generation_spec(self, overrides: Mapping[str, Any] | None = None) -> GenerationSpec:
        """Generation overrides resolved once over the checkpoint's defaults (raises `InvalidRequest`)."""
        return self.summarizer.generation_spec(overrides)

    def request_spec(self, options: GenerationOptions | None) -> GenerationSpec:
        """A request's generation options resolved once over the checkpoint's defaults.

        Raises `InvalidRequest` with the field under ``generation.`` (`app.errors` maps it).
        """
        try:
            return self.generation_spec(options.overrides() if options is not None else {})
        except InvalidRequest as error:
            raise error.within("generation") from None

    def unavailable(self, state: State) -> Unavailable:
        """The `Unavailable` for the worker in `state` (`unavailable`, with the worker's load error)."""
        return unavailable(state, self.worker.load_error)

    def check_ready(self) -> None:
        """Raise the `Unavailable` that fits the worker's state unless it takes work."""
        if self.state is not State.READY:
            raise self.unavailable(self.state)

    def check_alive(self) -> None:
        """Raise `Unavailable` when the process can no longer serve without a restart (the device worker died)."""
        if self.state is State.DEAD:
            raise self.unavailable(State.DEAD)

    def executor(self) -> Executor:
        """The executor of job batches on this engine: the Summarizer's, each model call a ``Kind.JOB``
        item on the device worker (`WorkerDevice`). Once the model is loaded."""
        return SummarizerExecutor(self.summarizer, device=lambda control: WorkerDevice(self, control))

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """`Summarizer.encode`, from any thread."""
        return self.summarizer.encode(texts)

    # ---- the worker ----------------------------------------------------------------------------

    def submit(self, item: WorkItem) -> WorkItem:
        """Queue `item` on the device worker (raises `QueueFull` or `NotAccepting`)."""
        return self.worker.submit(item)

    def cancel(self, item: WorkItem) -> bool:
        """Drop `item` if it is still queued."""
        return self.worker.cancel(item)

    def queue_length(self, kind: Kind = Kind.INTERACTIVE) -> int:
        return self.worker.queue_length(kind)


class WorkerDevice:
    """The device of one job run: its model calls are ``Kind.JOB`` items on the engine's worker
    (`bart_opt.pipeline.batching.Device`), one at a time, each finished (decoded, scored) there too: the
    next batch goes to the worker as soon as one is done, so the device goes on while the job's
    runner writes that one, and ``POST /summarize`` still waits at most one job batch.

    A stopping `control` drops the queued call (the one on the device finishes); a worker that no
    longer takes work, or that stays full, cancels the call (the run ends there).
    """

    depth = 1
    finishes = True
    queue_full_wait_s = 0.05

    def __init__(self, engine: Engine, control: RunControl) -> None:
        self.engine = engine
        self.control = control
        self._items: dict[Future, WorkItem] = {}
        control.on_change(self._drop_queued)

    @property
    def stopping(self) -> bool:
        return self.control.stopping

    def submit(self, call: Callable[[], T]) -> Future[T]:
        item = WorkItem.job(call)
        while not self.control.stopping:
            try:
                self.engine.submit(item)
            except QueueFull:
                self.control.wait(self.queue_full_wait_s)
                continue
            except NotAccepting:
                break
            self._items[item.future] = item
            item.future.add_done_callback(self._items.pop)
            return item.future
        item.future.cancel()
        return item.future

    def cancel(self, future: Future) -> None:
        item = self._items.get(future)
        if item is not None:
            self.engine.cancel(item)

    def _drop_queued(self) -> None:
        for item in list(self._items.values()):
            self.engine.cancel(item)


__all__ = ["Engine", "SummarizerLoader", "WorkerDevice", "load_summarizer", "shown_model", "unavailable"]
