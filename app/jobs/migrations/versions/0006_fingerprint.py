"""Schema 6: every job records the fingerprint of the checkpoint it runs on.

``jobs.fingerprint`` is `bart_opt.engine.fingerprint`'s content digest of the model the job was
submitted to (weights, config, generation config, tokenizer files). A job resumes only on a
model with the same fingerprint; otherwise it fails naming both. Jobs made before this
version have none (NULL): they resume on whatever model serves them only if nothing has been
written for them yet (see `app.jobs.runner`).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("fingerprint", sa.Text))
