"""Screenshots of every dashboard page, for docs/service.md: ``python3 -m tests.app.dashboard.screenshots OUT_DIR``.

Builds the demo checkpoint and its sample records in a temporary folder, serves the app on them,
runs two finished jobs (greedy with summaries cut at 48 tokens, and 4 beams) and a longer one that is still running, sends one
``/summarize``, and saves ``jobs.png``, ``job.png``, ``compare.png``, ``try.png``, ``service.png``
and ``login.png`` (a second server with an API key) into OUT_DIR. Fails on any console error.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from bart_opt.demo import write_demo_model, write_sample_records  # noqa: E402
from tests.app.dashboard.live import LiveServer, launch_chromium, wait_for_jobs  # noqa: E402

VIEWPORT = {"width": 1280, "height": 860}
SHORT = {"max_length": 20, "min_length": 4}


def _page(browser, errors: list[str]):
    page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    return page


def take(out: Path, work: Path) -> list[Path]:
    """Run the scenario and write the PNGs into `out`; returns their paths."""
    from playwright.sync_api import sync_playwright

    checkpoint = write_demo_model(work / "demo")
    data = work / "data"
    write_sample_records(data / "sample.jsonl", n=24)
    write_sample_records(data / "long.jsonl", n=400, seed=1)
    story = json.loads((data / "sample.jsonl").read_text(encoding="utf-8").splitlines()[0])
    settings = {"model": str(checkpoint), "data_dir": str(data), "max_batch_size": 4, "torch_threads": 1}
    out.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    shots = []
    with LiveServer(create_app(Settings(db=str(work / "jobs.db"), **settings))) as live, live.client() as client:
        finished = [client.post("/evaluate", json={"dataset": {"file": "sample.jsonl"}, "baselines": ["lead-3"],
                                                   "generation": generation}).json()["id"]
                    for generation in ({"num_beams": 1, "max_length": 48}, {"num_beams": 4})]  # fmt: skip
        wait_for_jobs(client, finished)
        client.post("/summarize", json={"texts": ["Police said the city council voted on Monday."],
                                        "references": ["The council voted."], "generation": SHORT})  # fmt: skip
        client.post("/evaluate", json={"dataset": {"file": "long.jsonl"}, "generation": {**SHORT, "num_beams": 2}})
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            page = _page(browser, errors)
            page.goto(f"{live.url}/#/jobs")
            page.wait_for_selector("tr[data-status=running] .progress[data-done]:not([data-done='0'])")
            shots.append(_shot(page, out / "jobs.png"))
            page.goto(f"{live.url}/#/jobs/{finished[1]}")
            page.wait_for_selector("#rouge-table [data-value]")
            page.wait_for_selector("#example-prediction")
            shots.append(_shot(page, out / "job.png"))
            page.goto(f"{live.url}/#/compare?jobs={finished[0]},{finished[1]}")
            page.wait_for_selector("#significance-0")
            page.locator("#compare-result details").first.locator("summary").click()
            shots.append(_shot(page, out / "compare.png"))
            page.goto(f"{live.url}/#/try")
            page.fill("#try-num_beams", "2")
            page.locator(".try-text").first.fill(story["article"])
            page.locator(".try-reference").first.fill(story["highlights"])
            page.get_by_role("button", name="Summarize").click()
            page.wait_for_selector("#try-result .summary")
            shots.append(_shot(page, out / "try.png"))
            page.goto(f"{live.url}/#/service")
            page.wait_for_selector("#latency-table")
            shots.append(_shot(page, out / "service.png"))
            browser.close()
    with LiveServer(create_app(Settings(db=str(work / "keyed.db"), api_key="secret", **settings))) as live:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            page = _page(browser, [])  # the first API call is a 401 by design
            page.goto(live.url)
            page.wait_for_selector("#login")
            shots.append(_shot(page, out / "login.png", full_page=False))
            browser.close()
    if errors:
        raise RuntimeError("console errors:\n" + "\n".join(errors))
    return shots


def _shot(page, path: Path, full_page: bool = True) -> Path:
    page.wait_for_timeout(300)  # let the last poll's charts settle
    page.screenshot(path=str(path), full_page=full_page)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the PNGs (docs/service.md uses app/dashboard/screenshots)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bart_opt_shots_") as work:
        shots = take(args.out, Path(work))
    print(json.dumps([str(path) for path in shots], indent=2))


if __name__ == "__main__":
    main()
