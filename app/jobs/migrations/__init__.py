"""The jobs database's schema, versioned and migrated by Alembic when a store opens (`migrate`).

**Where the version lives.** The schema version is an Alembic revision: one file per version
under ``app/jobs/migrations/versions/`` (``0004_baseline.py``, ``0005_listing.py``, ...), whose
``revision`` is the version number as four digits. The newest file is the version this code
writes (`HEAD`). A database stores its own in Alembic's table ``alembic_version``; SQLite
files also keep it in ``PRAGMA user_version``, which is where servers from before Alembic
read it, so that they refuse a newer file instead of running on it. To see both versions,
``python -m app.jobs.migrations [BART_OPT_DB]``.

**How it migrates.** `migrate` takes the database's write lock (SQLite: ``BEGIN IMMEDIATE``;
PostgreSQL: a transaction-scoped advisory lock), reads the version, and runs the missing
revisions in that one transaction, so several processes opening one database at once
migrate it once, and a process that dies half-way leaves the version it found. A SQLite file
made before Alembic (no ``alembic_version``; ``user_version`` 0 to 4) starts at the baseline
revision, which brings it to version 4 in place (`app.jobs.migrations.legacy`). A database
newer than this code is refused (`SchemaTooNew`), never downgraded.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from app.jobs.migrations import legacy

_FOLDER = Path(__file__).parent
_LOCK = 0x6A6F6273  # "jobs": the advisory lock PostgreSQL migrations hold


class SchemaTooNew(RuntimeError):
    """The database was written by a newer version of this service."""


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_FOLDER))
    return config


def _head() -> int:
    return int(ScriptDirectory.from_config(_config()).get_current_head())


HEAD = _head()  # the schema version this code writes: the newest revision under versions/


def version(connection: Connection) -> int:
    """The database's schema version (0: empty). A SQLite file from before Alembic reads as its
    ``user_version`` (1 for the unversioned first schema)."""
    revision = MigrationContext.configure(connection).get_current_revision()
    if revision is not None:
        return int(revision)
    return legacy.version(connection) if connection.dialect.name == "sqlite" else 0


def migrate(engine: Engine) -> tuple[int, int]:
    """Bring the database of `engine` to `HEAD` (see the module docstring); returns the versions
    ``(found, now)``. Raises `SchemaTooNew` for a database newer than this code."""
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect().execution_options(write=True) as connection, connection.begin():
        if not sqlite:
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK})
        found = version(connection)
        if found > HEAD:
            raise SchemaTooNew(f"the jobs database has schema version {found}; this server knows up to {HEAD}: "
                               "run a newer server on it")
        if found < HEAD:
            config = _config()
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            if sqlite:  # servers from before Alembic read the version here (and refuse a newer one)
                connection.exec_driver_sql(f"PRAGMA user_version = {HEAD}")
    return found, HEAD
