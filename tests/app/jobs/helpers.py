"""Helpers and fixtures of the evaluation-job tests (shared by tests/app/jobs and the /evaluate route tests)."""

from __future__ import annotations

import functools
import json
import random
import sqlite3
import threading
import time

import pytest
from fastapi import FastAPI

from app.main import create_app
from app.device.engine import load_summarizer
from app.settings import Settings
from bart_opt.demo import random_article, random_sentence
from bart_opt.evaluate import compute_metrics, iter_predictions


def cnn_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` CNN/DailyMail-shaped rows: id, article, highlights (sentences joined by newlines)."""
    rng = random.Random(seed)
    return [
        {"id": f"doc-{i}", "article": random_article(rng, rng.randint(1, 6)),
         "highlights": "\n".join(random_sentence(rng) for _ in range(2))}
        for i in range(n)
    ]


@pytest.fixture
def data_dir(tmp_path):
    """An empty BART_OPT_DATA_DIR."""
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def write_jsonl(data_dir):
    """`write_jsonl(name, rows)` writes rows into the data dir and returns the path."""

    def _write(name: str, rows: list[dict]):
        path = data_dir / name
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        return path

    return _write


@pytest.fixture
def make_jobs_app(demo_checkpoint, tmp_path, data_dir):
    """`make_jobs_app(load=..., **settings)`: an app with jobs, its own DB and the data dir."""

    def _make(*, load=load_summarizer, **overrides) -> FastAPI:
        settings = {"model": demo_checkpoint, "db": str(tmp_path / "jobs.db"), "data_dir": str(data_dir), **overrides}
        return create_app(Settings(**settings), load=load)

    return _make


class Stepper:
    """A Summarizer `before_model_call` hook that lets model calls through one permit at a time.

    `sizes` lists the number of inputs of each call that reached the hook, in arrival order;
    `allow(n)` lets `n` more calls run; `wait_arrived(n)` blocks until `n` calls have arrived.
    """

    def __init__(self) -> None:
        self._permits = threading.Semaphore(0)
        self._arrived = threading.Condition()
        self.sizes: list[int] = []

    def __call__(self, positions: list[int]) -> None:
        with self._arrived:
            self.sizes.append(len(positions))
            self._arrived.notify_all()
        if not self._permits.acquire(timeout=60):
            raise TimeoutError("no permit for this model call")

    def allow(self, n: int = 1) -> None:
        for _ in range(n):
            self._permits.release()

    def revoke(self) -> None:
        """Take back the permits no call has used, so the next call waits for `allow` again."""
        while self._permits.acquire(blocking=False):
            pass

    def wait_arrived(self, n: int, timeout: float = 60) -> None:
        with self._arrived:
            arrived = self._arrived.wait_for(lambda: len(self.sizes) >= n, timeout)
            assert arrived, f"only {len(self.sizes)} calls arrived"

    def loader(self):
        """A `create_app(load=...)` loader whose Summarizer calls this hook before each model call."""
        return functools.partial(load_summarizer, before_model_call=self)


def wait_for_job(client, job_id: str, until=("succeeded", "failed", "cancelled"), timeout: float = 120) -> dict:
    """Poll GET /evaluate/{id} until its status is in `until` (or `until(view)` holds); return the view."""
    check = until if callable(until) else (lambda view: view["status"] in until)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = client.get(f"/evaluate/{job_id}")
        assert response.status_code == 200, response.text
        view = response.json()
        if check(view):
            return view
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never got there: {view['status']}, {view['progress']}")


def poll_server(server, job_id: str, until, timeout: float = 240) -> dict:
    """Poll a `ServerProcess`'s GET /evaluate/{id} until `until(view)` holds; the view (its log on failure)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = httpx.get(f"{server.url}/evaluate/{job_id}", timeout=30).json()
        if until(view):
            return view
        time.sleep(0.02)
    raise AssertionError(f"job never got there: {view['status']} {view['progress']}\n{server.log()}")


def at_once(*calls) -> list:
    """Run each of `calls` on a thread of its own, all released together; their results, or the errors they raised."""
    results: list = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(k: int) -> None:
        start.wait()
        try:
            results[k] = calls[k]()
        except Exception as error:  # noqa: BLE001 - returned to the caller, which asserts on it
            results[k] = error

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def evaluate_directly(summarizer, records, generation) -> tuple[dict, dict]:
    """What `bart-opt evaluate` computes for these records: rows by id, and the metrics."""
    spec = summarizer.generation_spec(generation)
    rows = {row["id"]: row for batch in iter_predictions(summarizer, records, spec) for row in batch.rows}
    return rows, compute_metrics(rows, records, model=summarizer, generation=spec.to_dict())


def prediction_rows(client, job_id: str) -> list[dict]:
    """GET /evaluate/{id}/predictions, parsed line by line: split at "\n" only, as NDJSON is (`str.splitlines`
    also splits at U+2028, U+0085 and others, which JSON leaves unescaped inside strings); every line ends with one."""
    response = client.get(f"/evaluate/{job_id}/predictions")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = response.text.split("\n")
    assert lines[-1] == "", "the body ends with a newline"
    return [json.loads(line) for line in lines[:-1]]


class FaultyCursor(sqlite3.Cursor):
    """A cursor of a `FaultyConnection`: applies the connection's fault before each statement."""

    def execute(self, *args):
        self.connection.apply_fault()
        return super().execute(*args)

    def executemany(self, *args):
        self.connection.apply_fault()
        return super().executemany(*args)


class FaultyConnection(sqlite3.Connection):
    """A SQLite connection that turns itself read-only, full or unreachable while `FaultyConnection.fault` says so.

    ``"read-only"`` and ``"full"`` are SQLite's own faults: ``PRAGMA query_only`` (writes fail
    with SQLITE_READONLY, as on a read-only volume), ``max_page_count`` capped at the current
    size (a write that needs a new page fails with SQLITE_FULL, as on a full disk).
    ``"gone"`` makes every statement fail with SQLITE_IOERR, as on a network volume that went
    away. The switch is class-wide and takes effect on every connection's next statement.
    """

    fault: str | None = None

    def cursor(self, factory=FaultyCursor):
        return super().cursor(factory)

    def apply_fault(self) -> None:
        wanted = type(self).fault
        if wanted == "gone":
            error = sqlite3.OperationalError("disk I/O error")
            error.sqlite_errorcode, error.sqlite_errorname = 10, "SQLITE_IOERR"
            raise error
        if getattr(self, "_applied", None) == wanted or self.in_transaction:
            return
        super().execute(f"PRAGMA query_only = {int(wanted == 'read-only')}")
        if wanted == "full":
            pages = super().execute("PRAGMA page_count").fetchone()[0]
            super().execute(f"PRAGMA max_page_count = {pages}")
        else:
            super().execute("PRAGMA max_page_count = 4294967294")
        self._applied = wanted


@pytest.fixture
def faulty_store(monkeypatch):
    """Apps built in this test keep their jobs in stores whose connections are `FaultyConnection`s."""
    from app.jobs.store import JobStore

    monkeypatch.setattr("app.jobs.service.JobStore", functools.partial(JobStore, connection_factory=FaultyConnection))
    FaultyConnection.fault = None
    yield FaultyConnection
    FaultyConnection.fault = None


class Backend:
    """A jobs database of one kind for one test: `url` (``BART_OPT_DB``), `name`, and the faults
    `go_away` / `come_back` (PostgreSQL: the server stopped and started; SQLite: every statement
    fails with an I/O error, as on a network volume that went away; needs `faulty_store`)."""

    def __init__(self, name: str, url: str, cluster=None):
        self.name, self.url, self.cluster = name, url, cluster

    def go_away(self) -> None:
        if self.cluster is not None:
            self.cluster.stop("immediate")  # as a crash: only what was committed survives
        else:
            FaultyConnection.fault = "gone"

    def come_back(self) -> None:
        if self.cluster is not None:
            self.cluster.start()
        else:
            FaultyConnection.fault = None


BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path) -> Backend:
    """Each test that takes it runs twice: on a SQLite file, and on a fresh database of the session's
    PostgreSQL cluster (skipped, with the reason, where none can be started)."""
    if request.param == "sqlite":
        return Backend("sqlite", str(tmp_path / "jobs.db"))
    cluster = request.getfixturevalue("postgres_cluster")
    return Backend("postgresql", cluster.create_database(), cluster)


def sql(store, statement: str, **params) -> list[tuple]:
    """Rows of `statement` on the store's database, read past the store (what the tables hold)."""
    from sqlalchemy import text

    with store.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(statement), params)]
