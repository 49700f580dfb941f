"""Prometheus metrics and the bounded log of recent requests, one set per app instance.

Each :class:`Metrics` owns its own ``CollectorRegistry`` so that several apps (tests) never
share counters. Values that exist only at scrape time (queue length, RSS, device memory)
are gauges with callbacks. Other parts of the service add their own series with
:meth:`Metrics.gauge` (for example the evaluation jobs' running/queued gauges).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from bart_opt.engine.memory import rss_bytes

PREFIX = "bart_opt_"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_BYTES_BUCKETS = tuple(2.0**p for p in range(16, 36, 2))  # 64 KiB .. 16 GiB
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
GRAPH_FIGURES = ("graphs", "captures", "capture_s", "pool_bytes", "buffers_bytes")


class Metrics:
    """All series of one service instance, plus memory stats and recent request logs for JSON."""

    def __init__(self, recent_logs: int = 100) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}requests",
            "HTTP requests by route template, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.in_flight = Gauge(f"{PREFIX}requests_in_flight", "HTTP requests being handled now.", registry=r)
        self.latency = Histogram(
            f"{PREFIX}request_seconds",
            "HTTP request latency by route template.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.request_peak_memory = Histogram(
            f"{PREFIX}request_peak_memory_bytes",
            "Per-request device memory peak (the request's share of its model call).",
            buckets=_BYTES_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            f"{PREFIX}batch_requests", "Requests merged into one model call.", buckets=_BATCH_BUCKETS, registry=r
        )
        self.batch_texts = Histogram(
            f"{PREFIX}batch_texts", "Texts in one model call.", buckets=_BATCH_BUCKETS, registry=r
        )
        self.input_tokens = Counter(f"{PREFIX}input_tokens", "Input tokens summarized.", registry=r)
        self.output_tokens = Counter(f"{PREFIX}output_tokens", "Summary tokens generated.", registry=r)
        self.padding_avoided = Counter(
            f"{PREFIX}padding_avoided_tokens", "Pad positions the length-sorted batching did not compute.", registry=r
        )
        self.oom_splits = Counter(f"{PREFIX}oom_splits", "Batches halved after running out of memory.", registry=r)
        self.rejected = Counter(
            f"{PREFIX}rejected_requests", "Requests refused before queueing.", ["reason"], registry=r
        )
        self.cancelled = Counter(
            f"{PREFIX}cancelled_requests", "Requests whose work was cancelled: client gone or deadline passed.",
            registry=r,
        )
        self.queue_size = Gauge(f"{PREFIX}queue_size", "Work items waiting for the device.", ["kind"], registry=r)
        self.device_allocated = Gauge(
            f"{PREFIX}device_memory_allocated_bytes",
            "Device memory allocated now (CUDA allocator; on CPU the model's weights).",
            registry=r,
        )
        self.device_peak = Gauge(
            f"{PREFIX}device_memory_peak_bytes", "Largest device memory seen during a model call.", registry=r
        )
        self.rss = Gauge(f"{PREFIX}process_rss_bytes", "Resident set size of the server process.", registry=r)
        self.rss.set_function(rss_bytes)
        self.static_graphs = Gauge(
            f"{PREFIX}static_graphs",
            "The static search's CUDA graphs (bart_opt.engine.graphs.StepGraphs): graphs held, captures since the "
            "model loaded, capture seconds, their memory pool's bytes and the persistent buffers' bytes; 0 without graphs.",
            ["figure"],
            registry=r,
        )
        self._graphs: Callable[[], dict | None] = lambda: None
        for figure in GRAPH_FIGURES:
            gauge = self.static_graphs.labels(figure=figure)
            gauge.set_function(lambda figure=figure: (self._graphs() or {}).get(figure, 0))
        self._peak = 0
        self._lock = threading.Lock()
        self._recent: deque[dict] = deque(maxlen=recent_logs)
        self._allocated: Callable[[], float] = lambda: 0.0

    def gauge(self, name: str, documentation: str, labelnames: tuple[str, ...] = ()) -> Gauge:
        """Register an extra gauge ``bart_opt_<name>`` on this instance's registry."""
        return Gauge(f"{PREFIX}{name}", documentation, labelnames, registry=self.registry)

    def track_device(self, allocated: Callable[[], float]) -> None:
        """Read device memory allocated through `allocated` at every scrape."""
        self._allocated = allocated
        self.device_allocated.set_function(allocated)

    def track_graphs(self, stats: Callable[[], dict | None]) -> None:
        """Read the static search's graph figures (`Bart.graph_stats`, None without graphs) at every scrape."""
        self._graphs = stats

    def graph_figures(self) -> dict | None:
        """`GRAPH_FIGURES` of the tracked graphs, or None without graphs."""
        stats = self._graphs()
        return None if stats is None else {figure: stats[figure] for figure in GRAPH_FIGURES}

    def track_queue(self, kind: str, length: Callable[[], int]) -> None:
        """Read the length of queue `kind` through `length` at every scrape."""
        self.queue_size.labels(kind=kind).set_function(length)

    def observe_peak(self, absolute_bytes: int) -> None:
        """Fold one model call's absolute device peak into the peak gauge."""
        with self._lock:
            if absolute_bytes > self._peak:
                self._peak = absolute_bytes
                self.device_peak.set(absolute_bytes)

    def record_request(self, log: dict) -> None:
        """Keep `log` (one request's memory/timing report) among the recent ones."""
        with self._lock:
            self._recent.append(log)

    def exposition(self) -> bytes:
        """Prometheus text format of every series."""
        return generate_latest(self.registry)

    def snapshot(self, device: str) -> dict:
        """Memory stats, requests in flight, latency percentiles per route and the recent request
        logs (oldest first), for ``GET /metrics?format=json``."""
        with self._lock:
            recent = list(self._recent)
            peak = self._peak
        return {
            "memory": {
                "device": device,
                "allocated_bytes": int(self._allocated()),
                "peak_bytes": peak,
                "rss_bytes": rss_bytes(),
                "static_graphs": self.graph_figures(),
            },
            "requests": {"in_flight": int(self.registry.get_sample_value(f"{PREFIX}requests_in_flight") or 0)},
            "latency": self.latency_percentiles(),
            "recent": recent,
        }

    def latency_percentiles(self, quantiles: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, dict]:
        """Per route: ``{"count", "mean_s", "p50", "p90", "p99"}`` from the request-latency histogram.

        Percentiles are estimated from the buckets as Prometheus' ``histogram_quantile`` does
        (linear inside the bucket that holds the rank); one in the ``+Inf`` bucket reads as the
        largest finite bound. Routes with no request yet are left out.
        """
        buckets: dict[str, list[tuple[float, float]]] = {}
        sums: dict[str, float] = {}
        for family in self.latency.collect():
            for sample in family.samples:
                route = sample.labels.get("route", "")
                if sample.name.endswith("_bucket"):
                    buckets.setdefault(route, []).append((float(sample.labels["le"]), sample.value))
                elif sample.name.endswith("_sum"):
                    sums[route] = sample.value
        result = {}
        for route, cumulative in sorted(buckets.items()):
            cumulative.sort()
            count = cumulative[-1][1]  # the +Inf bucket holds every observation
            if count:
                percentiles = {f"p{round(q * 100)}": _bucket_quantile(q, cumulative) for q in quantiles}
                result[route] = {"count": int(count), "mean_s": sums.get(route, 0.0) / count, **percentiles}
        return result


def _bucket_quantile(q: float, cumulative: list[tuple[float, float]]) -> float:
    """The `q` quantile of a histogram given as sorted ``(upper bound, cumulative count)`` pairs."""
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in cumulative:
        if count >= rank and count > below:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower
