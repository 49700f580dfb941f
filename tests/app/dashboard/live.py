"""A live server and a headless Chromium for the dashboard's browser tests and screenshots.

`LiveServer` runs an app under uvicorn on a free loopback port, in a thread of this process, so a
test can hold its model calls (`Stepper`) and read its state. `launch_chromium` starts Debian's
``chromium`` through Playwright; `browser_unavailable` says why that cannot happen here, if it cannot.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI

from app.server import server_config

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def browser_unavailable() -> str | None:
    """Why no browser test can run here (None when Playwright and Chromium are installed)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install -e '.[test]')"
    if shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    return None


def launch_chromium(playwright):
    """Debian's Chromium, headless, with nothing that talks to the network by itself."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


class LiveServer:
    """`app` under uvicorn, configured as ``bart-opt serve`` configures it (`app.server.server_config`), on
    127.0.0.1 in a background thread (a context manager; waits for the model)."""

    def __init__(self, app: FastAPI, ready_timeout: float = 120) -> None:
        self.app = app
        # Bound here, so no other process (a Ray worker) can take the port before the server listens.
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_timeout = ready_timeout
        config = server_config(app, app.state.settings, log_level="warning", lifespan="on")  # as bart-opt serve runs it
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, name="live-server",
                                       daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + self.ready_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the live server did not start")
            time.sleep(0.05)
        worker = self.app.state.engine.worker
        assert worker.wait_ready(self.ready_timeout), worker.load_error
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        self.socket.close()

    def client(self, api_key: str | None = None) -> httpx.Client:
        """An HTTP client on this server (with the bearer token when given)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120)


def wait_for_jobs(client: httpx.Client, ids: list[str], timeout: float = 120) -> list[dict]:
    """Poll until every job in `ids` has ended; their views."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = [client.get(f"/evaluate/{job_id}").json() for job_id in ids]
        if all(view["status"] in ("succeeded", "failed", "cancelled") for view in views):
            return views
        time.sleep(0.1)
    raise AssertionError(f"jobs never ended: {[view['status'] for view in views]}")
