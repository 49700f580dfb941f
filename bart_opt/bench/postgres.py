"""A throwaway PostgreSQL cluster for the tests and benchmarks: Debian's ``initdb`` and ``pg_ctl`` in a temp folder.

`TempCluster` makes a cluster in a fresh folder (trust authentication, listening on a free
port of 127.0.0.1 and on a unix socket in that folder), starts it, and removes it all on
exit. PostgreSQL refuses to run as root: as root, every server command runs as the
``postgres`` user (``runuser``), which gets the folder. `find_bin` finds the binaries
(``BART_OPT_PG_BIN``, else the newest ``/usr/lib/postgresql/*/bin``, else ``PATH``);
`unavailable` says why no cluster can be made here (None when one can).

    with TempCluster() as cluster:
        url = cluster.create_database("jobs")   # postgresql://postgres@127.0.0.1:PORT/jobs
        cluster.stop(); cluster.start()          # the server going away and coming back
        cluster.add_user("app", "pa/ss@wo:rd%", database="jobs", create=False)  # a password login without CREATE

Authentication is trust, except for the users `add_user` makes: they log in over TCP with their
password (scram-sha-256), so a wrong one is refused as on a real server.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from bart_opt.bench.service_load import free_port

USER = "postgres"


def find_bin() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl`` (None when there is none)."""
    if os.environ.get("BART_OPT_PG_BIN"):
        return Path(os.environ["BART_OPT_PG_BIN"])
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def unavailable() -> str | None:
    """Why a throwaway cluster cannot be made on this machine, or None."""
    if find_bin() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql, or set BART_OPT_PG_BIN)"
    if importlib.util.find_spec("psycopg") is None:
        return 'psycopg is not installed (pip install -e ".[postgres]")'
    if os.geteuid() == 0 and (shutil.which("runuser") is None or _no_user()):
        return "running as root without runuser or a 'postgres' user to run the server as"
    return None


def _no_user() -> bool:
    import pwd

    try:
        pwd.getpwnam(USER)
    except KeyError:
        return True
    return False


class TempCluster:
    """A PostgreSQL cluster in a temp folder, started on entry and deleted on exit (see the module docstring)."""

    def __init__(self, *, fsync: bool = True):
        self.bin = find_bin()
        self.fsync = fsync
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="bart_opt_pg_"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"

    def _run(self, *command: str) -> str:
        prefix = ["runuser", "-u", USER, "--"] if os.geteuid() == 0 else []
        done = subprocess.run(prefix + list(command), capture_output=True, text=True, check=False, cwd=self.folder)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}): {done.stderr.strip()}\n{log}")
        return done.stdout

    def __enter__(self) -> TempCluster:
        if os.geteuid() == 0:
            shutil.chown(self.folder, USER)
        try:
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "--auth=trust", "-U", USER, "-E", "UTF8",
                      "--no-instructions")
            self.start()
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        return self

    def start(self) -> None:
        """Start the server (again) and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync={'on' if self.fsync else 'off'}"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (connections cut, a clean shutdown) or ``immediate`` (as a crash)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        """The URL of `database` on this cluster."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database (named `name`, else a fresh unique name); returns its URL."""
        import psycopg

        name = name or f"test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def add_user(self, name: str, password: str, *, database: str | None = None, create: bool = True) -> None:
        """A login role `name` that must give `password` over TCP; with `database` (made if missing) it may
        connect there, and with `create` False it may not create anything in that database's public schema."""
        import psycopg
        from psycopg import sql

        admin = f"host=127.0.0.1 port={self.port} user={USER}"
        with psycopg.connect(f"{admin} dbname=postgres", autocommit=True) as c:
            c.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
            if database is not None and c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
                c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        if database is not None:
            with psycopg.connect(f"{admin} dbname={database}", autocommit=True) as c:
                c.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
                if create:
                    c.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(name)))
        hba = self.data / "pg_hba.conf"
        hba.write_text(f"host all {name} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "reload")

    def __exit__(self, *exc) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # already stopped
        shutil.rmtree(self.folder, ignore_errors=True)
