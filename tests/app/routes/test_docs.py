"""The API docs: off by default; with BART_OPT_DOCS=true Swagger UI from shipped files, behind the key."""

from __future__ import annotations

import re

import pytest

from app.routes.dashboard import ASSETS as DASHBOARD_ASSETS
from app.routes.dashboard import DASHBOARD_DIR
from app.middleware import SECURITY_HEADERS
from app.routes.docs import ASSETS, DOCS_DIR
from tests.app.helpers import serving

AUTH = {"Authorization": "Bearer s3cret"}


def test_by_default_there_are_no_docs_pages_and_no_schema_route(make_app):
    with serving(make_app(api_key="s3cret")) as keyed, serving(make_app()) as open_app:
        for client in (keyed, open_app):
            for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect", "/docs/assets/swagger.js"):
                assert client.get(path, headers=AUTH).status_code == 404, path
        assert "/summarize" in open_app.app.openapi()["paths"]  # the document itself still exists, for tools


def test_with_docs_on_the_page_and_schema_need_the_key_and_only_shipped_files_are_served(make_app):
    with serving(make_app(api_key="s3cret", docs=True)) as client:
        for path in ("/docs", "/openapi.json"):
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401, path
        page = client.get("/docs", headers=AUTH)
        schema = client.get("/openapi.json", headers=AUTH)
        assert client.get("/redoc", headers=AUTH).status_code == 404  # ReDoc cannot render under this policy
        for name in ("../main.py", "redoc.standalone.js", "swagger.html", "favicon.png"):
            assert client.get(f"/docs/assets/{name}").status_code == 404, name
        assets = {name: client.get(f"/docs/assets/{name}") for name in ASSETS}
    assert page.status_code == 200 and page.text == (DOCS_DIR / "swagger.html").read_text()
    for header, value in SECURITY_HEADERS.items():
        assert page.headers[header] == value  # the dashboard's policy, unchanged
    assert schema.json() == client.app.openapi()
    referenced = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert referenced and all(url.startswith(("/docs/assets/", "/dashboard/")) for url in referenced), referenced
    assert {url.rsplit("/", 1)[1] for url in referenced if url.startswith("/docs/")} == set(ASSETS)
    for name, response in assets.items():
        assert response.status_code == 200 and response.headers["content-security-policy"], name
    assert not re.search(r"https?://", (DOCS_DIR / "swagger.js").read_text() + page.text)


def test_the_dashboard_links_to_no_docs_page():
    for path in [DASHBOARD_DIR / "index.html", *DASHBOARD_ASSETS.values()]:
        text = path.read_text()
        assert not re.search(r"""["'(]/(docs|redoc|openapi\.json)\b""", text), path.name


@pytest.fixture(scope="module")
def docs_server(demo_checkpoint, tmp_path_factory):
    from app.main import create_app
    from app.settings import Settings
    from tests.app.dashboard.live import LiveServer

    settings = Settings(model=demo_checkpoint, docs=True, db=str(tmp_path_factory.mktemp("docs") / "jobs.db"))
    with LiveServer(create_app(settings)) as live:
        yield live


def test_swagger_ui_renders_in_a_browser_under_the_policy_from_this_origin_only(docs_server):
    from tests.app.dashboard.live import browser_unavailable, launch_chromium

    reason = browser_unavailable()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page()
        errors, requests = [], []
        page.on("console", lambda message: message.type == "error" and errors.append(message.text))
        page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
        page.on("request", lambda request: requests.append(request.url))
        page.goto(f"{docs_server.url}/docs")
        page.wait_for_selector(".opblock-summary-path")
        paths = page.locator(".opblock-summary-path").all_inner_texts()
        page.wait_for_timeout(500)
        browser.close()
    assert {"/summarize", "/evaluate", "/auth", "/ready"} <= {p.replace("\u200b", "") for p in paths}
    assert errors == []
    assert requests and all(url.startswith(docs_server.url + "/") for url in requests), requests
