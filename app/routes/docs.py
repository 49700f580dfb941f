"""The API docs, only with ``BART_OPT_DOCS=true``: ``/openapi.json`` and ``/docs`` (Swagger UI).

Off by default. When on, both sit behind the API key when one is set (`app.main` includes this
router with the key dependency), and the page is served from files on this machine only, under
the dashboard's Content-Security-Policy: the page and its start script from ``app/docs/``, the
Swagger UI bundle from the ``fastapi-offline`` package (a pinned dependency). No CDN, no script
from anywhere else. The bundle and the start script (``/docs/assets/{name}``) hold no data and
are open, like the dashboard's files.

There is no ``/redoc``: ReDoc's bundle writes its styles as inline ``<style>`` text, which that
policy (``style-src 'self'``) refuses, and the page renders only its error screen.

A browser sends no bearer token when it opens a page, so with an API key set the page answers
401 in a browser: it is for services without a key (on a developer's machine); a client with
the key reads ``/openapi.json``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse

from app.routes.dashboard import FILE_HEADERS, shipped_file

DOCS_DIR = Path(__file__).resolve().parent.parent / "docs"
_VENDOR = Path(str(resources.files("fastapi_offline") / "static"))
# The files served, fixed at import: any other name is a 404, never a path lookup.
ASSETS = {
    **{name: _VENDOR / name for name in ("swagger-ui-bundle.js", "swagger-ui.css")},
    **{path.name: path for path in sorted(DOCS_DIR.glob("*.js"))},
}

pages = APIRouter(tags=["docs"], include_in_schema=False)
assets = APIRouter(tags=["docs"], include_in_schema=False)


@pages.get("/openapi.json")
async def openapi(request: Request) -> JSONResponse:
    """The OpenAPI document of this service."""
    app: FastAPI = request.app
    return JSONResponse(app.openapi())


@pages.get("/docs")
async def swagger() -> FileResponse:
    """Swagger UI on ``/openapi.json``."""
    return FileResponse(DOCS_DIR / "swagger.html", media_type="text/html", headers=FILE_HEADERS)


@assets.get("/docs/assets/{name}")
async def asset(name: str) -> FileResponse:
    """A script or style of the page."""
    return shipped_file(ASSETS, name, "docs")
