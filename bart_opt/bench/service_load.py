"""Load benchmark: concurrent clients against a real server, micro-batching on vs off, in one run.

``python -m bart_opt.bench.service_load`` builds the demo checkpoint (or takes ``--model``), then for each
mode starts ``bart-opt serve`` on a free loopback port, warms it up, and lets ``--clients``
asyncio clients send one-text ``POST /summarize`` requests back to back until ``--requests``
answers arrived or ``--seconds`` passed. It prints a markdown table (throughput, p50/p99
latency, requests per model call) and the on/off throughput ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``bart-opt serve`` in a subprocess on a free loopback port (a context manager).

    `settings` become ``BART_OPT_*`` environment variables. Entering waits for ``/ready``;
    :meth:`terminate` sends SIGTERM and returns the exit status; leaving kills what is left.
    """

    def __init__(
        self, model: str, log_path: str | Path, settings: dict | None = None, ready_timeout: float = 120
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.ready_timeout = ready_timeout
        self.command = [sys.executable, "-m", "bart_opt.cli", "serve", "--model", model, "--port", str(self.port)]
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.env.update({f"BART_OPT_{key.upper()}": str(value) for key, value in (settings or {}).items()})
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"server not ready after {self.ready_timeout} s:\n{self.log()}")

    def log(self) -> str:
        """What the server printed so far."""
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then wait for the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@dataclass
class LoadResult:
    """What one mode measured."""

    ok: int
    failed: int
    seconds: float
    latencies: list[float]
    requests_per_call: float

    @property
    def throughput(self) -> float:
        return self.ok / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def run_load(url: str, texts: list[str], clients: int, requests: int, seconds: float, generation: dict) -> tuple:
    """`clients` concurrent loops of POST /summarize; returns (latencies of 200s, failures, wall seconds)."""
    latencies: list[float] = []
    failed = 0
    sent = 0
    deadline = time.perf_counter() + seconds

    async def client_loop(http: httpx.AsyncClient) -> None:
        nonlocal sent, failed
        while sent < requests and time.perf_counter() < deadline:
            text = texts[sent % len(texts)]
            sent += 1
            start = time.perf_counter()
            response = await http.post(f"{url}/summarize", json={"texts": [text], "generation": generation})
            if response.status_code == 200:
                latencies.append(time.perf_counter() - start)
            else:
                failed += 1

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(http) for _ in range(clients)))
        return latencies, failed, time.perf_counter() - start


def batch_histogram(url: str) -> tuple[float, float]:
    """(requests, model calls) so far, from the server's ``bart_opt_batch_requests`` histogram."""
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    values = {s.name: s.value for s in families["bart_opt_batch_requests"].samples}
    return values["bart_opt_batch_requests_sum"], values["bart_opt_batch_requests_count"]


def measure_mode(
    model: str, micro_batch: bool, args: argparse.Namespace, texts: list[str], workdir: Path
) -> LoadResult:
    """Start a server with micro-batching on or off, warm it up, and run the measured load."""
    settings = {"micro_batch": micro_batch, "queue_size": max(64, 2 * args.clients), "max_batch_size": args.clients}
    if args.threads:
        settings["torch_threads"] = args.threads
    log = workdir / f"server-{'on' if micro_batch else 'off'}.log"
    with ServerProcess(model, log, settings) as server:
        asyncio.run(run_load(server.url, texts, args.clients, args.clients, 600, args.generation))  # warm-up
        requests_before, calls_before = batch_histogram(server.url)
        latencies, failed, seconds = asyncio.run(
            run_load(server.url, texts, args.clients, args.requests, args.seconds, args.generation)
        )
        requests_after, calls_after = batch_histogram(server.url)
        server.terminate()
    per_call = (requests_after - requests_before) / max(calls_after - calls_before, 1)
    return LoadResult(len(latencies), failed, seconds, latencies, per_call)


def table(results: dict[str, LoadResult]) -> str:
    """The markdown table of both modes."""
    lines = [
        "| micro-batching | answered | failed | seconds | throughput (req/s) | p50 latency (s) | p99 latency (s) "
        "| requests per model call |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r.ok} | {r.failed} | {r.seconds:.1f} | {r.throughput:.2f} | {r.percentile(50):.3f} "
            f"| {r.percentile(99):.3f} | {r.requests_per_call:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bart_opt.bench.service_load", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint folder (default: build the demo checkpoint)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=160, help="answers per mode at most")
    parser.add_argument("--seconds", type=float, default=60, help="seconds per mode at most")
    parser.add_argument("--sentences", type=int, default=4, help="sentences per demo article")
    parser.add_argument("--threads", type=int, help="BART_OPT_TORCH_THREADS for the server")
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=40)
    parser.add_argument("--min-length", type=int, default=8)
    args = parser.parse_args(argv)
    args.generation = {"num_beams": args.num_beams, "max_length": args.max_length, "min_length": args.min_length}
    from bart_opt.demo import build_checkpoint, random_article

    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        workdir = Path(tmp)
        model = args.model or str(build_checkpoint(workdir / "demo", init_std=0.2))
        rng = random.Random(0)
        texts = [random_article(rng, args.sentences) for _ in range(64)]
        results = {
            "on": measure_mode(model, True, args, texts, workdir),
            "off": measure_mode(model, False, args, texts, workdir),
        }
    print(f"model: {args.model or 'demo checkpoint (random weights)'}; {args.clients} clients; one text per request; "
          f"generation {args.generation}; torch threads: {args.threads or 'default'}\n")  # fmt: skip
    print(table(results))
    on, off = results["on"], results["off"]
    print(f"\nthroughput ratio on/off: {on.throughput / off.throughput:.2f}x; "
          f"p50 latency ratio off/on: {off.percentile(50) / on.percentile(50):.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
