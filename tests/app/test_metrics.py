"""Metrics.latency_percentiles: percentiles estimated from the latency histogram's buckets."""

from __future__ import annotations

import pytest

from app.metrics import Metrics


def test_latency_percentiles_interpolate_inside_buckets_as_prometheus_does():
    metrics = Metrics()
    for seconds in [0.003] * 50 + [0.2] * 40 + [3.0] * 10:
        metrics.latency.labels(route="/summarize").observe(seconds)
    metrics.latency.labels(route="/slow").observe(500.0)  # past the last finite bucket (120 s)
    stats = metrics.latency_percentiles()
    # 50 of 100 fall in (0, 0.005]; ranks 50, 90, 99 end the 0.005 and 0.25 buckets and sit 9/10 into (2.5, 5].
    assert stats["/summarize"] == {"count": 100, "mean_s": pytest.approx(0.3815), "p50": pytest.approx(0.005),
                                   "p90": pytest.approx(0.25), "p99": pytest.approx(4.75)}  # fmt: skip
    assert stats["/slow"]["p50"] == 120.0 and stats["/slow"]["count"] == 1
    assert "/never" not in stats and metrics.snapshot("cpu")["latency"] == stats


def test_the_static_graphs_figures_are_scraped_and_in_the_json_memory():
    metrics = Metrics()
    assert metrics.snapshot("cuda")["memory"]["static_graphs"] is None
    assert b'bart_opt_static_graphs{figure="pool_bytes"} 0.0' in metrics.exposition()
    stats = {"graphs": 5, "captures": 7, "capture_s": 1.5, "pool_bytes": 2**20, "buffers_bytes": 3 * 2**20,
             "last_call": {"captures": 0}}
    metrics.track_graphs(lambda: stats)
    text = metrics.exposition()
    assert b'bart_opt_static_graphs{figure="graphs"} 5.0' in text
    assert b'bart_opt_static_graphs{figure="buffers_bytes"} 3.145728e+06' in text
    figures = metrics.snapshot("cuda")["memory"]["static_graphs"]
    assert figures == {k: stats[k] for k in ("graphs", "captures", "capture_s", "pool_bytes", "buffers_bytes")}
    from app.schemas import DeviceMemory

    DeviceMemory(device="cuda", allocated_bytes=0, peak_bytes=0, rss_bytes=0, weights_bytes=0, static_graphs=figures)
