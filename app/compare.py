"""`CompareService`: ``GET /compare`` without HTTP. Finished jobs in, `bart_opt.compare` out.

Each job becomes a `bart_opt.compare.Run` named by its id, with its model, dataset, generation
settings and its own ROUGE intervals as ``info``; the first job is the baseline. Only succeeded
jobs are compared (a running or cancelled job has a partial set of examples). The comparison is
CPU work proportional to examples x resamples, and it holds the jobs' rows in memory; its caps
(`MAX_JOBS`, the `max_compare_resamples` and `max_compare_examples` settings) bound both.

Its methods block (SQLite reads, resampling); the route calls them off the event loop.
"""

from __future__ import annotations

from app.domain_errors import Conflict, Refused
from app.jobs.bodies import JobView
from app.jobs.service import JobService
from bart_opt.compare import DEFAULT_METRIC, DEFAULT_RESAMPLES, Run, RunMismatch, compare_runs
from bart_opt.errors import InvalidRequest

MAX_JOBS = 8
_INFO_KEYS = ("system", "model", "dataset", "generation", "rouge", "rouge_settings", "signature", "warnings", "created_at")


class CompareService:
    """Compares evaluation jobs of `jobs` (see the module docstring)."""

    def __init__(self, jobs: JobService, max_examples: int, max_resamples: int) -> None:
        self.jobs = jobs
        self.max_examples = max_examples  # per job: the `max_compare_examples` setting
        self.max_resamples = max_resamples  # the `max_compare_resamples` setting

    def compare(
        self,
        job_ids: list[str],
        *,
        metric: str = DEFAULT_METRIC,
        resamples: int = DEFAULT_RESAMPLES,
        seed: int = 0,
        top: int = 5,
    ) -> dict:
        """The `bart_opt.compare.compare_runs` result for these jobs, baseline first.

        Raises InvalidRequest (naming ``jobs``, ``metric``, ``resamples`` or ``top``) for fewer than two
        or more than `MAX_JOBS` ids, a repeated id or a bad option; `NotFound` for an unknown job,
        `Conflict` for a job that has not succeeded, `Refused` ``datasets_differ`` when the jobs are
        not on the same examples (`app.domain_errors`).
        """
        self._check_ids(job_ids)
        runs = [self._run(job_id) for job_id in job_ids]
        try:
            return compare_runs(runs, metric=metric, resamples=resamples, seed=seed, top=top,
                                max_resamples=self.max_resamples)
        except RunMismatch as error:
            raise Refused("datasets_differ", str(error), field="jobs") from error

    def _check_ids(self, job_ids: list[str]) -> None:
        if not 2 <= len(job_ids) <= MAX_JOBS:
            raise InvalidRequest("jobs", f"give 2 to {MAX_JOBS} job ids separated by commas (got {len(job_ids)})")
        repeated = sorted({job_id for job_id in job_ids if job_ids.count(job_id) > 1})
        if repeated:
            raise InvalidRequest("jobs", f"{repeated[0]!r} is given twice")

    def _run(self, job_id: str) -> Run:
        job = self.jobs.job(job_id)
        if job.status != "succeeded":
            raise Conflict("job_not_finished", f"job {job_id} is {job.status}; only succeeded jobs can be compared",
                           field="jobs")
        limit = self.max_examples
        if job.total > limit:
            raise InvalidRequest("jobs", (
                f"job {job_id} has {job.total:,} examples; the service compares jobs of up to "
                f"{limit:,} (BART_OPT_MAX_COMPARE_EXAMPLES): download their predictions and run bart-opt compare"))
        view = JobView.of(job).model_dump()
        info = {key: view[key] for key in _INFO_KEYS}
        return Run(name=job_id, rows=self.jobs.prediction_rows(job_id), info=info)
