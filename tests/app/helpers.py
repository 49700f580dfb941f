"""Helpers shared by the service tests (fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import functools
import random
import threading
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.device.engine import load_summarizer
from app.server import server_config
from bart_opt.demo import random_article

# Short generation keeps each model call of the tiny demo model well under a second.
FAST = {"num_beams": 2, "max_length": 8, "min_length": 2}


class Gate:
    """A Summarizer `before_model_call` hook that holds every model call until `open()`.

    `calls` lists the input positions of each call that reached the hook; `entered` is set
    once a call is waiting, so a test knows the device is busy.
    """

    def __init__(self) -> None:
        self._opened = threading.Event()
        self.entered = threading.Event()
        self.calls: list[list[int]] = []

    def __call__(self, positions: list[int]) -> None:
        self.calls.append(list(positions))
        self.entered.set()
        if not self._opened.wait(60):
            raise TimeoutError("gate never opened")

    def open(self) -> None:
        self._opened.set()

    def loader(self):
        """A `create_app(load=...)` loader whose Summarizer calls this gate before each model call."""
        return functools.partial(load_summarizer, before_model_call=self)


@contextmanager
def serving(app: FastAPI, *, wait_ready: bool = True) -> Iterator[TestClient]:
    """Run the app's lifespan and yield a TestClient (after the model loaded, by default)."""
    with TestClient(app, raise_server_exceptions=False) as client:
        if wait_ready:
            assert app.state.engine.worker.wait_ready(60), app.state.engine.worker.load_error
        yield client


@contextmanager
def live_server(app: FastAPI) -> Iterator[tuple[str, int]]:
    """Serve the app with uvicorn as ``bart-opt serve`` does (`app.server.server_config`: its header deadline and
    connection cap, from the app's settings) on a free loopback port in a thread; yields (host, port) once ready.

    Uvicorn leaves logging alone (``log_config=None``), so its records reach pytest's caplog.
    """
    config = server_config(app, app.state.settings, host="127.0.0.1", port=0, log_config=None, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn")
    thread.start()
    try:
        for _ in range(3000):
            if server.started or not thread.is_alive():
                break
            threading.Event().wait(0.01)
        assert server.started, "uvicorn did not start"
        assert app.state.engine.worker.wait_ready(60), app.state.engine.worker.load_error
        yield "127.0.0.1", server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(60)


@asynccontextmanager
async def async_serving(app: FastAPI):
    """Async variant of `serving`: an httpx AsyncClient on the ASGI app, lifespan running."""
    async with app.router.lifespan_context(app):
        ready = await asyncio.to_thread(app.state.engine.worker.wait_ready, 60)
        assert ready, app.state.engine.worker.load_error
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=120) as client:
            yield client


def articles(n: int, seed: int = 0, sentences: int = 2) -> list[str]:
    """`n` distinct short pseudo articles."""
    rng = random.Random(seed)
    return [random_article(rng, sentences) for _ in range(n)]


async def until(predicate, timeout: float = 30.0) -> None:
    """Poll `predicate` on the event loop until it holds."""
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a Prometheus exposition."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(parsed: dict, name: str, **labels) -> float:
    """One sample of `samples(...)` by name and labels."""
    return parsed[(name, tuple(sorted(labels.items())))]
