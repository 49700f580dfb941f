"""One run per run folder: an exclusive ``fcntl.flock`` held for the run's lifetime.

Two ``bart-opt evaluate`` runs on one ``--out`` folder would both append to its predictions and
both rewrite its run.json. `RunLock(folder)` takes an exclusive, non-blocking lock on
``folder/run.lock`` and writes its holder's pid there; a second run fails at once with
`RunFolderBusy` naming that pid. The lock file is opened without following a symbolic link
(``O_NOFOLLOW``): a planted ``run.lock`` link fails the run instead of truncating its target. The kernel drops the lock when the holder's descriptor closes,
so a run killed with SIGKILL leaves a folder the next run can take: the stale pid in the file is
only read when the lock is held.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_FILE = "run.lock"


class RunFolderBusy(ValueError):
    """Another process holds the run folder's lock; `pid` is its process id (None if unreadable)."""

    def __init__(self, folder: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "a process whose pid could not be read"
        super().__init__(
            f"{folder} is in use by another run ({holder}); wait for it to finish, or use another output directory"
        )
        self.folder = folder
        self.pid = pid


class RunLock:
    """An exclusive lock on a run folder (created if missing) while the ``with`` block runs.

    Raises `RunFolderBusy` on entry when another process holds it. Not reentrant: one `RunLock`
    per run. The lock file stays in the folder (removing it would let a third run lock a new
    file while the second still holds the old one).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        try:  # never through a link: a planted run.lock -> elsewhere would have that file truncated to a pid
            fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise ValueError(f"{self.folder / LOCK_FILE} is a symbolic link; a run folder's files must be plain "
                                 "files: remove it, or use another output directory") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise RunFolderBusy(self.folder, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc_info: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock


def _read_pid(fd: int) -> int | None:
    """The pid the holder wrote, or None while it has not yet written one (or wrote garbage)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None
