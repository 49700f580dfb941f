"""``GET /health`` (process alive) and ``GET /ready`` (model loaded); both open without an API key."""

from __future__ import annotations

from fastapi import APIRouter, Request

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict:
    """200 while the process serves HTTP."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"description": "Model loading, failed to load, or shutting down"}})
async def ready(request: Request) -> dict:
    """200 once the model is loaded and the worker takes requests; 503 otherwise."""
    service = request.app.state.service
    service.check_ready()
    return {"status": "ready", "model": service.summarizer.name, "device": str(service.summarizer.device)}
