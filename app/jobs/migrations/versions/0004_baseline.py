"""Schema 4, the baseline: the tables as the store had them when Alembic took over.

A new database (SQLite or PostgreSQL) gets them here. A SQLite file made before Alembic
already has them at some version 1 to 4 (``PRAGMA user_version``): it is brought to 4 in
place by the frozen steps of `app.jobs.migrations.legacy`, keeping every row, and goes on
from here like any other.

Revision ID: 0004
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from app.jobs.migrations import legacy

revision = "0004"
down_revision = None
branch_labels = None
depends_on = None

_STATUSES = ("loading", "queued", "running", "succeeded", "failed", "cancelled")

# job_counts: jobs per status, kept by triggers so that counting never scans jobs. On PostgreSQL
# every status has its row from the start, and a status change updates both rows in one statement.
_SQLITE_TRIGGERS = (
    """CREATE TRIGGER jobs_counted_in AFTER INSERT ON jobs BEGIN
    INSERT INTO job_counts (status, n) VALUES (NEW.status, 1) ON CONFLICT (status) DO UPDATE SET n = n + 1;
END""",
    """CREATE TRIGGER jobs_counted_out AFTER DELETE ON jobs BEGIN
    UPDATE job_counts SET n = n - 1 WHERE status = OLD.status;
END""",
    """CREATE TRIGGER jobs_counted_moved AFTER UPDATE OF status ON jobs WHEN OLD.status != NEW.status BEGIN
    UPDATE job_counts SET n = n - 1 WHERE status = OLD.status;
    INSERT INTO job_counts (status, n) VALUES (NEW.status, 1) ON CONFLICT (status) DO UPDATE SET n = n + 1;
END""",
)
_POSTGRES_TRIGGERS = (
    """CREATE FUNCTION jobs_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE job_counts SET n = n + 1 WHERE status = NEW.status;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE job_counts SET n = n - 1 WHERE status = OLD.status;
    ELSIF OLD.status <> NEW.status THEN
        UPDATE job_counts SET n = n + CASE WHEN status = NEW.status THEN 1 ELSE -1 END
            WHERE status IN (OLD.status, NEW.status);
    END IF;
    RETURN NULL;
END
$$""",
    "CREATE TRIGGER jobs_counted AFTER INSERT OR DELETE OR UPDATE OF status ON jobs "
    "FOR EACH ROW EXECUTE FUNCTION jobs_counted()",
)


def upgrade() -> None:
    connection = op.get_bind()
    if connection.dialect.name == "sqlite" and sa.inspect(connection).has_table("jobs"):
        legacy.upgrade(connection)  # a file from before Alembic: versions 1-3 reach 4 in place
        return
    status = sa.CheckConstraint(f"status IN ({', '.join(repr(s) for s in _STATUSES)})", name="jobs_status")
    op.create_table(
        "jobs",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("idempotency_key", sa.Text, unique=True),
        sa.Column("request_hash", sa.Text, nullable=False),
        sa.Column("status", sa.Text, status, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("dataset", sa.Text, nullable=False),
        sa.Column("columns", sa.Text, nullable=False),
        sa.Column("record_limit", sa.BigInteger),
        sa.Column("generation", sa.Text, nullable=False),
        sa.Column("total", sa.BigInteger, nullable=False),
        sa.Column("done", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("failed", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("work_s", sa.Double, nullable=False, server_default=sa.text("0")),
        sa.Column("active_s", sa.Double, nullable=False, server_default=sa.text("0")),
        sa.Column("runs", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("stalled_runs", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("done_at_start", sa.BigInteger),
        sa.Column("peak_bytes", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("owner", sa.Text),
        sa.Column("lease_until", sa.Double),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("started_at", sa.Double),
        sa.Column("finished_at", sa.Double),
        sa.Column("error", sa.Text),
        sa.Column("metrics", sa.Text),
        sa.Column("status_detail", sa.Text),
        sa.Column("baselines", sa.Text, nullable=False, server_default="[]"),
    )
    op.create_index("jobs_by_status", "jobs", ["status", "created_at"])
    op.create_table(
        "records",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("position", sa.BigInteger, primary_key=True),
        sa.Column("example_id", sa.Text, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("reference", sa.Text),
        sa.Column("error", sa.Text),
    )
    op.create_index("records_by_id", "records", ["job_id", "example_id"], unique=True)
    op.create_table(
        "predictions",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("example_id", sa.Text, primary_key=True),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("batch", sa.BigInteger, nullable=False),
        sa.Column("run", sa.Integer, nullable=False),
        sa.Column("row", sa.Text, nullable=False),
        sa.Column("failed", sa.Integer, nullable=False, server_default=sa.text("0")),
    )
    op.create_index("predictions_in_order", "predictions", ["job_id", "position"])
    failed = sa.text("failed = 1")
    op.create_index("predictions_failed", "predictions", ["job_id", "position"], sqlite_where=failed,
                    postgresql_where=failed)
    op.create_table(
        "batches",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("batch", sa.BigInteger, primary_key=True),
        sa.Column("run", sa.Integer, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("peak_bytes", sa.BigInteger, nullable=False),
        sa.Column("seconds", sa.Double, nullable=False),
        sa.Column("queue_s", sa.Double, nullable=False),
        sa.Column("finished_at", sa.Double, nullable=False),
    )
    counts = op.create_table(
        "job_counts",
        sa.Column("status", sa.Text, primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    if connection.dialect.name == "postgresql":
        op.bulk_insert(counts, [{"status": s, "n": 0} for s in _STATUSES])
    for statement in _POSTGRES_TRIGGERS if connection.dialect.name == "postgresql" else _SQLITE_TRIGGERS:
        op.execute(statement)

