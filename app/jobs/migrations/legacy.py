"""The jobs database's schema before Alembic: versions 1 to 4, frozen, for SQLite files made by then.

Until Alembic took over (`app.jobs.migrations`), the schema was versioned with ``PRAGMA
user_version`` and these steps ran on open. They are history now and never change: the
baseline revision (``versions/0004_baseline.py``) runs them on a SQLite file of version 1 to 3
(version 0, the unversioned first schema, reads as 1), so such a file reaches version 4
in place and then goes on with Alembic's revisions. A new database never runs them.

What each version added:

- 2: ``jobs.status`` ``loading`` (records still streaming in), ``owner`` and ``lease_until``
  (the lease), ``peak_bytes``, a nullable ``done_at_start``; ``records.error`` and ids unique
  per job; ``predictions.failed`` with a partial index; ``job_counts`` kept by triggers.
- 3: ``jobs.status_detail``, what a running job waits for or runs on.
- 4: ``jobs.baselines``, the baselines (JSON list of names) scored beside the model.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy.engine import Connection

_V1 = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    idempotency_key TEXT UNIQUE,
    request_hash TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    model TEXT NOT NULL,
    dataset TEXT NOT NULL,
    columns TEXT NOT NULL,
    record_limit INTEGER,
    generation TEXT NOT NULL,
    total INTEGER NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    work_s REAL NOT NULL DEFAULT 0,
    active_s REAL NOT NULL DEFAULT 0,
    runs INTEGER NOT NULL DEFAULT 0,
    stalled_runs INTEGER NOT NULL DEFAULT 0,
    done_at_start INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    error TEXT,
    metrics TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, created_at);
CREATE TABLE IF NOT EXISTS records (
    job_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    example_id TEXT NOT NULL,
    text TEXT NOT NULL,
    reference TEXT,
    PRIMARY KEY (job_id, position)
);
CREATE TABLE IF NOT EXISTS predictions (
    job_id TEXT NOT NULL,
    example_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    batch INTEGER NOT NULL,
    run INTEGER NOT NULL,
    row TEXT NOT NULL,
    PRIMARY KEY (job_id, example_id)
);
CREATE INDEX IF NOT EXISTS predictions_in_order ON predictions (job_id, position);
CREATE TABLE IF NOT EXISTS batches (
    job_id TEXT NOT NULL,
    batch INTEGER NOT NULL,
    run INTEGER NOT NULL,
    size INTEGER NOT NULL,
    peak_bytes INTEGER NOT NULL,
    seconds REAL NOT NULL,
    queue_s REAL NOT NULL,
    finished_at REAL NOT NULL,
    PRIMARY KEY (job_id, batch)
);
"""

_V1_JOB_COLUMNS = (
    "id, idempotency_key, request_hash, status, model, dataset, columns, record_limit, generation, total, done, "
    "failed, work_s, active_s, runs, stalled_runs, done_at_start, created_at, started_at, finished_at, error, metrics"
)

_V2 = f"""
CREATE TABLE jobs_v2 (
    id TEXT PRIMARY KEY,
    idempotency_key TEXT UNIQUE,
    request_hash TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('loading', 'queued', 'running', 'succeeded', 'failed', 'cancelled')),
    model TEXT NOT NULL,
    dataset TEXT NOT NULL,
    columns TEXT NOT NULL,
    record_limit INTEGER,
    generation TEXT NOT NULL,
    total INTEGER NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    work_s REAL NOT NULL DEFAULT 0,
    active_s REAL NOT NULL DEFAULT 0,
    runs INTEGER NOT NULL DEFAULT 0,
    stalled_runs INTEGER NOT NULL DEFAULT 0,
    done_at_start INTEGER,
    peak_bytes INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until REAL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    error TEXT,
    metrics TEXT
);
INSERT INTO jobs_v2 ({_V1_JOB_COLUMNS}, peak_bytes)
    SELECT {_V1_JOB_COLUMNS},
           (SELECT COALESCE(MAX(peak_bytes), 0) FROM batches WHERE batches.job_id = jobs.id)
    FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v2 RENAME TO jobs;
CREATE INDEX jobs_by_status ON jobs (status, created_at);

ALTER TABLE records ADD COLUMN error TEXT;
CREATE UNIQUE INDEX records_by_id ON records (job_id, example_id);

ALTER TABLE predictions ADD COLUMN failed INTEGER NOT NULL DEFAULT 0;
UPDATE predictions SET failed = 1 WHERE json_extract(row, '$.error') IS NOT NULL;
CREATE INDEX predictions_failed ON predictions (job_id, position) WHERE failed = 1;

CREATE TABLE job_counts (status TEXT PRIMARY KEY, n INTEGER NOT NULL);
INSERT INTO job_counts (status, n) SELECT status, COUNT(*) FROM jobs GROUP BY status;
CREATE TRIGGER jobs_counted_in AFTER INSERT ON jobs BEGIN
    INSERT INTO job_counts (status, n) VALUES (NEW.status, 1) ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER jobs_counted_out AFTER DELETE ON jobs BEGIN
    UPDATE job_counts SET n = n - 1 WHERE status = OLD.status;
END;
CREATE TRIGGER jobs_counted_moved AFTER UPDATE OF status ON jobs WHEN OLD.status != NEW.status BEGIN
    UPDATE job_counts SET n = n - 1 WHERE status = OLD.status;
    INSERT INTO job_counts (status, n) VALUES (NEW.status, 1) ON CONFLICT (status) DO UPDATE SET n = n + 1;
END;
"""

_V3 = """
ALTER TABLE jobs ADD COLUMN status_detail TEXT;
"""

_V4 = """
ALTER TABLE jobs ADD COLUMN baselines TEXT NOT NULL DEFAULT '[]';
"""

STEPS = (_V1, _V2, _V3, _V4)  # STEPS[k] takes a database from version k to version k + 1
VERSION = len(STEPS)


def version(connection: Connection) -> int:
    """A pre-Alembic SQLite database's schema version (0 for an empty file; 1 for the unversioned first schema)."""
    found = connection.exec_driver_sql("PRAGMA user_version").scalar_one()
    if found == 0 and connection.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = 'jobs'").first():
        return 1
    return found


def upgrade(connection: Connection, target: int = VERSION) -> None:
    """Run the steps from the database's version up to `target` inside the caller's transaction."""
    for step in range(version(connection), target):
        for statement in _statements(STEPS[step]):
            connection.exec_driver_sql(statement)
        connection.exec_driver_sql(f"PRAGMA user_version = {step + 1}")


def _statements(script: str) -> list[str]:
    """The complete SQL statements of `script` (a trigger body's semicolons stay inside its statement)."""
    statements, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement in a migration: {pending.strip()[:80]!r}")
    return statements
