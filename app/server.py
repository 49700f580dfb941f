"""``serve()``: run the service under uvicorn (what ``bart-opt serve`` calls); `server_config`: how."""

from __future__ import annotations

import logging
import signal
from typing import Any

import uvicorn
from fastapi import FastAPI

from app.connections import GuardedH11Protocol
from app.main import create_app
from app.settings import Settings


def server_config(app: FastAPI, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration of `app` under `settings`: its address, the drain on SIGTERM, and the
    header deadline and connection cap of `app.connections` (`overrides` are other ``uvicorn.Config``
    arguments: tests pass ``port=0``)."""
    protocol = GuardedH11Protocol.configured(settings.header_timeout_s, settings.max_connections)
    options = {"host": settings.host, "port": settings.port, "timeout_graceful_shutdown": settings.shutdown_timeout,
               "http": protocol, **overrides}
    return uvicorn.Config(app, **options)


def serve(model: str | None = None, host: str | None = None, port: int | None = None, **settings) -> None:
    """Serve until SIGTERM or Ctrl-C, then drain and return.

    Arguments left as None come from the environment (``BART_OPT_*``) or the defaults; other
    keyword arguments are :class:`app.settings.Settings` fields (``api_key=...``,
    ``queue_size=...``). On SIGTERM uvicorn stops accepting connections, waits up to
    ``shutdown_timeout`` seconds for the requests in flight, the lifespan drains the worker,
    and this function returns, so the process exits 0.
    """
    given = {"model": model, "host": host, "port": port, **settings}
    config = Settings(**{key: value for key, value in given.items() if value is not None})
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    app_logger = logging.getLogger("app")
    app_logger.addHandler(handler)
    app_logger.setLevel(logging.INFO)
    # Uvicorn re-raises the signal that stopped it once it has shut down; with the default
    # handler SIGTERM would then kill the process (status 143) after a clean drain.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        uvicorn.Server(server_config(create_app(config), config, log_level="info")).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
