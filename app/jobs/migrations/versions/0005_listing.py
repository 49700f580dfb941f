"""Schema 5: indexes for listing every job page by page (``GET /evaluate?before=...``).

``jobs_listed`` orders all jobs by ``(created_at, id)``, the keyset of the listing's cursors;
``jobs_by_status`` gains ``id`` so that a listing of one status (and the runner's queue, oldest
first) reads its keyset from the index too.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("jobs_listed", "jobs", ["created_at", "id"])
    op.drop_index("jobs_by_status", table_name="jobs")
    op.create_index("jobs_by_status", "jobs", ["status", "created_at", "id"])
