"""``GET /health`` (liveness) and ``GET /ready`` (readiness); both open without an API key.

``/health`` is 503 only when the process cannot serve again without a restart: the device
worker died. A model that failed to load keeps ``/health`` at 200 (a restart with the same
settings fails the same way; ``/ready`` says why it is not ready). A ready ``/ready`` names the
checkpoint by its fingerprint (`bart_opt.fingerprint`) and lists the operator faults in effect
(`app.startup`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from app import startup

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class ReadyWarning(BaseModel):
    """An operator fault that disables one thing (``code``, e.g. ``data_dir_missing``); ``message`` says what."""

    code: str
    message: str


class Ready(BaseModel):
    status: str
    model: str
    device: str
    fingerprint: str | None = Field(
        description="sha256 over the checkpoint's files as loaded (weights, config, generation config, tokenizer)")
    warnings: list[ReadyWarning] = Field(description="Operator faults in effect; the service runs without what they name")


@router.get("/health", response_model=Health, responses={503: {"description": "The device worker died; restart"}})
async def health(request: Request) -> dict:
    """200 while the process can serve; 503 (code ``worker_dead``) once the device worker has died."""
    request.app.state.service.check_alive()
    return {"status": "ok"}


@router.get("/ready", response_model=Ready,
            responses={503: {"description": "Model loading, failed to load, worker dead, or shutting down"}})
async def ready(request: Request) -> dict:
    """200 once the model is loaded and the worker takes requests; 503 with the reason otherwise."""
    service = request.app.state.service
    service.check_ready()
    fingerprint = service.summarizer.fingerprint
    return {"status": "ready", "model": service.model_name, "device": str(service.summarizer.device),
            "fingerprint": None if fingerprint is None else str(fingerprint),
            "warnings": startup.warnings(request.app.state.settings)}
