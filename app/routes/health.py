"""``GET /health`` (liveness) and ``GET /ready`` (readiness); both open without an API key.

``/health`` is 503 only when the process cannot serve again without a restart: the device
worker died, or it holds nearly all the file descriptors it may (``descriptors_exhausted``,
at ``BART_OPT_FD_UNHEALTHY_FRACTION`` of ``RLIMIT_NOFILE``; the use is in every answer). A
model that failed to load keeps ``/health`` at 200 (a restart with the same settings fails
the same way; ``/ready`` says why it is not ready). A ready ``/ready`` names the checkpoint by
its fingerprint (`bart_opt.engine.fingerprint`) and lists the operator faults in effect
(`app.startup`), and its engine as resolved (what jobs record, quantize included). While the jobs database cannot be opened it reads ``degraded``, with a
``jobs_unavailable`` warning naming why (a refused login, a missing right, an unreachable server).
While the jobs database is damaged it reads ``degraded``, with a
``jobs_store_damaged`` warning that says so: ``/summarize`` still serves, evaluation jobs are off
(their routes answer 503 without ``Retry-After``: waiting will not mend it). While this process's job
runner fails to read the job queue (it retries, backing off to 5 s) it reads ``degraded`` too, with a
``jobs_queue_unreadable`` warning: how many reads failed in a row and since when; the cause is in the
server log only.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from app import startup
from app.descriptors import descriptor_use
from app.errors import ApiError

router = APIRouter(tags=["health"])


class Descriptors(BaseModel):
    open: int
    limit: int


class Health(BaseModel):
    status: str
    descriptors: Descriptors | None = None


class ReadyWarning(BaseModel):
    """An operator fault that disables one thing (``code``, e.g. ``data_dir_missing``); ``message`` says what."""

    code: str
    message: str


class Ready(BaseModel):
    status: str = Field(description="``ready``, or ``degraded`` while the jobs database cannot be opened or is "
                        "damaged, or the job runner cannot read its queue (see warnings)")
    model: str
    device: str
    dtype: str = Field(description="The dtype the model runs in (float32, float16, bfloat16)")
    dtype_reason: str | None = Field(
        None, description="Why: dtype=auto's choice for this device and processor, or the warning an explicit "
        "bfloat16 gets on a CPU without native bfloat16")
    fingerprint: str | None = Field(
        description="sha256 over the checkpoint's files as loaded (weights, config, generation config, tokenizer)")
    engine: dict | None = Field(
        None, description="The engine as resolved (dtype, mode, static, el_attention, quantize, device, batch "
        "budgets): evaluation jobs record it, and a replica runs only jobs of its own engine")
    warnings: list[ReadyWarning] = Field(description="Operator faults in effect; the service runs without what they name")


@router.get("/health", response_model=Health,
            responses={503: {"description": "The device worker died, or nearly every file descriptor is taken; restart"}})
async def health(request: Request) -> dict:
    """200 while the process can serve; 503 (code ``worker_dead``) once the device worker has died,
    (``descriptors_exhausted``) once its open descriptors reach the unhealthy fraction of its limit."""
    request.app.state.service.check_alive()
    use = descriptor_use()
    fraction = request.app.state.settings.fd_unhealthy_fraction
    if use is not None and use.near_limit(fraction):
        raise ApiError(503, "descriptors_exhausted", f"the process holds {use.open} of the {use.limit} file "
                       f"descriptors it may open (unhealthy from {fraction:.0%}: BART_OPT_FD_UNHEALTHY_FRACTION); "
                       "restart it")
    return {"status": "ok", "descriptors": None if use is None else {"open": use.open, "limit": use.limit}}


@router.get("/ready", response_model=Ready,
            responses={503: {"description": "Model loading, failed to load, worker dead or shutting down"}})
async def ready(request: Request) -> dict:
    """200 once the model is loaded and the worker takes requests (``degraded`` while the jobs
    database is damaged or the job runner cannot read its queue); 503 with the reason otherwise."""
    service = request.app.state.service
    service.check_ready()
    jobs = request.app.state.jobs
    problems = [problem for problem in (jobs.damage(), jobs.store_problem(), jobs.queue_problem())
                if problem is not None]
    fingerprint = service.fingerprint
    dtype, dtype_reason = service.dtype
    return {"status": "degraded" if problems else "ready", "model": service.model_name, "device": service.device,
            "dtype": dtype, "dtype_reason": dtype_reason, "fingerprint": None if fingerprint is None else str(fingerprint),
            "engine": jobs.engine_record(), "warnings": startup.warnings(request.app.state.settings) + problems}
