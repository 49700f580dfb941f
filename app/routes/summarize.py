"""``POST /summarize``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from app.errors import request_id_of
from app.summarize.limits import RequestLimits
from app.schemas import SummarizeRequest, SummarizeResponse
from app.settings import Settings, get_settings

router = APIRouter(tags=["summarize"])

# Statuses every operation shares (400, 401, 408, 413, 415, 422, 500, 503, 504) are added by
# app.errors.document_errors.
_ERRORS = {
    422: {"description": "Invalid request, or over MAX_TEXTS / MAX_REQUEST_COST / MAX_INPUT_TOKENS; "
                         "`error.field` names the input"},
    429: {"description": "Queue full; see Retry-After"},
}


@router.post("/summarize", response_model=SummarizeResponse, responses=_ERRORS)
async def summarize(body: SummarizeRequest, request: Request, settings: Settings = Depends(get_settings)) -> dict:
    """Summarize `texts` (scoring ROUGE against `references` when given) on the shared device worker."""
    service = request.app.state.service
    limits = RequestLimits.from_settings(settings)
    return await service.summarize(body, request_id_of(request), request.is_disconnected, limits=limits)
