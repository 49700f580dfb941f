"""``GET /health`` (liveness) and ``GET /ready`` (readiness); both open without an API key.

``/health`` is 503 only when the process cannot serve again without a restart: the device
worker died. A model that failed to load keeps ``/health`` at 200 (a restart with the same
settings fails the same way; ``/ready`` says why it is not ready).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    model: str
    device: str


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
    return {"status": "ready", "model": service.model_name, "device": service.device}
