"""``POST /summarize``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from app.errors import request_id_of
from app.schemas import SummarizeRequest, SummarizeResponse
from app.settings import Settings, get_settings

router = APIRouter(tags=["summarize"])

_ERRORS = {
    401: {"description": "API key set and bearer token missing or wrong"},
    413: {"description": "Body larger than MAX_REQUEST_BYTES"},
    422: {"description": "Invalid request; `error.field` names the input"},
    429: {"description": "Queue full; see Retry-After"},
    503: {"description": "Model not loaded yet, failed to load, or shutting down"},
}


@router.post("/summarize", response_model=SummarizeResponse, responses=_ERRORS)
async def summarize(body: SummarizeRequest, request: Request, settings: Settings = Depends(get_settings)) -> dict:
    """Summarize `texts` (scoring ROUGE against `references` when given) on the shared device worker."""
    service = request.app.state.service
    return await service.summarize(body, request_id_of(request), request.is_disconnected, max_texts=settings.max_texts)
