"""The dashboard in a real headless Chromium, against a live server on the demo model.

Every number the page shows is checked against what the API answers for the same thing.
"""

from __future__ import annotations

import json
import re

import pytest

from app.device.worker import State
from bart_opt.pipeline.rouge import DEFAULT_ROUGE_TYPES
from tests.app.dashboard.live import wait_for_jobs
from tests.app.helpers import FAST
from tests.app.jobs.helpers import Stepper

PAGES = [
    ("#/jobs", "#jobs-table tbody tr[data-status=succeeded]"),
    ("#/jobs/{b}", "#rouge-table [data-value]"),
    ("#/compare?jobs={a},{b}", "#significance-0"),
    ("#/try", "#try-form"),
    ("#/service", "#latency-table"),
]


def open_page(page, url: str, selector: str):
    page.goto(url)
    page.wait_for_selector(selector)
    return page


@pytest.mark.parametrize(("path", "selector"), PAGES, ids=[p for p, _ in PAGES])
def test_each_page_loads_without_console_errors(site, page, path, selector):
    a, b = site.jobs
    open_page(page, f"{site.url}/{path.format(a=a, b=b)}", selector)
    page.wait_for_function("document.getElementById('main').getAttribute('aria-busy') === 'false'")
    page.wait_for_timeout(500)  # a poll or two more
    assert page.errors == []
    assert page.locator("h1").count() == 1 and page.locator("#banner .notice").count() == 0


def test_a_finished_jobs_rouge_equals_the_api(site, page):
    job_id = site.jobs[1]
    view = site.client.get(f"/evaluate/{job_id}").json()
    rows = site.client.get(f"/evaluate/{job_id}/predictions").text
    open_page(page, f"{site.url}/#/jobs/{job_id}", "#rouge-table [data-value]")
    for rouge_type in DEFAULT_ROUGE_TYPES:
        for part, measure in [("mid", "precision"), ("mid", "recall"), ("mid", "fmeasure"), ("low", "fmeasure"),
                              ("high", "fmeasure")]:  # fmt: skip
            cell = page.locator(f'#rouge-table [data-type="{rouge_type}"][data-field="{part}.{measure}"]')
            expected = view["rouge"][rouge_type][part][measure]
            assert float(cell.get_attribute("data-value")) == expected
            assert cell.inner_text() == f"{expected:.2f}"
    stored = [json.loads(line) for line in rows.splitlines()]
    assert page.locator("#example-prediction").text_content() == stored[0]["prediction"]
    page.get_by_role("button", name="Next").click()
    page.wait_for_function(f"document.getElementById('example-select').value === {json.dumps(stored[1]['id'])}")
    page.wait_for_selector("#example-prediction")
    assert page.locator("#example-prediction").text_content() == stored[1]["prediction"]
    with page.expect_download() as download:
        page.get_by_role("button", name="Download predictions (JSONL)").click()
    assert open(download.value.path(), encoding="utf-8").read() == rows
    with page.expect_download() as download:
        page.get_by_role("button", name="Download metrics (JSON)").click()
    assert json.loads(open(download.value.path(), encoding="utf-8").read()) == view
    article = site.client.get(f"/evaluate/{job_id}/examples/{stored[3]['id']}").json()["text"]
    open_page(page, f"{site.url}/#/jobs/{job_id}?example={stored[3]['id']}", ".article")
    assert page.locator(".article").text_content() == article
    assert page.locator("#example-prediction").text_content() == stored[3]["prediction"]
    open_page(page, f"{site.url}/#/jobs", f'tr[data-job="{job_id}"] dd[data-type="rougeLsum"]')
    listed = page.locator(f'tr[data-job="{job_id}"] dd[data-type="rougeLsum"]')
    assert float(listed.get_attribute("data-value")) == view["rouge"]["rougeLsum"]["mid"]["fmeasure"]


def test_a_finished_jobs_other_metrics_equal_the_api(site, page):
    job_id = site.jobs[1]
    view = site.client.get(f"/evaluate/{job_id}").json()
    open_page(page, f"{site.url}/#/jobs/{job_id}", "#scores-table [data-value]")
    others = [name for name in view["metrics"] if name != "rouge"]
    assert others == ["extractive", "length"]  # the server's default metrics, read from the view
    for name in others:
        for score, interval in view["scores"][name].items():
            cell = page.locator(f'#scores-table [data-metric="{name}"][data-score="{score}"]').first
            assert float(cell.get_attribute("data-value")) == interval["mid"]


def test_the_compare_views_p_values_equal_the_api(site, page):
    a, b = site.jobs
    result = site.client.get("/compare", params={"jobs": f"{a},{b}", "metric": "rougeLsum"}).json()
    open_page(page, f"{site.url}/#/compare", "#compare-form")
    page.get_by_label(re.compile(f"^{a[:8]}")).check()
    page.get_by_label(re.compile(f"^{b[:8]}")).check()
    page.get_by_role("button", name="Compare selected jobs").click()
    page.wait_for_selector("#significance-0")
    assert f"jobs={a},{b}" in page.url
    stats = result["comparisons"][0]["rouge"]
    for rouge_type in DEFAULT_ROUGE_TYPES:
        for test in ("bootstrap", "randomization"):
            cell = page.locator(f'#significance-0 [data-type="{rouge_type}"][data-test="{test}"]')
            assert float(cell.get_attribute("data-value")) == stats[rouge_type][f"p_{test}"]
            assert cell.inner_text() == f"{stats[rouge_type][f'p_{test}']:.4f}"
        delta = page.locator(f'#significance-0 [data-type="{rouge_type}"][data-field="delta"]')
        assert float(delta.get_attribute("data-value")) == stats[rouge_type]["delta"]
    side = page.locator('#compare-rouge tbody tr').nth(1).locator('[data-type="rouge1"]')
    assert float(side.get_attribute("data-value")) == result["runs"][1]["rouge"]["rouge1"]
    assert page.errors == []


def test_try_it_returns_the_summaries_of_the_api(site, page):
    open_page(page, f"{site.url}/#/try", "#try-form")
    texts = ["Police said the city council voted on Monday.", "The team lost at home on Friday."]
    page.get_by_label("Text 1", exact=True).fill(texts[0])
    page.get_by_label("Reference 1 (optional)").fill("The council voted.")
    page.get_by_role("button", name="Add another text").click()
    page.get_by_label("Text 2", exact=True).fill(texts[1])
    page.locator("#try-num_beams").fill(str(FAST["num_beams"]))
    page.locator("#try-max_length").fill(str(FAST["max_length"]))
    page.locator("#try-min_length").fill(str(FAST["min_length"]))
    page.get_by_role("button", name="Summarize").click()  # a reference for one text only: refused, at the field
    page.get_by_role("alert").wait_for()
    assert "references[1]: reference is empty" in page.get_by_role("alert").inner_text()
    assert page.evaluate("document.activeElement.name") == "references[1]"
    page.get_by_label("Reference 2 (optional)").fill("The team lost.")
    page.get_by_role("button", name="Summarize").click()
    page.wait_for_selector("#try-result .summary")
    api = site.client.post("/summarize", json={"texts": texts, "references": ["The council voted.", "The team lost."],
                                               "generation": FAST}).json()  # fmt: skip
    assert page.locator("#try-result .summary").all_text_contents() == api["summaries"]
    # Phase seconds, phase peaks, request timing; then memory and seconds at each decoder step.
    assert page.locator("#try-result figure").count() == 5
    assert page.locator("#try-result figure").first.locator("rect").count() == len(api["memory"]["phases"])
    steps = api["memory"]["rows"]
    assert len(steps) >= 2 and all(row["mem_bytes"] >= 0 for row in steps)
    line = page.locator("#try-steps figure").first.locator("polyline").get_attribute("points")
    assert len(line.split()) == len(steps)  # one point per decoder step

    page.locator("#try-num_beams").fill("99")
    page.get_by_role("button", name="Summarize").click()
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "num_beams" in alert.inner_text()
    assert page.evaluate("document.activeElement.id") == "try-num_beams"
    assert page.locator("#try-num_beams").get_attribute("aria-invalid") == "true"


def test_the_new_job_form_starts_jobs_and_shows_refusals(site, page):
    open_page(page, f"{site.url}/#/jobs", "#new-job")
    page.get_by_label("File name").fill("../outside.jsonl")
    page.get_by_role("button", name="Start job").click()
    alert = page.locator("#new-job [role=alert]")
    alert.wait_for()
    assert "contains '..'" in alert.inner_text()
    assert page.evaluate("document.activeElement.name") == "dataset.file"

    page.get_by_label("Inline records").check()
    page.get_by_label("Records", exact=True).fill('{"id": "r1", "text": "The city voted.", "reference": "A vote."}\n'
                                      '{"id": "r2", "text": "The team lost.", "reference": "A loss."}')
    page.locator("#job-max_length").fill("8")
    page.get_by_role("button", name="Start job").click()
    link = page.locator("#new-job [role=status] a")
    link.wait_for()
    job_id = link.get_attribute("href").rsplit("/", 1)[1]
    page.wait_for_selector(f'tr[data-job="{job_id}"][data-status=succeeded]', timeout=60_000)
    view = site.client.get(f"/evaluate/{job_id}").json()
    assert view["dataset"] == {"records": 2} and view["generation"]["max_length"] == 8
    assert [error for error in page.errors if "status of 422" not in error] == []  # the refusal above


def test_a_running_jobs_progress_advances_and_it_can_be_cancelled(make_server, page):
    stepper = Stepper()
    with make_server(load=stepper.loader()) as live, live.client() as client:
        try:
            job = client.post("/evaluate", json={"dataset": {"file": "cnn.jsonl"}, "generation": FAST}).json()
            stepper.wait_arrived(1)  # the first of 3 batches of 2 waits on the device
            bar = f'tr[data-job="{job["id"]}"] .progress'
            open_page(page, f"{live.url}/#/jobs", f'tr[data-job="{job["id"]}"][data-status=running]')
            assert page.locator(bar).get_attribute("data-done") == "0"
            for done in (2, 4):
                stepper.allow(1)
                page.wait_for_selector(f'{bar}[data-done="{done}"]')
                assert f"{done} / 6 done" in page.locator(f'tr[data-job="{job["id"]}"] .progress-text').inner_text()
                assert page.locator(bar).get_attribute("aria-valuenow") == str(done)
            stepper.wait_arrived(3)
            page.get_by_role("button", name=f"Cancel job {job['id'][:8]}").click()
            page.wait_for_selector(f'tr[data-job="{job["id"]}"][data-status=cancelled]')
            assert client.get(f"/evaluate/{job['id']}").json()["status"] == "cancelled"
            assert page.errors == []
        finally:
            stepper.allow(10)


def test_with_an_api_key_nothing_leaks_before_login(make_server, page):
    with make_server(api_key="secret") as live, live.client("secret") as client:
        job = client.post("/evaluate", json={"dataset": {"records": [{"id": "a", "text": "The city voted.",
                                                                      "reference": "A vote."}]},
                                             "generation": FAST}).json()  # fmt: skip
        wait_for_jobs(client, [job["id"]])
        model = live.app.state.settings.model
        answers = []
        page.on("response", lambda response: answers.append((response.url, response.status)))
        for path in (f"/#/jobs/{job['id']}", "/#/service", f"/#/compare?jobs={job['id']},x", "/#/try", "/"):
            page.goto("about:blank")
            open_page(page, f"{live.url}{path}", "#login")
            page.wait_for_timeout(300)
            shown = page.content()
            assert job["id"] not in shown and job["id"][:8] not in shown and model not in shown
            assert "succeeded" not in shown
        api_answers = [(url, status) for url, status in answers
                       if url.startswith(live.url) and "/dashboard/" not in url and url != f"{live.url}/"]
        assert api_answers and all(status == 401 for _, status in api_answers), api_answers
        assert page.evaluate("sessionStorage.length") == 0

        page.get_by_label("API key").fill("wrong")
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("alert").wait_for()
        assert "refused" in page.get_by_role("alert").inner_text()
        page.get_by_label("API key").fill("secret")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_selector(f'tr[data-job="{job["id"]}"]')
        page.reload()
        page.wait_for_selector(f'tr[data-job="{job["id"]}"]')  # the key outlives a reload of the tab
        page.get_by_role("button", name="Forget API key").click()
        page.wait_for_selector("#login")
        assert page.evaluate("sessionStorage.length") == 0 and job["id"] not in page.content()
        refused = [text for text in page.errors if "status of 401" not in text]
        assert refused == []


def test_the_pages_work_from_the_keyboard(site, page):
    open_page(page, f"{site.url}/", "#jobs-table")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"
    page.locator("header .brand").click()  # Tab goes on from here
    order = []
    for _ in range(4):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.textContent"))
    assert order == ["Jobs", "Compare", "Try it", "Service"]
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Enter")
    page.wait_for_selector("#try-form")
    assert page.evaluate("document.activeElement.tagName + ' ' + document.activeElement.textContent") == "H1 Try the model"
    for path, selector in [("#/try", "#try-form"), ("#/jobs", "#new-job"), (f"#/jobs/{site.jobs[0]}", "#example-select"),
                           ("#/compare", "#compare-form")]:  # fmt: skip
        open_page(page, f"{site.url}/{path}", selector)
        unlabelled = page.evaluate("""[...document.querySelectorAll('input, select, textarea')]
            .filter((el) => el.labels.length === 0).map((el) => el.outerHTML)""")
        nameless = page.evaluate("""[...document.querySelectorAll('button, a')]
            .filter((el) => !el.textContent.trim()).map((el) => el.outerHTML)""")
        assert unlabelled == [] and nameless == [], path


def test_the_service_view_shows_the_metrics_json(site, page):
    open_page(page, f"{site.url}/#/service", "#latency-table")
    snapshot = site.client.get("/metrics", params={"format": "json"}).json()
    assert page.locator("#svc-state").inner_text() == State.READY.value
    assert page.locator("#svc-device").inner_text() == snapshot["memory"]["device"]
    weights = snapshot["memory"]["weights_bytes"]
    assert page.locator("#svc-weights").inner_text() == f"{weights / 1024:.1f} KiB"
    routes = page.locator("#latency-table tbody tr td:first-child").all_inner_texts()
    assert "/evaluate" in routes and set(routes) <= set(snapshot["latency"]) | {"/metrics"}


def test_the_jobs_page_and_the_compare_picker_reach_the_oldest_of_450_jobs(make_server, page):
    from sqlalchemy import text

    with make_server() as live:
        ids = [f"{i:032x}" for i in range(450)]  # oldest first
        with live.app.state.jobs.store.engine.begin() as connection:
            connection.execute(text(
                "INSERT INTO jobs (id, request_hash, status, model, dataset, columns, generation, total, done,"
                " created_at) VALUES (:id, 'h', 'succeeded', 'demo', '{\"file\": \"x.jsonl\"}', '{}', '{}', 1, 1, :at)"
            ), [{"id": job_id, "at": 1.7e9 + i} for i, job_id in enumerate(ids)])
        open_page(page, f"{live.url}/#/jobs", f'tr[data-job="{ids[-1]}"]')
        assert page.locator("#jobs-table tbody tr").count() == 200 and page.locator("#jobs-newer").is_disabled()
        page.locator("#jobs-older").click()
        page.wait_for_selector(f'tr[data-job="{ids[249]}"]')
        page.locator("#jobs-older").click()
        page.wait_for_selector(f'tr[data-job="{ids[0]}"]')  # the oldest job, on the third page
        assert page.locator("#jobs-table tbody tr").count() == 50 and page.locator("#jobs-older").is_disabled()
        page.locator("#jobs-newest").click()
        page.wait_for_selector(f'tr[data-job="{ids[-1]}"]')

        open_page(page, f"{live.url}/#/compare", f"#pick-{ids[-1]}")
        assert page.locator("#compare-form input[type=checkbox]").count() == 200
        page.locator(f"#pick-{ids[-1]}").check()
        page.locator("#compare-add-id").fill(ids[0])  # the oldest, found by its id
        page.locator("#compare-add").click()
        page.wait_for_selector(f"#pick-{ids[0]}:checked")
        for last in (50, 1):  # the oldest of the second page, then of the third
            page.locator("#compare-older").click()
            page.wait_for_selector(f"#pick-{ids[last]}")
        assert page.locator("#compare-form input[type=checkbox]").count() == 450  # each job once
        assert page.locator(f"#pick-{ids[-1]}").is_checked()  # a pick survives loading older jobs
        assert page.locator("#compare-order").inner_text().startswith(ids[-1][:8])
        assert page.locator("#compare-older").is_hidden()
        assert page.errors == []
