"""The job runner against a fake engine, through `app.jobs.ports.JobEngine` only: no model, no worker, no HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

from app.jobs.ports import JobEngine
from app.jobs.runner import JobRunner, RunnerConfig
from app.jobs.store import JobStore, NewJob
from bart_opt.pipeline.data import Record
from bart_opt.evaluate.core import Pending, RunControl, Source
from bart_opt.evaluate.rows import FAILED, MODEL, RowBatch, prediction_row, refused_row
from bart_opt.pipeline.rouge import RougeScorer, RougeSettings
from bart_opt.engine.spec import GenerationSpec

SPEC = GenerationSpec(num_beams=1, max_length=8, min_length=1, length_penalty=1.0, no_repeat_ngram_size=0,
                      early_stopping=False, forced_bos_token_id=None, forced_eos_token_id=None,
                      decoder_start_token_id=2, eos_token_id=(2,), pad_token_id=1)
ENGINE = {"dtype": "float32", "mode": "default", "static": False, "el_attention": False, "quantize": None,
          "device": "cpu"}
FAILURE = "the model failed on this example (internal error; the server log has the details)"


class FakeExecutor:
    """The evaluation core's executor over `summarize(texts) -> summaries`: each window one batch, and when
    the batch raises, each record alone (a record that still raises gets a failed row, as a model's does)."""

    in_process = True
    fingerprint = "sha256:fake"
    name = "fake-model"
    device = torch.device("cpu")
    count_cpu_tensors = False

    def __init__(self, summarize: Callable[[list[str]], list[str]], calls: list[int]) -> None:
        self.summarize = summarize
        self.calls = calls
        self.model = self  # what the metrics describe (`bart_opt.evaluate.metrics.ModelInfo`)

    @property
    def scorer(self) -> RougeScorer:
        return RougeSettings().scorer()

    def identity(self) -> dict:
        return {"model": self.name}

    def engine_record(self) -> dict:
        return dict(ENGINE)

    def processor(self) -> dict:
        return {"device": "cpu"}

    def generation_spec(self, overrides=None) -> GenerationSpec:
        return SPEC

    def run(self, source: Source, spec: GenerationSpec, control: RunControl,
            rouge: RougeSettings | None = None) -> Iterator[RowBatch]:
        scorer = (rouge or RougeSettings()).scorer()
        for window in source.windows():
            if control.stopping:
                return
            batch = self._batch(window, scorer)
            if batch is not None:
                yield batch
                continue
            for pending in window:  # the batch failed: each record alone, as the model's failures are split
                alone = self._batch([pending], scorer)
                yield alone or RowBatch([refused_row(pending.record, FAILURE)], [pending.position], FAILED)

    def _batch(self, group: Sequence[Pending], scorer: RougeScorer) -> RowBatch | None:
        """The rows of one call on `group`, None when it raises."""
        self.calls.append(len(group))
        try:
            summaries = self.summarize([p.record.text for p in group])
        except Exception:  # noqa: BLE001 - a failing call, as a model's
            return None
        rows = [prediction_row(p.record, summary, {
            "rouge": scorer.score(summary, p.record.reference), "error": None, "truncated": False,
            "input_tokens": len(p.record.text.split()), "output_tokens": len(summary.split()),
            "padding_computed": 0, "padding_avoided": 0, "timing": {"generate": 0.01}}, batch_peak_bytes=0)
            for p, summary in zip(group, summaries)]
        return RowBatch(rows, [p.position for p in group], MODEL, seconds=0.01)


class FakeEngine:
    """A `JobEngine` with no model: ready at once, its executor a `FakeExecutor`."""

    name = "fake-model"
    fingerprint = "sha256:fake"
    state = "ready"

    def __init__(self, summarize: Callable[[list[str]], list[str]]) -> None:
        self.calls: list[int] = []
        self._executor = FakeExecutor(summarize, self.calls)

    def wait_ready(self, timeout: float | None = None) -> bool:
        return True

    def check_ready(self) -> None:
        return None

    def request_spec(self, options) -> GenerationSpec:
        return SPEC

    def executor(self) -> FakeExecutor:
        return self._executor


def first_sentence(texts: list[str]) -> list[str]:
    return [text.split(".")[0] for text in texts]


def records(n: int) -> list[Record]:
    return [Record(f"r{i}", f"The cat number {i} sat on the mat. It was a good day for cat {i}.",
                   f"cat number {i} sat on the mat") for i in range(n)]


@pytest.fixture
def run_job(tmp_path):
    """`run_job(engine, records)`: the job of `records` stored, run by a JobRunner on `engine` until it ends."""
    store = JobStore(tmp_path / "jobs.db")
    store.initialize()
    runners = []

    def _run(engine: JobEngine, given: list[Record]):
        ready = threading.Event()
        ready.set()
        runner = JobRunner(store, engine, engine.executor, RunnerConfig(), "test:1:fake", ready)
        runners.append(runner)
        executor = engine.executor()
        job = NewJob(id="job-1", request_hash="h", model=engine.name, dataset={"records": len(given)},
                     columns={"text": "text", "summary": "summary", "id": "id"}, limit=None,
                     generation=engine.request_spec(None).to_dict(), fingerprint=executor.fingerprint,
                     engine=executor.engine_record(), rouge_settings=RougeSettings().to_dict())
        store.create(job, given)
        runner.start()
        runner.wake()
        deadline = time.monotonic() + 60
        while (found := store.get("job-1")).status not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, f"the job never ended: {found.status}"
            time.sleep(0.02)
        return found, [json.loads(line) for line in store.prediction_lines("job-1")]

    yield _run
    for runner in runners:
        runner.stop(timeout=10)
    store.close()


def test_a_job_on_a_fake_engine_finishes_with_its_rows_and_metrics(run_job):
    engine = FakeEngine(first_sentence)
    job, rows = run_job(engine, records(4))
    assert job.status == "succeeded" and (job.total, job.done, job.failed) == (4, 4, 0)
    assert [row["id"] for row in rows] == ["r0", "r1", "r2", "r3"]
    assert [row["prediction"] for row in rows] == [f"The cat number {i} sat on the mat" for i in range(4)]
    assert all(row["error"] is None for row in rows)
    assert engine.calls == [4]  # one window, one batch
    assert job.metrics["model"] == "fake-model" and job.metrics["n_obs"] == 4
    scorer = RougeSettings().scorer()
    expected = scorer.score("The cat number 0 sat on the mat", "cat number 0 sat on the mat")["rouge1"]["fmeasure"]
    assert rows[0]["rouge"]["rouge1"]["fmeasure"] == pytest.approx(expected)
    assert job.metrics["rouge"] == scorer.aggregate([row["rouge"] for row in rows])  # from the stored rows


def test_a_fake_engine_that_raises_fails_the_records_alone_and_the_job_records_why(run_job):
    def poisoned(texts: list[str]) -> list[str]:
        if any("number 1 " in text for text in texts):
            raise RuntimeError("the fake device is on fire")
        return first_sentence(texts)

    engine = FakeEngine(poisoned)
    job, rows = run_job(engine, records(3))
    assert job.status == "succeeded" and (job.done, job.failed) == (3, 1)
    by_id = {row["id"]: row for row in rows}
    assert by_id["r1"]["prediction"] == "" and by_id["r1"]["error"] == FAILURE and by_id["r1"]["rouge"] is None
    assert by_id["r0"]["error"] is None and by_id["r2"]["prediction"] == "The cat number 2 sat on the mat"
    assert engine.calls == [3, 1, 1, 1]  # the batch, then each record alone
    assert (job.metrics["n_obs"], job.metrics["n_errors"], job.metrics["n_scored"]) == (3, 1, 2)  # r1 not scored


def test_a_fake_engine_that_always_raises_fails_the_job_with_the_first_reasons(run_job):
    def broken(texts: list[str]) -> list[str]:
        raise RuntimeError("the fake device is on fire")

    job, rows = run_job(FakeEngine(broken), records(3))
    assert job.status == "failed" and (job.done, job.failed) == (3, 3)
    assert job.error == f"all 3 examples failed; the first: 'r0': {FAILURE}; 'r1': {FAILURE}; 'r2': {FAILURE}"
    assert all(row["error"] == FAILURE and row["prediction"] == "" for row in rows)
    assert "on fire" not in job.error


def test_the_jobs_package_loads_no_concrete_engine_worker_metrics_settings_or_http():
    concrete = ("app.device.engine", "app.device.worker", "app.metrics", "app.settings", "app.errors", "fastapi",
                "starlette")
    code = ("import sys, app.jobs, app.jobs.config, app.jobs.runner, app.jobs.service; "
            f"print([name for name in {concrete!r} if name in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_service_engine_and_the_fake_have_everything_the_interface_names():
    from app.device.engine import Engine

    named = {name for name in vars(JobEngine) if not name.startswith("_")}
    assert named == {"name", "fingerprint", "state", "wait_ready", "check_ready", "request_spec", "executor"}
    assert named <= set(dir(Engine)) and named <= set(dir(FakeEngine))
