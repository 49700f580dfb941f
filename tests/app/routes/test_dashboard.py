"""GET / and /dashboard/{file}: the page and its files, open without the key, holding no data, nothing external."""

from __future__ import annotations

import re

from app.routes.dashboard import ASSETS, DASHBOARD_DIR
from tests.app.helpers import serving

_IMPORT = re.compile(r"""from\s+"(\./[^"]+)"|import\s+"(\./[^"]+)\"""")
_URL = re.compile(r"https?://[^\s\"')]+")


def test_the_page_and_every_file_it_loads_are_served_with_a_strict_policy(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.content == (DASHBOARD_DIR / "index.html").read_bytes()
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    referenced = set(re.findall(r'(?:src|href)="/dashboard/([^"]+)"', page.text))
    for path in DASHBOARD_DIR.glob("*.js"):
        referenced |= {name.removeprefix("./") for pair in _IMPORT.findall(path.read_text()) for name in pair if name}
    assert {"main.js", "style.css", "icon.svg", "api.js", "charts.js", "job.js"} <= referenced
    for name in sorted(referenced):
        response = client.get(f"/dashboard/{name}")
        assert response.status_code == 200, name
        expected = {"js": "text/javascript", "css": "text/css", "svg": "image/svg+xml"}[name.rsplit(".", 1)[1]]
        assert response.headers["content-type"].startswith(expected), name


def test_nothing_is_fetched_from_elsewhere():
    for path in [DASHBOARD_DIR / "index.html", *ASSETS.values()]:
        urls = [url for url in _URL.findall(path.read_text()) if url != "http://www.w3.org/2000/svg"]
        assert urls == [], f"{path.name} points outside the app: {urls}"


def test_only_the_shipped_files_are_served(client):
    for name in ("nope.js", "..%2Fmain.py", "screenshots", "index.html"):
        response = client.get(f"/dashboard/{name}")
        assert response.status_code == 404, name
        assert set(response.json()["error"]) >= {"code", "message"}


def test_with_an_api_key_the_page_opens_but_the_data_does_not(make_app):
    with serving(make_app(api_key="secret")) as client:
        page, script = client.get("/"), client.get("/dashboard/main.js")
        data = [client.get(path) for path in ("/evaluate", "/metrics?format=json", "/compare?jobs=a,b")]
    assert page.status_code == script.status_code == 200
    assert [response.status_code for response in data] == [401, 401, 401]
