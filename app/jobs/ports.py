"""What the jobs need from the rest of the service, as interfaces: `JobEngine` and `Gauges`.

The job service and runner (`app.jobs.service`, `app.jobs.runner`) see the model that runs their
jobs only through `JobEngine`: its identity (``name``, ``fingerprint``), its state, the generation
settings it resolves, and the executor that summarizes a job's batches on it. The service's
`app.device.engine.Engine` is one (its device worker runs the batches); a test's fake engine is another,
so the runner is tested with no model (``tests/app/jobs/test_runner_fake_engine.py``). Their
gauges go to any `Gauges` (the service's `app.metrics.Metrics`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from app.schemas import GenerationOptions
    from bart_opt.evaluate.core import Executor
    from bart_opt.engine.fingerprint import Fingerprint
    from bart_opt.engine.spec import GenerationSpec

GIVEN_UP = ("failed", "stopped")  # states in which an engine will never take work


class JobEngine(Protocol):
    """The model that runs the jobs (see the module docstring)."""

    @property
    def name(self) -> str:
        """The model as the server names it: jobs store it, and a resumed job must match it."""

    @property
    def fingerprint(self) -> Fingerprint | None:
        """The loaded checkpoint's content digest (None before it is loaded, or without a checkpoint folder)."""

    @property
    def state(self) -> str:
        """``loading``, ``ready``, ``failed``, ``dead``, ``stopping`` or ``stopped``
        (`app.device.worker.State`'s values)."""

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the model is loaded (True) or loading failed or timed out (False)."""

    def check_ready(self) -> None:
        """Raise `app.domain_errors.Unavailable` saying why, unless the engine takes work now."""

    def request_spec(self, options: GenerationOptions | None) -> GenerationSpec:
        """A request's generation options resolved over the model's defaults (`InvalidRequest` under
        ``generation.``)."""

    def executor(self) -> Executor:
        """What summarizes a job's batches on this engine (`bart_opt.evaluate.core.Executor`); asked for
        once the model is loaded."""


class Gauges(Protocol):
    """Where the jobs' gauges are registered (`app.metrics.Metrics.gauge`)."""

    def gauge(self, name: str, documentation: str, labelnames: tuple[str, ...] = ()) -> Any:
        """A gauge (``.labels(...).set_function(fn)``) registered under `name`."""


__all__ = ["GIVEN_UP", "Gauges", "JobEngine"]
