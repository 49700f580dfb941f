"""``python -m app.jobs.migrations [DB]``: the schema version this code writes and the one of the
database `DB` (default ``BART_OPT_DB``), without changing it."""

from __future__ import annotations

import sys

from app.jobs.database import PoolLimits, database_url, make_engine, shown_url, translated
from app.jobs.migrations import HEAD, version
from app.settings import Settings


def main(argv: list[str]) -> int:
    url = database_url(argv[0] if argv else Settings().db)
    print(f"code: schema version {HEAD} (app/jobs/migrations/versions/)")
    engine = make_engine(url, PoolLimits(size=1, overflow=0))
    try:
        with translated(), engine.connect() as connection:
            print(f"database {shown_url(url)}: schema version {version(connection)}")
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
