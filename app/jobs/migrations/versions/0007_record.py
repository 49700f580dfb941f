"""Schema 7: every job holds its run record, and a job of another system's predictions can be stored.

- ``system``: ``bart`` (the server's model runs it) or ``external`` (its records carry predictions,
  scored without a model: ``POST /evaluate`` with ``predictions``);
- ``engine`` (JSON) and ``engine_key``: the engine of the server the job was submitted to, as resolved
  (`bart_opt.evaluate.record.engine_record`, `engine_key`); a replica claims only jobs whose
  ``engine_key`` is its own (or external ones), and fails one that waited `job_engine_wait_s` for a
  replica with its engine, naming both;
- ``rouge_settings`` (JSON): the job's `bart_opt.pipeline.rouge.RougeSettings`;
- ``record`` (JSON): the versions, the processor, the start and the signature of the run record;
- ``waiting_since``: when the job last became claimable (sealed, or handed back), for that wait.

Jobs made before this version have none (NULL): a model job among them takes the engine of the
first replica that claims it if nothing has been written for it yet (see `app.jobs.runner`), and
is scored with the default ROUGE settings, as it was.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("system", sa.Text, nullable=False, server_default="bart"))
    for name in ("engine", "engine_key", "rouge_settings", "record"):
        op.add_column("jobs", sa.Column(name, sa.Text))
    op.add_column("jobs", sa.Column("waiting_since", sa.Double))
