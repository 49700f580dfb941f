"""Request and response bodies of the evaluation-job routes (``/evaluate``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.jobs.job import Job
from app.jobs.paths import shown_model
from app.schemas import GenerationOptions, RougeAggregate, RougeOptions
from bart_opt.pipeline.baselines import BASELINES
from bart_opt.scoring.registry import intervals, metric_names

BaselineName = Literal[tuple(BASELINES)]  # type: ignore[valid-type]  # the names bart_opt.pipeline.baselines defines

SOURCES = ("hub", "file", "records")

# Column defaults per source: CNN/DailyMail's names for hub datasets and files, the names of
# the inline record shape ``{"id", "text", "reference"}`` for records.
DEFAULT_COLUMNS = {
    "hub": {"text": "article", "summary": "highlights", "id": "id"},
    "file": {"text": "article", "summary": "highlights", "id": "id"},
    "records": {"text": "text", "summary": "reference", "id": "id"},
}


class DatasetSpec(BaseModel):
    """Exactly one source: ``{"hub", "config", "split"}``, ``{"file"}`` or ``{"records"}``.

    Types are strict (a number is not a string). Which hub ids and files are allowed is the
    service's call (`app.jobs.sources`, `app.jobs.paths`), made before anything is read.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    hub: str | None = Field(
        None, min_length=1,
        description="Hub dataset id 'owner/name' on BART_OPT_HUB_DATASETS, e.g. abisee/cnn_dailymail.",
    )
    config: str | None = Field(None, description="Hub dataset configuration, e.g. 3.0.0.")
    split: str = Field("test", min_length=1, description="Hub dataset split (a name; `limit` takes the first N).")
    file: str | None = Field(None, description="JSONL / JSON / CSV / Parquet file, relative to BART_OPT_DATA_DIR.")
    records: list[dict[str, Any]] | None = Field(None, min_length=1, description="Inline records.")

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        given = [name for name in SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of hub, file or records (got {', '.join(given) or 'none'})")
        if self.source != "hub" and ({"config", "split"} & self.model_fields_set):
            raise ValueError("config and split apply to hub datasets only")
        return self

    @property
    def source(self) -> str:
        """Which of hub, file, records is given."""
        return next(name for name in SOURCES if getattr(self, name) is not None)

    def describe(self) -> dict:
        """The source as stored and shown with the job (inline records as their count)."""
        if self.source == "hub":
            return {"hub": self.hub, "config": self.config, "split": self.split}
        if self.source == "file":
            return {"file": self.file}
        return {"records": len(self.records)}


class PredictionsSpec(BaseModel):
    """Score another system's predictions instead of running the model: `column` holds them (the
    references are the summary column's, as for a model job), `name` names the system in reports."""

    model_config = ConfigDict(extra="forbid", strict=True)

    column: str = Field("prediction", min_length=1, description="The column of the predictions.")
    name: str = Field("external", min_length=1, max_length=200,
                      description="How the job names the system (PEGASUS, an LLM, ...).")


class EvaluateRequest(BaseModel):
    """``POST /evaluate`` body.

    Column names default per source (``article`` / ``highlights`` / ``id`` for hub and
    files; ``text`` / ``reference`` / ``id`` for inline records). ``summary_column: null``
    evaluates without references (no ROUGE). A missing id column numbers the records.
    ``predictions`` scores the predictions in a column instead of running the model (no generation
    options, no baselines; references needed). ``rouge`` picks the tokenizer and the language
    (the server's ``BART_OPT_ROUGE_TOKENIZER`` / ``BART_OPT_ROUGE_LANG`` by default).
    Types are strict: ``"5"`` or ``5.0`` is not a `limit`.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    dataset: DatasetSpec
    text_column: str | None = Field(None, min_length=1)
    summary_column: str | None = Field(None, min_length=1)
    id_column: str | None = Field(None, min_length=1)
    limit: int | None = Field(
        None, ge=1, description="Evaluate only the first N records (at most BART_OPT_MAX_JOB_RECORDS)."
    )
    generation: GenerationOptions | None = Field(None, description="Overrides of the generation defaults.")
    baselines: list[BaselineName] = Field(
        default_factory=list, max_length=8,
        description="Baselines scored on the same records beside the model when the job ends (e.g. lead-3: the "
        "article's first three sentences), reported under `baselines` with the same ROUGE intervals.",
    )
    predictions: PredictionsSpec | None = Field(
        None, description="Score another system's predictions (a column of the dataset) instead of running the "
        "model; the job's system is then `external`.")
    rouge: RougeOptions | None = Field(None, description="ROUGE tokenizer and language (default: the server's).")
    metrics: list[str] | None = Field(
        None, max_length=8, description="Metrics to score, of rouge, extractive, length, bertscore, consistency (ROUGE "
        "is always scored; default: the server's BART_OPT_METRICS). Each is in the job's metrics under its name, "
        "{score: {low, mid, high}}; an unknown or repeated name is a 422 naming `metrics`.")

    @model_validator(mode="after")
    def _predictions_alone(self) -> EvaluateRequest:
        if self.predictions is not None:
            given = [name for name in ("generation", "text_column") if getattr(self, name) is not None]
            given += ["baselines"] if self.baselines else []
            if given:
                raise ValueError(f"{', '.join(given)}: do not apply to a job of predictions (no model runs; the "
                                 "predictions are in predictions.column)")
            if "summary_column" in self.model_fields_set and self.summary_column is None:
                raise ValueError("summary_column: predictions need references to be scored against")
        return self

    def columns(self) -> dict:
        """The effective column names: given ones, else the source's defaults (the predictions' column
        as the text of a job of predictions)."""
        defaults = DEFAULT_COLUMNS[self.dataset.source]
        summary = self.summary_column if "summary_column" in self.model_fields_set else defaults["summary"]
        text, record_id = self.text_column or defaults["text"], self.id_column or defaults["id"]
        if self.predictions is not None:
            text = self.predictions.column
        return {"text": text, "summary": summary, "id": record_id}


class Progress(BaseModel):
    """How far a job is: examples done (``failed`` of them have an error instead of a summary),
    examples per second over the time it has run, and the seconds it should still need."""

    done: int
    failed: int
    total: int
    rate: float | None
    eta_s: float | None


class BatchMemory(BaseModel):
    """One finished batch: its size, device memory peak and device seconds."""

    batch: int
    run: int
    size: int
    peak_bytes: int
    seconds: float
    queue_s: float


class JobMemory(BaseModel):
    """Device memory peak over the job's batches (and per batch on the detail view)."""

    peak_bytes: int
    device: str | None = None
    peak_source: str | None = None
    batches: list[BatchMemory] | None = None


class JobTiming(BaseModel):
    """Seconds. ``runtime_s``: summed work time of the examples (as ``bart-opt evaluate``
    reports it); ``active_s``: wall time the job spent running; ``queue_s``: from
    submission to first start."""

    runtime_s: float
    seconds_per_sample: float | None
    active_s: float
    queue_s: float | None


class BaselineView(BaseModel):
    """A baseline scored beside the job's model on the same records; ``rouge`` once the job has succeeded."""

    name: str
    rouge: RougeAggregate | None
    n_scored: int | None
    scores: dict[str, dict[str, dict[str, float]]] = Field(
        default_factory=dict, description="Every metric, ROUGE's as its F-measures: {metric: {score: {low, mid, high}}}")

    @classmethod
    def of(cls, name: str, metrics: dict | None) -> BaselineView:
        """Baseline `name` as the API shows it, from its final metrics (None before the job's end)."""
        if metrics is None:
            return cls(name=name, rouge=None, n_scored=None)
        return cls(name=name, rouge=metrics["rouge"], n_scored=metrics["n_scored"], scores=intervals(metrics))


class JobView(BaseModel):
    """An evaluation job as the API shows it."""

    id: str
    status: str
    system: str = Field("bart", description="`bart` (the model ran it) or `external` (another system's "
                        "predictions, scored)")
    model: str
    fingerprint: str | None = Field(
        description="The content digest of the checkpoint the job runs on (`/ready`'s fingerprint when it was "
        "submitted); the job runs only on a model with the same one. None for a job from before fingerprints.")
    dataset: dict = Field(description="The source: {hub, config, split}, {records: N}, or {file, fingerprint}, the "
                          "file's fingerprint as read ({size, mtime, sha256}; a file changed while read refuses the job)")
    columns: dict
    limit: int | None
    generation: dict | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    progress: Progress
    rouge: RougeAggregate | None = Field(
        description="Per type: `mid` the mean over examples (the point estimate every surface shows), `low` and "
        "`high` the 95% bootstrap interval")
    metrics: list[str] = Field(default_factory=lambda: ["rouge"], description="The metrics the job scores, ROUGE "
                               "first (its `metric_settings` say how)")
    scores: dict[str, dict[str, dict[str, float]]] = Field(
        default_factory=dict, description="Every metric once the job has succeeded, ROUGE's as its F-measures: "
        "{metric: {score: {low, mid, high}}}, the same bootstrap interval for all")
    metric_settings: dict | None = Field(None, description="The metrics' settings and signatures")
    signature: str | None = Field(
        None, description="The sacrebleu-style signature of the ROUGE settings and the engine; two numbers with the "
        "same part before `system:` are comparable")
    rouge_settings: dict | None = Field(None, description="The ROUGE settings the job is scored with")
    engine: dict | None = Field(None, description="The engine the job runs on (dtype, mode, static, el_attention, "
                                "quantize, device, batch budgets); only a replica with the same one runs it")
    versions: dict | None = None
    processor: dict | None = None
    warnings: list[str] = Field(default_factory=list, description="What to know before reading the numbers (e.g. "
                                "the tokenizer dropped most of some texts' characters)")
    baselines: list[BaselineView] = Field(default_factory=list, description="The baselines the job asked for.")
    memory: JobMemory
    timing: JobTiming
    tokens: dict | None = None
    padding: dict | None = None
    error: str | None
    status_detail: str | None = Field(
        None, description="What a running job waits for or runs on (jobs on a Ray cluster), e.g. 'starting 2 "
        "replicas of 1 CPU each (each loads the model)'."
    )
    tracking: dict | None = Field(
        None, description="Where the finished job was logged in MLflow (BART_OPT_MLFLOW_URI): run_id, experiment_id "
        "and tracking_uri (its password hidden), or the error that kept it from being logged; None without tracking."
    )
    runs: int
    links: dict[str, str]

    @classmethod
    def of(cls, job: Job, *, batches: list[dict] | None = None) -> JobView:
        """The API view of `job`; `batches` (the store's per-batch rows) for the detail view."""
        metrics = job.metrics or {}
        rate = job.done / job.active_s if job.done and job.active_s > 0 else None
        final_memory = metrics.get("memory", {})
        runtime = metrics.get("runtime_s", job.work_s)
        record = job.record or {}
        return cls(
            id=job.id,
            status=job.status,
            system=job.system,
            model=shown_model(job.model),
            fingerprint=job.fingerprint,
            dataset=job.dataset,
            columns=job.columns,
            limit=job.record_limit,
            generation=job.generation,
            created_at=_iso(job.created_at),
            started_at=_iso(job.started_at),
            finished_at=_iso(job.finished_at),
            progress=Progress(done=job.done, failed=job.failed, total=job.total, rate=rate,
                              eta_s=job.pending / rate if rate and job.active else None),
            rouge=metrics.get("rouge"),
            metrics=list(metric_names(metrics) if metrics else (record.get("metrics") or {}).get("names", ["rouge"])),
            scores=intervals(metrics),
            metric_settings=metrics.get("metric_settings") or record.get("metrics"),
            signature=metrics.get("signature") or record.get("signature"),
            rouge_settings=job.rouge_settings,
            engine=job.engine,
            versions=record.get("versions"),
            processor=record.get("processor"),
            warnings=metrics.get("warnings", []),
            baselines=[BaselineView.of(name, metrics.get("baselines", {}).get(name)) for name in job.baselines],
            memory=JobMemory(peak_bytes=job.peak_bytes, device=final_memory.get("device"),
                             peak_source=final_memory.get("peak_source"), batches=batches),
            timing=JobTiming(
                runtime_s=runtime,
                seconds_per_sample=metrics.get("seconds_per_sample", runtime / job.done if job.done else None),
                active_s=job.active_s,
                queue_s=job.started_at - job.created_at if job.started_at is not None else None,
            ),
            tokens=metrics.get("tokens"),
            padding=metrics.get("padding"),
            error=job.error,
            status_detail=job.status_detail,
            tracking=metrics.get("tracking"),
            runs=job.runs,
            links={"self": f"/evaluate/{job.id}", "predictions": f"/evaluate/{job.id}/predictions",
                   "errors": f"/evaluate/{job.id}/predictions?errors=only"},
        )


class PageLinks(BaseModel):
    """The pages around one of ``GET /evaluate`` (None where there is nothing more that way)."""

    next: str | None = Field(description="Older jobs: the next page.")
    prev: str | None = Field(description="Newer jobs: the page before.")


class JobList(BaseModel):
    """``GET /evaluate``: a page of jobs, newest first (without per-batch memory), and its neighbours."""

    jobs: list[JobView]
    links: PageLinks


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="milliseconds")
