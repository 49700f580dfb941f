"""The run folder lock: one holder at a time, named by pid, released on exit and on SIGKILL."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from bart_opt.runlock import LOCK_FILE, RunFolderBusy, RunLock

HOLDER = textwrap.dedent(
    """
    import sys, time
    from bart_opt.runlock import RunLock
    with RunLock(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(60)
    """
)


@pytest.fixture
def holder(tmp_path):
    """A child process holding the lock on tmp_path/run; yields (folder, process)."""
    folder = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "locked"
        yield folder, process
    finally:
        process.kill()
        process.wait()


def test_a_second_run_fails_at_once_naming_the_holder(holder):
    folder, process = holder
    with pytest.raises(RunFolderBusy, match=rf"in use by another run \(pid {process.pid}\)") as caught:
        with RunLock(folder):
            pass
    assert caught.value.pid == process.pid


def test_the_lock_is_free_again_after_the_holder_is_killed(holder):
    folder, process = holder
    process.send_signal(signal.SIGKILL)
    process.wait()
    with RunLock(folder):
        assert (folder / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_the_lock_is_released_when_the_block_ends_even_on_error(tmp_path):
    with pytest.raises(KeyError):
        with RunLock(tmp_path / "run"):
            raise KeyError("boom")
    with RunLock(tmp_path / "run"):
        with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()}"):
            with RunLock(tmp_path / "run"):
                pass
    with RunLock(tmp_path / "run"):
        pass


def test_a_lock_file_without_a_pid_still_names_the_problem(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_FILE).write_text("not a pid")
    fd = os.open(folder / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunFolderBusy, match="whose pid could not be read") as caught:
            with RunLock(folder):
                pass
        assert caught.value.pid is None
    finally:
        os.close(fd)
