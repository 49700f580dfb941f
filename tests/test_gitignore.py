"""The checkout stays clean after a default ``bart-opt serve`` in it: the jobs database and its sidecar files are ignored."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_default_jobs_database_and_its_sqlite_sidecar_files_are_ignored(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    shutil.copy(REPO / ".gitignore", tmp_path / ".gitignore")
    # What SQLite leaves beside ./bart_opt_jobs.db (BART_OPT_DB's default) while a server runs, and after a crash.
    for name in ("bart_opt_jobs.db", "bart_opt_jobs.db-wal", "bart_opt_jobs.db-shm", "bart_opt_jobs.db-journal"):
        (tmp_path / name).write_bytes(b"x")
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path, check=True,
                            capture_output=True, text=True).stdout
    assert status.split() == ["??", ".gitignore"]
