"""`Job`: one evaluation job as the store holds it, a frozen value passed between the layers.

The store builds it (`JobStore` reads a row and calls `Job.from_row`); the runner, the API
view (`app.jobs.bodies.JobView.of`) and compare read its attributes. Field names are the
``jobs`` table's column names; JSON columns arrive decoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")  # a job the API shows is in one of these
ACTIVE = ("queued", "running")


@dataclass(frozen=True)
class Job:
    """An evaluation job: what was asked, how far it is, who runs it, and (once finished) its result.

    status: ``loading`` (records still streaming in), ``queued``, ``running``, ``succeeded``,
        ``failed`` or ``cancelled``.
    model: the checkpoint the job was submitted for, as the server names it (see `shown_model`).
    fingerprint: the content digest of that checkpoint (`bart_opt.engine.fingerprint`); the job runs only on
        a model with the same one. None for a job from before fingerprints (schema 6).
    dataset / columns / generation: the source as shown, the effective column names, and the
        resolved `bart_opt.GenerationSpec` as a dict.
    record_limit: the submission's ``limit`` (None: every record).
    baselines: names of the baselines scored beside the model at the end.
    total / done / failed: records, rows stored, rows with an error.
    work_s / active_s: summed work seconds of the stored rows; wall seconds spent running.
    peak_bytes: the largest batch memory peak so far.
    runs / stalled_runs / done_at_start: run bookkeeping (see `JobStore.claim_next`).
    owner / lease_until: the process holding the job, and until when its claim holds.
    created_at / started_at / finished_at: ``time.time()`` stamps (None until they happen).
    error: why the job failed; status_detail: what a running job waits for or runs on.
    metrics: the final metrics (`bart_opt.evaluate` shape), None before the job succeeded.
    system: ``bart`` (the model runs it) or ``external`` (its records carry another system's predictions).
    engine / engine_key: the engine of the server it was submitted to (`bart_opt.evaluate.record`); only a
        replica with the same `engine_key` runs it. None for external jobs and jobs from before schema 7.
    rouge_settings: its `bart_opt.pipeline.rouge.RougeSettings` as a dict (None before schema 7: the defaults).
    record: the rest of its run record: ``versions``, ``processor``, ``started_at``, ``signature``, and for
        an external job the system's ``name``.
    waiting_since: when it last became claimable (sealed or handed back).
    """

    id: str
    idempotency_key: str | None
    request_hash: str
    status: str
    model: str
    fingerprint: str | None
    dataset: dict
    columns: dict
    record_limit: int | None
    generation: dict
    baselines: tuple[str, ...]
    total: int
    done: int
    failed: int
    work_s: float
    active_s: float
    runs: int
    stalled_runs: int
    done_at_start: int | None
    peak_bytes: int
    owner: str | None
    lease_until: float | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    error: str | None
    status_detail: str | None
    metrics: dict | None
    system: str = "bart"
    engine: dict | None = None
    engine_key: str | None = None
    rouge_settings: dict | None = None
    record: dict | None = None
    waiting_since: float | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Job:
        """A job from a row of the ``jobs`` table with its JSON columns decoded (other keys are ignored)."""
        values = {f.name: row[f.name] for f in fields(cls)}
        values["baselines"] = tuple(values["baselines"] or ())
        return cls(**values)

    @property
    def active(self) -> bool:
        """Whether the job may still run (queued or running)."""
        return self.status in ACTIVE

    @property
    def pending(self) -> int:
        """Records without a stored row yet."""
        return self.total - self.done


__all__ = ["ACTIVE", "STATUSES", "Job"]
