"""``GET /metrics``: Prometheus text, or memory stats and recent request logs as JSON."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.schemas import MetricsSnapshot
from app.settings import Settings, get_settings
from app.device.worker import Kind

router = APIRouter(tags=["metrics"])

_FORMATS = {
    200: {
        "description": "Prometheus text exposition by default; JSON with `?format=json`",
        "model": MetricsSnapshot,
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


@router.get("/metrics", response_model=None, responses=_FORMATS)
async def metrics(
    request: Request, format: Literal["prometheus", "json"] = "prometheus", settings: Settings = Depends(get_settings)
) -> Response | dict:
    """Prometheus exposition by default; ``?format=json`` for memory stats (weights included), requests in
    flight, queues, latency percentiles per route and the last requests."""
    engine = request.app.state.engine
    registry = request.app.state.metrics
    if format == "prometheus":
        return Response(registry.exposition(), media_type=CONTENT_TYPE_LATEST)
    waiting = {kind.value: engine.queue_length(kind) for kind in Kind}
    queue = {"waiting": waiting, "capacity": settings.queue_size, "state": engine.state.value}
    snapshot = registry.snapshot(engine.device)
    snapshot["memory"]["weights_bytes"] = engine.weights_bytes()
    return {**snapshot, "queue": queue}
