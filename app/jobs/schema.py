"""The jobs database's schema, versioned with ``PRAGMA user_version`` and migrated forward on open.

`migrate(connection)` brings a database of any earlier version (0: empty, or the unversioned
first schema, which is version 1's tables) to `VERSION`, one step per transaction, so a
process that stops mid-way leaves a database of a whole version. Each step re-reads the
version inside its write transaction, so several processes opening the same file at once
migrate it once. A database newer than this code is refused (`SchemaTooNew`), never
downgraded. Steps are SQL scripts split into statements here, because
``sqlite3.executescript`` would commit the transaction half way.

Version 2 (this module's reason to exist):

- ``jobs``: status ``loading`` (records still streaming in; invisible to the API and the
  runner), ``owner`` and ``lease_until`` (the process running or loading the job, and until
  when its claim holds), ``peak_bytes`` (kept up to date instead of a MAX over ``batches``),
  ``done_at_start`` nullable (NULL: the last run was released cleanly, not a stall).
- ``records.error``: why a record cannot run (too long, not encodable), found at submission;
  ids unique per job through an index.
- ``predictions.failed``: 1 for rows with an error, with a partial index, so the failures of
  a job are listed without reading its other rows.
- ``job_counts``: jobs per status, maintained by triggers, so counting never scans ``jobs``.

Version 3: ``jobs.status_detail``, what a running job is waiting for or running on, in words
(set by the runner of a job on a Ray cluster; NULL otherwise and once the job leaves ``running``).

Version 4: ``jobs.baselines``, the baselines (JSON list of names, e.g. ``["lead-3"]``) scored
beside the model when the job ends.
"""

from __future__ import annotations

import sqlite3

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


class SchemaTooNew(RuntimeError):
    """The database was written by a newer version of this service."""


def version(connection: sqlite3.Connection) -> int:
    """The database's schema version (0 for a new file or one made before versions)."""
    found = connection.execute("PRAGMA user_version").fetchone()[0]
    if found == 0 and connection.execute("SELECT 1 FROM sqlite_master WHERE name = 'jobs'").fetchone():
        return 1  # the first schema carried no version
    return found


def migrate(connection: sqlite3.Connection, target: int = VERSION) -> list[int]:
    """Bring the database up to `target`, one transaction per step; returns the versions reached.

    `connection` must be in autocommit mode (``isolation_level=None``).
    """
    reached = []
    while True:
        connection.execute("BEGIN IMMEDIATE")
        try:
            current = version(connection)
            if current > VERSION:
                raise SchemaTooNew(f"the jobs database has schema version {current}; this server knows up to "
                                   f"{VERSION}: run a newer server on it")
            if current >= target:
                connection.execute("COMMIT")
                return reached
            for statement in _statements(STEPS[current]):
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {current + 1}")
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        reached.append(current + 1)


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
