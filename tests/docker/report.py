"""The image smoke test's figures in pytest's terminal summary, with or without pytest-xdist.

The fixtures of tests/docker record step times and figures (`FIGURES`) or why the test did not run
(`SKIPPED`); this plugin adds up the time of that folder's tests and prints it all at the end of the run,
so CI's output shows it under ``-q`` too. Under ``-n`` the tests run in a worker: its figures travel to
the controller, which prints the summary, in the worker's ``workeroutput``. Registered by tests/conftest.py.
"""

from __future__ import annotations

import pytest

FIGURES: list[tuple[str, float, str]] = []
SPENT_S = [0.0]  # setup, call and teardown of every test in tests/docker: what it adds to the run
SKIPPED: list[str] = []  # why the smoke test did not run, if it did not
FOLDER = "tests/docker/"
KEY = "bart_opt_docker_smoke"


def pytest_runtest_logreport(report) -> None:
    """Add up the time of tests/docker's tests (in a worker, or without xdist in the one process)."""
    if report.nodeid.startswith(FOLDER) and not hasattr(report, "node"):  # reports relayed from a worker carry it
        SPENT_S[0] += report.duration


def pytest_sessionfinish(session) -> None:
    """In an xdist worker: hand this worker's figures to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[KEY] = {"figures": FIGURES, "spent_s": SPENT_S[0], "skipped": SKIPPED}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """In the xdist controller: take in the figures of a worker that finished."""
    got = getattr(node, "workeroutput", {}).pop(KEY, None)  # xdist may report a node down twice (Ctrl-C)
    if got:
        FIGURES.extend(tuple(figure) for figure in got["figures"])
        SPENT_S[0] += got["spent_s"]
        SKIPPED.extend(got["skipped"])


def pytest_terminal_summary(terminalreporter) -> None:
    """Print the smoke test's step times and figures, when it ran, or why it did not (pytest -q shows skips
    as a count only)."""
    if SKIPPED:
        terminalreporter.write_sep("-", f"image smoke test (tests/docker) skipped: {SKIPPED[0]}")
    if FIGURES:
        terminalreporter.write_sep("-", "image smoke test (tests/docker): steps")
        for name, amount, unit in [*FIGURES, ("all of tests/docker (fixtures, tests, clean-up)", SPENT_S[0], "s")]:
            terminalreporter.write_line(f"{name:<64} {amount:9.1f} {unit}")
