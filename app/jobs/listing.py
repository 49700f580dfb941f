"""Keyset pagination of ``GET /evaluate``: cursors, and the page between them with its links.

Jobs are listed newest first by ``(created_at, id)``, a key no two jobs share, so a page is
"the `limit` jobs just older than this key" (``before``) or "just newer than it" (``after``)
and reaches every job however many there are, while jobs come and go: no job is skipped
or shown twice because others were added meanwhile (an offset would shift).

A cursor is that key, opaque to clients: URL-safe base64 of ``[created_at, id]`` as JSON.
The links of a page carry them: ``links.next`` (older jobs) and ``links.prev`` (newer ones),
each None where there is nothing more that way.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from urllib.parse import urlencode

from app.domain_errors import Refused
from app.jobs.job import Job

MAX_CURSOR_CHARS = 512


@dataclass(frozen=True)
class Cursor:
    """A place in the listing: the key ``(created_at, id)`` of the job next to it."""

    key: tuple[float, str]

    @classmethod
    def of(cls, job: Job) -> Cursor:
        return cls((job.created_at, job.id))

    @classmethod
    def parse(cls, field: str, value: str | None) -> Cursor | None:
        """The cursor a client sent as `field` (None when absent); `Refused` naming `field` when it is not one."""
        if value is None:
            return None
        try:
            if len(value) > MAX_CURSOR_CHARS:
                raise ValueError
            created_at, job_id = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
            if isinstance(created_at, bool) or not isinstance(created_at, (int, float)) or not isinstance(job_id, str):
                raise ValueError
            if not math.isfinite(created_at):
                raise ValueError
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
            raise Refused("invalid_request", f"{field}: not a cursor of this listing; follow the links.next "
                          "and links.prev of a page", field=field) from None
        return cls((float(created_at), job_id))

    def __str__(self) -> str:
        raw = json.dumps(list(self.key), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def page(jobs: list[Job], limit: int, before: Cursor | None, after: Cursor | None
         ) -> tuple[list[Job], Cursor | None, Cursor | None]:
    """The page in `jobs` (what `JobStore.list` gave for ``limit + 1``, newest first) and the
    cursors of the pages older and newer than it (None where there is none)."""
    if after is not None and before is None:  # read upwards from `after`: the extra job is the newest
        shown = jobs[-limit:]
        newer = Cursor.of(shown[0]) if len(jobs) > limit else None
        return shown, (Cursor.of(shown[-1]) if shown else after), newer
    shown = jobs[:limit]
    older = Cursor.of(shown[-1]) if len(jobs) > limit else None
    newer = None if before is None else (Cursor.of(shown[0]) if shown else before)
    return shown, older, newer


def link(limit: int, status: str | None, field: str, cursor: Cursor | None) -> str | None:
    """``/evaluate?...`` for the page on the other side of `cursor` (None without one)."""
    if cursor is None:
        return None
    query = {"limit": limit, **({"status": status} if status else {}), field: str(cursor)}
    return f"/evaluate?{urlencode(query)}"
