"""``GET /evaluate/{id}/examples/{example_id}``: one example of a job, with its article."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

router = APIRouter(tags=["evaluate"])

_ERRORS = {
    401: {"description": "API key set and bearer token missing or wrong"},
    404: {"description": "No such job, or no such example in it"},
}


@router.get("/evaluate/{job_id}/examples/{example_id:path}", responses=_ERRORS)
async def example(job_id: str, example_id: str, request: Request) -> dict:
    """``{"id", "text", "reference", "prediction"}``: the record as submitted and its prediction row
    (``null`` until it is done); the predictions JSONL has every row but not the articles."""
    return await run_in_threadpool(request.app.state.jobs.example, job_id, example_id)
