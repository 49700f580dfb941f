"""Evaluation jobs: ``POST|GET /evaluate``, ``GET|DELETE /evaluate/{id}``, ``GET /evaluate/{id}/predictions``."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from app.errors import ApiError
from app.jobs.listing import MAX_CURSOR_CHARS
from app.jobs.bodies import EvaluateRequest, JobList, JobView
from app.jobs.service import JobService

router = APIRouter(tags=["evaluate"])

_ERRORS = {
    401: {"description": "API key set and bearer token missing or wrong"},
    404: {"description": "No such job"},
}
_SUBMIT_ERRORS = {
    200: {"description": "Idempotency-Key seen before: the existing job", "model": JobView},
    401: _ERRORS[401],
    409: {"description": "Idempotency-Key already used for a different request"},
    413: {"description": "Body larger than MAX_REQUEST_BYTES"},
    422: {"description": "Invalid request: generation option, refused, missing or unreadable file, hub id not "
                         "allowed, missing column, bad records, limit above BART_OPT_MAX_JOB_RECORDS"},
    429: {"description": "As many datasets are loading as BART_OPT_DATASET_LOADERS allows; retry"},
    502: {"description": "Hub dataset could not be loaded"},
    503: {"description": "Model not loaded yet, failed to load, shutting down, or the jobs database cannot be written"},
}


def _jobs(request: Request) -> JobService:
    return request.app.state.jobs


@router.post("/evaluate", status_code=202, response_model=JobView, responses=_SUBMIT_ERRORS)
async def submit(
    body: EvaluateRequest,
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> dict:
    """Queue an evaluation job (202 + Location) once its records are stored. A known ``Idempotency-Key``
    answers 200 with that job. The dataset loads on the jobs' own threads, never on the request threads."""
    view, created = await _jobs(request).submit(body, idempotency_key)
    response.headers["Location"] = view["links"]["self"]
    if not created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    return view


_CURSOR = Query(max_length=MAX_CURSOR_CHARS, description="A cursor from a page's links; not made by hand.")


@router.get("/evaluate", response_model=JobList, responses={401: _ERRORS[401], 422: {"description": "Bad cursor"}})
async def list_jobs(
    request: Request,
    status: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[str | None, _CURSOR] = None,
    after: Annotated[str | None, _CURSOR] = None,
    offset: Annotated[str | None, Query(include_in_schema=False)] = None,
) -> dict:
    """A page of jobs, newest first; ``?status=running`` filters. ``links.next`` is the page of
    older jobs (``?before=CURSOR``), ``links.prev`` of newer ones (``?after=CURSOR``): following
    them reaches every job."""
    if offset is not None:
        raise ApiError(422, "invalid_request", "offset: not supported; follow links.next of a page "
                       "(?before=CURSOR) to reach older jobs", field="offset")
    return await run_in_threadpool(_jobs(request).list, status, limit, before, after)


@router.get("/evaluate/{job_id}", response_model=JobView, responses=_ERRORS)
async def get_job(job_id: str, request: Request) -> dict:
    """Status, progress and, once finished, ROUGE, memory, timing and settings of one job."""
    return await run_in_threadpool(_jobs(request).get, job_id)


@router.get(
    "/evaluate/{job_id}/predictions",
    response_class=StreamingResponse,
    responses={**_ERRORS, 200: {"content": {"application/x-ndjson": {}}, "description": "One JSON object per line"}},
)
async def predictions(
    job_id: str,
    request: Request,
    errors: Annotated[Literal["include", "only", "exclude"], Query(
        description="only: the failed examples with their reasons; exclude: the others")] = "include",
) -> StreamingResponse:
    """The predictions stored so far, one JSON line per example in record order."""
    lines = await run_in_threadpool(_jobs(request).prediction_lines, job_id, errors)
    return StreamingResponse(lines, media_type="application/x-ndjson")


@router.delete(
    "/evaluate/{job_id}", response_model=JobView, responses={**_ERRORS, 409: {"description": "Job already ended"}}
)
async def cancel(job_id: str, request: Request) -> dict:
    """Cancel a queued or running job; predictions already stored are kept."""
    return await run_in_threadpool(_jobs(request).cancel, job_id)
