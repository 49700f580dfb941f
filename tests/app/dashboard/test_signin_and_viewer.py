"""The dashboard signs in without the jobs database, shows an unknown job as its error alone, and
fetches every example by its id as one path segment."""

from __future__ import annotations

import json
from urllib.parse import quote

from app.main import create_app
from app.settings import Settings
from tests.app.dashboard.live import LiveServer, wait_for_jobs
from tests.app.helpers import FAST


def open_page(page, url: str, selector: str):
    page.goto(url)
    page.wait_for_selector(selector)
    return page


def test_sign_in_and_the_service_and_try_pages_work_while_the_jobs_database_is_down(demo_checkpoint, tmp_path, page):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # the jobs database's folder cannot be made: every job route answers 503
    settings = Settings(model=demo_checkpoint, api_key="secret", db=str(blocker / "jobs.db"), data_dir=str(tmp_path))
    with LiveServer(create_app(settings)) as live, live.client("secret") as client:
        assert client.get("/evaluate", params={"limit": 1}).status_code == 503
        open_page(page, f"{live.url}/#/service", "#login")
        page.get_by_label("API key").fill("secret")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_selector("#latency-table, #svc-state")
        assert page.locator("#svc-state").inner_text() == "ready"
        open_page(page, f"{live.url}/#/try", "#try-form")
        page.get_by_label("Text 1", exact=True).fill("Police said the city council voted on Monday.")
        for name, value in FAST.items():
            page.locator(f"#try-{name}").fill(str(value))
        page.get_by_role("button", name="Summarize").click()
        page.wait_for_selector("#try-result .summary")
        expected = client.post("/summarize", json={"texts": ["Police said the city council voted on Monday."],
                                                   "generation": FAST}).json()["summaries"]  # fmt: skip
        assert page.locator("#try-result .summary").all_text_contents() == expected
        assert page.evaluate("sessionStorage.length") == 1


def test_an_unknown_job_shows_its_error_and_nothing_to_act_on(site, page):
    page.goto(f"{site.url}/#/jobs/deadbeef")
    alert = page.locator("#main [role=alert]")
    alert.wait_for()
    assert "no evaluation job 'deadbeef'" in alert.inner_text()
    page.wait_for_timeout(300)
    for selector in ("#download-predictions", "#download-metrics", "#rouge-title", "#batch-title", "#example-viewer"):
        assert page.locator(selector).count() == 0, selector
    assert page.locator("h1").count() == 1 and page.locator("#banner .notice").count() == 0
    assert [error for error in page.errors if "status of 404" not in error] == []


def test_the_example_viewer_shows_each_example_whatever_its_id(site, page):
    ids = ["a/b", "x?y#z", "%2e%2e", "a b", "...", "é"]
    records = [{"id": record_id, "text": f"Story {i}: the council met and voted on the plan.",
                "reference": f"Vote {i}."} for i, record_id in enumerate(ids)]  # fmt: skip
    job = site.client.post("/evaluate", json={"dataset": {"records": records}, "generation": FAST}).json()
    (view,) = wait_for_jobs(site.client, [job["id"]])
    assert view["status"] == "succeeded"
    for record in records:
        open_page(page, f"{site.url}/#/jobs/{job['id']}?example={quote(record['id'], safe='')}", ".article")
        page.wait_for_function(f"document.getElementById('example-select').value === {json.dumps(record['id'])}")
        assert page.locator(".article").text_content() == record["text"], record["id"]
    assert page.errors == []
