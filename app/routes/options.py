"""``GET /options``: the generation options a request or a job may set (what the dashboard's forms show)."""

from __future__ import annotations

from fastapi import APIRouter

from app.schemas import Options

router = APIRouter(tags=["options"])

_OPTIONS = Options.of_spec().model_dump()  # fixed by bart_opt.engine.spec.REQUEST_OPTIONS


@router.get("/options", response_model=Options, responses={401: {"description": "API key set and bearer token missing or wrong"}})
async def options() -> dict:
    """Each generation option's name, label, description, type and bounds, in order."""
    return _OPTIONS
