"""Where the jobs live (``BART_OPT_DB``): the URL, the engine and its pool, and database errors in words.

``BART_OPT_DB`` is one of

- a file path (``./bart_opt_jobs.db``, ``/var/lib/bart-opt/jobs.db``) or ``sqlite:///PATH``
  (``sqlite:////abs/path.db`` for an absolute path): an embedded SQLite database, the default;
- ``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (also ``postgres://``, ``postgresql+psycopg://``,
  and ``?host=/socket/dir`` for a unix socket): a PostgreSQL server, through psycopg 3 (the
  ``postgres`` extra: ``pip install "bart-opt[postgres]"``).

Anything else is refused by `database_url` with a sentence saying what to write instead,
including a URL that lost a slash on the way (``postgresql:/...``), which would otherwise
become a SQLite file named like the URL, and a URL whose password holds an ``@`` or a ``%`` that
is not percent-encoded (where its user information ends would be a guess).

A password is never printed: every message and log line shows ``BART_OPT_DB`` through
`redacted`, which hides the password of the user information (``postgres:***@host``) and of a
``password=`` query parameter (``?password=***``) in any text, a URL that does not parse
included (`shown_url` for a parsed one).

`make_engine` builds the SQLAlchemy engine both backends share. Its connection pool is
bounded (`PoolLimits`: ``BART_OPT_DB_POOL_SIZE`` connections kept, ``BART_OPT_DB_MAX_OVERFLOW``
more while busy, closed when given back; a caller waits ``BART_OPT_DB_POOL_TIMEOUT_S`` for one),
so the descriptors a process holds do not grow with its threads. On SQLite every connection
is in autocommit mode, with ``synchronous=FULL``, and a transaction starts with ``BEGIN
IMMEDIATE`` when it writes (the engine's ``write`` execution option), ``BEGIN`` when it reads;
on PostgreSQL connections are checked before use (``pool_pre_ping``), so a server that
restarted costs no failed request.

Errors: `StoreError` is every database failure, with `StoreError.reason`, a sentence safe
for a client (no path, no host, no SQL), and `StoreError.damaged` for a database whose
pages are corrupt (nothing to retry). `StoreConflict` is a constraint violation. The reason names
the cause: a refused login (a wrong password, an unknown user), a right the user lacks (CREATE
on the schema, CONNECT on the database, pg_hba.conf), a server that cannot be reached (connection
refused, a name that does not resolve, no answer in time), a busy or full server. PostgreSQL says
why by its SQLSTATE, except for a connection that could not be made, where libpq's own message is
all there is (`_CONNECT_PHRASES`).
"""

from __future__ import annotations

import importlib.util
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, event, exc
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import QueuePool

from bart_opt.redaction import URL_SCHEME, redacted
from bart_opt.surfaces import surfaced

_POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
_URL_FORMS = "a file path, sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
_ENCODE = ("percent-encode the password's '@', '/', ':' and '%' (python3 -c \"import sys, urllib.parse; "
           "print(urllib.parse.quote(sys.argv[1], safe=''))\" 'PASSWORD')")
_PERCENT_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")

_SQLITE_PHRASES = {
    "SQLITE_READONLY": "is read-only",
    "SQLITE_FULL": "is full (no space left on its disk)",
    "SQLITE_BUSY": "is busy (locked by another writer)",
    "SQLITE_LOCKED": "is busy (locked by another writer)",
    "SQLITE_CANTOPEN": "cannot be opened",
    "SQLITE_IOERR": "cannot be read or written (an I/O error)",
    "SQLITE_CORRUPT": "is damaged",
    "SQLITE_NOTADB": "is not a database",
    "SQLITE_PERM": "cannot be accessed (permission denied)",
}
_SQLITE_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
_LOGIN_REFUSED = "refused its login (password authentication failed: check the user and password in BART_OPT_DB)"
# PostgreSQL SQLSTATEs (https://www.postgresql.org/docs/current/errcodes-appendix.html): exact codes
# first, then their two-character classes.
_POSTGRES_PHRASES = {
    "53100": "is full (no space left on its server's disk)",
    "53300": "is busy (its server has no connection left)",
    "25006": "is read-only",
    "40001": "is busy (a concurrent transaction conflicted)",
    "40P01": "is busy (a concurrent transaction conflicted)",
    "55P03": "is busy (locked by another writer)",
    "57P01": "cannot be reached (its server is shutting down or restarting)",
    "57P02": "cannot be reached (its server is shutting down or restarting)",
    "57P03": "cannot be reached (its server is shutting down or restarting)",
    "3D000": "does not exist on its server",
    "42501": "cannot be accessed (permission denied: its user lacks a right it needs, such as CREATE on the schema "
             "or CONNECT on the database)",
    "28P01": _LOGIN_REFUSED,
    "XX001": "is damaged",
    "XX002": "is damaged",
    "08": "cannot be reached (the connection to its server failed)",
    "28": "refused its login (check the user in BART_OPT_DB, and the server's pg_hba.conf)",
    "53": "is busy (its server is out of resources)",
}
_POSTGRES_DAMAGED = ("XX001", "XX002")
# libpq reports a failed connection without a SQLSTATE: its message (client-side, in English) says why.
_CONNECT_PHRASES = (
    ("password authentication failed", _LOGIN_REFUSED),
    ("no password supplied", "refused its login (the server asks for a password and BART_OPT_DB gives none)"),
    ("authentication failed", "refused its login (authentication failed: check the user in BART_OPT_DB)"),
    ('role "', "refused its login (its user does not exist on the server: check the user in BART_OPT_DB)"),
    ("no pg_hba.conf entry", "cannot be accessed (permission denied: the server's pg_hba.conf admits no connection "
                             "from this host for this user and database)"),
    ("permission denied", "cannot be accessed (permission denied: its user lacks CONNECT on the database)"),
    ("does not exist", "does not exist on its server"),
    ("too many connections", "is busy (its server has no connection left)"),
    ("remaining connection slots", "is busy (its server has no connection left)"),
    ("the database system is", "cannot be reached (its server is shutting down or restarting)"),
    ("connection refused", "cannot be reached (nothing listens at its address: connection refused)"),
    ("could not translate host name", "cannot be reached (its host name does not resolve)"),
    ("name or service not known", "cannot be reached (its host name does not resolve)"),
    ("timeout expired", "cannot be reached (no answer within BART_OPT_DB_CONNECT_TIMEOUT_S)"),
    ("timed out", "cannot be reached (no answer within BART_OPT_DB_CONNECT_TIMEOUT_S)"),
    ("no route to host", "cannot be reached (no route to its host)"),
    ("network is unreachable", "cannot be reached (no route to its host)"),
)
_UNREACHED = "cannot be reached (the connection to its server failed or was lost)"


class InvalidDatabaseUrl(ValueError):
    """``BART_OPT_DB`` is neither a file path nor a URL of a supported database."""


class StoreError(Exception):
    """A failure of the jobs database; `reason` says what is wrong in words a client may see."""

    def __init__(self, reason: str, *, damaged: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.damaged = damaged


class StoreConflict(StoreError):
    """A write that a constraint refused (a row that already exists): a bug, never a fault."""


@dataclass(frozen=True)
class PoolLimits:
    """The connection pool of one store: `size` connections kept open, `overflow` more while
    busy (closed when given back), `timeout_s` a caller waits for one, `connect_timeout_s` to
    open one to a server. Each is a service setting (`bart_opt.surfaces`: ``BART_OPT_DB_POOL_SIZE``, ...)."""

    size: int = surfaced(5, "connections to the jobs database each process keeps open", setting="db_pool_size", ge=1)
    overflow: int = surfaced(10, "connections each process may open beyond db_pool_size while busy (closed when "
                                 "idle)", setting="db_max_overflow", ge=0)
    timeout_s: float = surfaced(10.0, "seconds a request waits for a free database connection before it is refused",
                                setting="db_pool_timeout_s", gt=0)
    connect_timeout_s: float = surfaced(10.0, "seconds to open a connection to a database server",
                                        setting="db_connect_timeout_s", gt=0)


def database_url(value: str | Path) -> URL:
    """The database that `value` (``BART_OPT_DB``) names, as a SQLAlchemy URL.

    A file path becomes ``sqlite:///PATH``; PostgreSQL URLs get the psycopg driver. Raises
    `InvalidDatabaseUrl` (its message shows the value `redacted`) for an unknown scheme, a URL
    missing its ``//``, a password with an unencoded ``@`` or ``%``, a URL that does not parse, an
    empty value, or a PostgreSQL URL while psycopg is not installed.
    """
    text = str(value)
    if not text.strip():
        raise InvalidDatabaseUrl(f"BART_OPT_DB is empty; give {_URL_FORMS}")
    if "://" not in text:
        if URL_SCHEME.match(text):
            scheme = text.split(":", 1)[0]
            raise InvalidDatabaseUrl(
                f"BART_OPT_DB {redacted(text)!r} looks like a {scheme}: URL without '//' after the scheme, not a "
                f"file path; write {scheme}://... (or start a file name of that form with ./)")
        return URL.create("sqlite", database=text)
    userinfo = _userinfo(text.split("://", 1)[1])
    if userinfo is not None and ("@" in userinfo or _PERCENT_ESCAPE.search(userinfo)):
        raise InvalidDatabaseUrl(f"BART_OPT_DB {redacted(text)!r}: its password holds an '@' or a '%' that is not "
                                 f"percent-encoded, so where the host begins is a guess; {_ENCODE}")
    try:
        url = make_url(text)
    except (exc.ArgumentError, ValueError):  # a port that is no number: a '/', '@' or ':' of a password, often
        raise InvalidDatabaseUrl(f"BART_OPT_DB {redacted(text)!r} is not a valid URL; give {_URL_FORMS}, and "
                                 f"{_ENCODE}") from None
    if url.drivername == "sqlite":
        if not url.database:
            raise InvalidDatabaseUrl("BART_OPT_DB sqlite:// names no file (an in-memory database would lose every "
                                     "job); write sqlite:///PATH")
        return url
    if url.drivername in _POSTGRES_SCHEMES:
        if importlib.util.find_spec("psycopg") is None:
            raise InvalidDatabaseUrl('BART_OPT_DB is a PostgreSQL URL but psycopg is not installed: '
                                     'pip install "bart-opt[postgres]"')
        return url.set(drivername="postgresql+psycopg")
    raise InvalidDatabaseUrl(f"BART_OPT_DB: unknown database {url.drivername!r}; give {_URL_FORMS}")


def _userinfo(rest: str) -> str | None:
    """What stands before the host in `rest` (a URL after its ``scheme://``): everything up to the last ``@``
    before the query (a password may hold a ``/``), None without one."""
    before_query = rest.split("?", 1)[0]
    at = before_query.rfind("@")
    return None if at < 0 else before_query[:at]


def shown_url(url: URL) -> str:
    """`url` for a log line: its passwords hidden (`redacted`)."""
    return redacted(url.render_as_string(hide_password=True))


def make_engine(url: URL, pool: PoolLimits, *, sqlite_factory: type[sqlite3.Connection] = sqlite3.Connection,
                busy_timeout: float = 15.0) -> Engine:
    """The engine of the database at `url` with a bounded pool (see the module docstring).

    `sqlite_factory` is the `sqlite3.Connection` class SQLite connections are made from
    (tests pass one that injects faults); `busy_timeout` how long a SQLite write waits for
    another writer's lock.
    """
    limits = {"poolclass": QueuePool, "pool_size": pool.size, "max_overflow": pool.overflow,
              "pool_timeout": pool.timeout_s}
    if url.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": max(1, round(
            pool.connect_timeout_s)), "application_name": "bart-opt"}, **limits)
    path = url.database

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False,
                                     factory=sqlite_factory)
        connection.execute("PRAGMA synchronous=FULL")
        return connection

    engine = create_engine(url, creator=connect, **limits)

    @event.listens_for(engine, "begin")
    def _begin(connection) -> None:  # pysqlite's own BEGIN is deferred and late; ours takes the lock up front
        immediate = connection.get_execution_options().get("write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def store_error(error: BaseException) -> StoreError:
    """The `StoreError` for what SQLAlchemy raised (a driver error, or no pooled connection in time), or
    for a driver's own error."""
    if isinstance(error, exc.TimeoutError):
        return StoreError("the jobs database (BART_OPT_DB) is busy (every pooled connection is in use: "
                          "BART_OPT_DB_POOL_SIZE, BART_OPT_DB_MAX_OVERFLOW)")
    original = getattr(error, "orig", error)
    phrase, damaged = "cannot be used", False
    if isinstance(original, sqlite3.Error):
        extended = getattr(original, "sqlite_errorname", None) or ""
        primary = "_".join(extended.split("_")[:2])  # SQLITE_IOERR_WRITE -> SQLITE_IOERR
        phrase, damaged = _SQLITE_PHRASES.get(primary, phrase), primary in _SQLITE_DAMAGED
    else:
        state = getattr(original, "sqlstate", None) or ""
        phrase = _POSTGRES_PHRASES.get(state) or _POSTGRES_PHRASES.get(state[:2])
        if phrase is None and not state:  # the connection could not be made, or was lost: libpq's words say why
            said = str(original).lower()
            phrase = next((words for key, words in _CONNECT_PHRASES if key in said), _UNREACHED)
        elif phrase is None:
            phrase = _UNREACHED if getattr(error, "connection_invalidated", False) else "cannot be used"
        damaged = state in _POSTGRES_DAMAGED
    kind = StoreConflict if isinstance(error, exc.IntegrityError) else StoreError
    return kind(f"the jobs database (BART_OPT_DB) {phrase}", damaged=damaged)


@contextmanager
def translated() -> Iterator[None]:
    """Raise what SQLAlchemy raises inside as a `StoreError` (the original chained)."""
    try:
        yield
    except (exc.DBAPIError, exc.TimeoutError) as error:
        raise store_error(error) from error
