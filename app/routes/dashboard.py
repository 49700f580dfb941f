"""The web dashboard: ``GET /`` (the page) and ``GET /dashboard/{file}`` (its scripts and styles).

Everything the page needs ships in ``app/dashboard/``; nothing is fetched from anywhere else
(the Content-Security-Policy on every answer says so to the browser too). The page and its files hold no data
and are served without the API key: the page asks for the key when the API answers 401, keeps
it in the tab's ``sessionStorage`` and sends it as ``Authorization: Bearer`` on every API call.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from app.errors import ApiError

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
# The files served, fixed at import: a name that is not one of them is a 404, never a path lookup.
ASSETS = {path.name: path for path in sorted(DASHBOARD_DIR.iterdir()) if path.suffix in MEDIA_TYPES}
# The page and its files hold no data: a browser may keep them, asking each time whether they changed.
# The security headers (CSP, nosniff, frame-ancestors) are on every answer (`app.middleware.SecurityHeadersMiddleware`).
FILE_HEADERS = {"Cache-Control": "no-cache"}

router = APIRouter(tags=["dashboard"], include_in_schema=False)


@router.get("/")
async def page() -> FileResponse:
    """The dashboard's single page (no data in it: the data comes from the API)."""
    return FileResponse(DASHBOARD_DIR / "index.html", media_type="text/html", headers=FILE_HEADERS)


@router.get("/dashboard/{name}")
async def asset(name: str) -> FileResponse:
    """One of the page's scripts, styles or images."""
    return shipped_file(ASSETS, name, "dashboard")


def shipped_file(files: Mapping[str, Path], name: str, what: str) -> FileResponse:
    """The file `name` of the fixed table `files` (a 404 for any other name), cacheable as the page is."""
    path = files.get(name)
    if path is None:
        raise ApiError(404, "not_found", f"no {what} file {name!r}")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=FILE_HEADERS)
