"""Fixtures of the browser tests: Debian's Chromium through Playwright, and live servers on the demo model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from app.main import create_app
from app.settings import Settings
from tests.app.dashboard.live import LiveServer, browser_unavailable, launch_chromium, wait_for_jobs
from tests.app.helpers import FAST
from tests.app.jobs.helpers import cnn_rows


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for the module; the tests skip, saying why, where none can be started."""
    reason = browser_unavailable()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh page; `page.errors` collects console errors and uncaught exceptions."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.errors = []
    tab.on("console", lambda message: message.type == "error" and tab.errors.append(message.text))
    tab.on("pageerror", lambda error: tab.errors.append(f"uncaught: {error}"))
    tab.set_default_timeout(30_000)
    yield tab
    context.close()


@pytest.fixture(scope="module")
def make_server(demo_checkpoint, tmp_path_factory):
    """`make_server(load=..., **settings)`: a LiveServer (not yet entered) on the demo model with a data dir."""

    def _make(*, load=None, **overrides) -> LiveServer:
        work = tmp_path_factory.mktemp("live")
        data = work / "data"
        data.mkdir()
        (data / "cnn.jsonl").write_text("".join(json.dumps(row) + "\n" for row in cnn_rows(6, seed=8)))
        settings = Settings(model=demo_checkpoint, db=str(work / "jobs.db"), data_dir=str(data), max_batch_size=2,
                            **overrides)  # fmt: skip
        return LiveServer(create_app(settings, **({"load": load} if load else {})))

    return _make


@pytest.fixture(scope="module")
def site(make_server):
    """A live server with two succeeded jobs on the same file (1 and 2 beams): `url`, `client`, `jobs`."""
    with make_server() as live, live.client() as client:
        ids = [client.post("/evaluate", json={"dataset": {"file": "cnn.jsonl"},
                                              "generation": {**FAST, "num_beams": beams}}).json()["id"]
               for beams in (1, 2)]  # fmt: skip
        views = wait_for_jobs(client, ids)
        assert [view["status"] for view in views] == ["succeeded", "succeeded"], views
        yield SimpleNamespace(url=live.url, client=client, jobs=ids)
