"""``GET /evaluate`` pages through every job with cursors (keyset pagination), on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import text

from tests.app.helpers import serving
from tests.app.jobs.helpers import backend, data_dir, make_jobs_app  # noqa: F401 - fixtures

N = 2500
INSERT = ("INSERT INTO jobs (id, request_hash, status, model, dataset, columns, generation, total, created_at)"
          " VALUES (:id, 'h', :status, 'demo', '{\"file\": \"x.jsonl\"}', '{}', '{}', 1, :created_at)")


def many_jobs(app) -> list[str]:
    """`N` jobs written straight into the app's database (every 10 share a timestamp); ids newest first."""
    jobs = [{"id": f"{i:032x}", "created_at": 1.7e9 + i // 10, "status": "failed" if i % 4 == 0 else "succeeded"}
            for i in range(N)]
    with app.state.jobs.store.engine.begin() as connection:
        connection.execute(text(INSERT), jobs)
    return [job["id"] for job in sorted(jobs, key=lambda job: (job["created_at"], job["id"]), reverse=True)]


def follow(client, url: str, way: str) -> tuple[list[str], list[int], dict]:
    """Every job id reached from `url` through ``links[way]`` (in the order shown), each page's size,
    and the last page."""
    ids, sizes = [], []
    while url is not None:
        page = client.get(url)
        assert page.status_code == 200, page.text
        body = page.json()
        ids.append([job["id"] for job in body["jobs"]])
        sizes.append(len(body["jobs"]))
        url = body["links"][way]
    pages = ids if way == "next" else ids[::-1]  # going back, each page comes before the one seen first
    return [job_id for page in pages for job_id in page], sizes, body


def test_following_next_reaches_every_one_of_2500_jobs_once_and_prev_comes_back(make_jobs_app, backend):
    app = make_jobs_app(db=backend.url)
    with serving(app) as client:
        newest_first = many_jobs(app)
        ids, sizes, last = follow(client, "/evaluate?limit=1000", "next")
        assert ids == newest_first and sizes == [1000, 1000, 500]  # each job once, newest first
        back, sizes, top = follow(client, last["links"]["prev"], "prev")  # from the oldest page up to the newest
        assert back == newest_first[:2000] and sizes == [1000, 1000] and top["links"]["prev"] is None
        failed, _, _ = follow(client, "/evaluate?status=failed&limit=300", "next")
        assert failed == [job_id for job_id in newest_first if int(job_id, 16) % 4 == 0]
        first = client.get("/evaluate?limit=3").json()
        assert first["links"]["prev"] is None and parse_qs(urlsplit(first["links"]["next"]).query)["limit"] == ["3"]


@pytest.mark.parametrize("query, field", [
    ("offset=100", "offset"),
    ("before=not-a-cursor", "before"),
    ("after=" + base64.urlsafe_b64encode(b'["x", 1]').decode(), "after"),
    ("before=" + base64.urlsafe_b64encode(b"[1e999, \"a\"]").decode(), "before"),
    ("before=" + "A" * 600, "before"),
    ("limit=1001", "limit"),
])
def test_an_offset_or_a_cursor_that_is_not_one_is_a_422_naming_it(make_jobs_app, query, field):
    with serving(make_jobs_app()) as client:
        response = client.get(f"/evaluate?{query}")
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field or field in error["message"], error
