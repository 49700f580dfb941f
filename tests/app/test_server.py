"""A real `bart-opt serve` process: ready, summarize, SIGTERM drains the request in flight, exit 0."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from bart_opt.bench.service_load import ServerProcess
from tests.app.helpers import FAST, articles, samples, value


def test_serve_summarize_then_sigterm_finishes_the_request_in_flight_and_exits_0(demo_checkpoint, direct, tmp_path):
    server = ServerProcess(demo_checkpoint, tmp_path / "server.log", {"torch_threads": 1})
    with server:
        text = articles(1, seed=30)
        quick = httpx.post(f"{server.url}/summarize", json={"texts": text, "generation": FAST}, timeout=60)
        assert quick.status_code == 200, server.log()
        assert quick.json()["summaries"] == direct.summarize(text, **FAST).summaries

        slow_body = {"texts": articles(32, seed=31, sentences=4), "generation": {"num_beams": 4, "max_length": 60}}
        answers: list[tuple[float, httpx.Response]] = []

        def send_slow() -> None:
            response = httpx.post(f"{server.url}/summarize", json=slow_body, timeout=120)
            answers.append((time.monotonic(), response))

        slow = threading.Thread(target=send_slow)
        slow.start()
        # In flight = this scrape plus the slow request.
        for _ in range(500):
            if value(samples(httpx.get(f"{server.url}/metrics").text), "bart_opt_requests_in_flight") >= 2:
                break
        else:
            raise AssertionError("the slow request never arrived")
        sigterm_at = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        refused = None
        for _ in range(100):
            try:
                httpx.get(f"{server.url}/health", timeout=1)
            except httpx.TransportError as error:
                refused = error
                break
            threading.Event().wait(0.05)
        slow.join(120)
        status = server.process.wait(60)
    assert refused is not None, "the server kept accepting connections after SIGTERM"
    assert answers, server.log()
    answered_at, answer = answers[0]
    assert answer.status_code == 200, server.log()
    assert answered_at > sigterm_at  # it was still in flight when SIGTERM came, and it was finished
    assert len(answer.json()["summaries"]) == 32
    assert status == 0, server.log()
