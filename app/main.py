"""The FastAPI application: ``create_app(settings)``, and ``app`` for ``uvicorn app.main:app``.

Nothing heavy happens at import: ``app`` is built from the environment's settings. The app's
lifespan builds the one :class:`app.device.engine.Engine` (the model, loaded on the device worker's
thread, and the worker) and the two services it is injected into. Shared objects live on
``app.state``: ``settings`` and ``metrics`` (:class:`app.metrics.Metrics`, extra series through
``metrics.gauge``) from the start; ``engine``, ``service``
(:class:`app.summarize.service.SummarizeService`) and ``jobs`` (:class:`app.jobs.JobService`,
the evaluation jobs, resumed when the app starts) while the lifespan runs.
Every router but health's and the dashboard's (a page and its scripts, no data) is included
with the API-key dependency; ``GET /auth`` checks the key and nothing else (the dashboard's
sign-in). The API docs (``/docs``, ``/openapi.json``) exist only with ``BART_OPT_DOCS=true``,
behind the key too (`app.routes.docs`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool

from app import startup
from app.errors import document_errors, install_error_handlers
from app.jobs import JobService
from app.metrics import Metrics
from app.hosts import AllowedHosts, HostCheckMiddleware
from app.middleware import (
    BodyLimitMiddleware, CatchAllMiddleware, RequestContextMiddleware, SecurityHeadersMiddleware, TimeLimitMiddleware,
)
from app.device.engine import Engine, SummarizerLoader, load_summarizer
from app.routes import auth, compare, dashboard, evaluate, examples, health, metrics, options, summarize
from app.security import require_api_key
from app.settings import Settings
from app.summarize.service import SummarizeService


def create_app(settings: Settings | None = None, *, load: SummarizerLoader = load_summarizer) -> FastAPI:
    """Build the service. `settings` default to the environment (``BART_OPT_*``); `load` builds the
    Summarizer from the settings on the device thread (tests wrap it to hold the model back)."""
    settings = settings or Settings()
    registry = Metrics(recent_logs=settings.recent_logs)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        startup.log_warnings(settings)
        engine = Engine(settings, registry, load)
        jobs = JobService(settings.jobs_config(), registry, engine)
        app.state.engine, app.state.service, app.state.jobs = engine, SummarizeService(settings, registry, engine), jobs
        engine.start()
        jobs.start()
        try:
            yield
        finally:
            # Uvicorn has already waited for the requests in flight; the job runner writes the
            # batch on the device and stops (its job resumes on the next start), then the worker
            # drains whatever is left.
            await run_in_threadpool(jobs.stop)
            await run_in_threadpool(engine.stop)

    app = FastAPI(
        title="bart-opt",
        summary="Summarization with a memory-optimized BART; per-request memory and timing reports.",
        version="0.1.0",
        lifespan=lifespan,
        # FastAPI's own pages load their scripts from a CDN; ours are app.routes.docs, when asked for.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.settings = settings
    app.state.metrics = registry
    install_error_handlers(app)
    # add_middleware wraps: the last one added is the outermost (order in app.middleware's docstring).
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(
        TimeLimitMiddleware, request_timeout=settings.request_timeout_s, body_timeout=settings.body_timeout_s
    )
    app.add_middleware(CatchAllMiddleware)
    hosts = AllowedHosts.from_settings(settings.allowed_hosts, settings.api_key is not None, settings.host)
    app.add_middleware(HostCheckMiddleware, hosts=hosts)
    app.add_middleware(RequestContextMiddleware, metrics=registry)
    app.add_middleware(SecurityHeadersMiddleware)
    protected = [Depends(require_api_key)]
    app.include_router(health.router)
    app.include_router(auth.router, dependencies=protected)
    app.include_router(summarize.router, dependencies=protected)
    app.include_router(metrics.router, dependencies=protected)
    app.include_router(evaluate.router, dependencies=protected)
    app.include_router(examples.router, dependencies=protected)
    app.include_router(compare.router, dependencies=protected)
    app.include_router(options.router, dependencies=protected)
    app.include_router(dashboard.router)
    if settings.docs:
        from app.routes import docs

        app.include_router(docs.pages, dependencies=protected)
        app.include_router(docs.assets)
    document_errors(app)
    return app


app = create_app()
