"""``GET /compare?jobs=ID1,ID2[,...]``: finished evaluation jobs side by side, with paired significance tests."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from app.compare import CompareService

router = APIRouter(tags=["compare"])

_ERRORS = {
    401: {"description": "API key set and bearer token missing or wrong"},
    404: {"description": "No such job"},
    409: {"description": "A job has not succeeded (queued, running, failed or cancelled)"},
    422: {"description": "Fewer than 2 or more than 8 jobs, a bad option, or jobs on different datasets "
                         "(code `datasets_differ`)"},
}


@router.get("/compare", responses=_ERRORS)
async def compare(
    request: Request,
    jobs: Annotated[str, Query(description="Job ids separated by commas; the first is the baseline.")],
    metric: Annotated[str, Query(description="ROUGE type that ranks the per-example wins and losses.")] = "rougeLsum",
    resamples: Annotated[int, Query(description="Bootstrap resamples and randomization trials (from 1 to "
                                                "BART_OPT_MAX_COMPARE_RESAMPLES, 10000 by default).")] = 1000,
    seed: Annotated[int, Query(ge=0, le=2**32 - 1)] = 0,
    top: Annotated[int, Query(description="Wins and losses to return (0-100).")] = 5,
) -> dict:
    """ROUGE of each job over the examples scored in all, and each job against the first: per-type
    delta, its 95% bootstrap interval, paired-bootstrap and approximate-randomization p-values,
    and the examples it won and lost most, with their texts (`bart_opt.compare` has the method)."""
    settings = request.app.state.settings
    service = CompareService(request.app.state.jobs, settings.max_compare_examples, settings.max_compare_resamples)
    ids = [job_id.strip() for job_id in jobs.split(",") if job_id.strip()]
    return await run_in_threadpool(service.compare, ids, metric=metric, resamples=resamples, seed=seed, top=top)
