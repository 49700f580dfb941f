"""Benchmark: the jobs store under load, SQLite against PostgreSQL with 1 and 3 replicas, side by side in one run.

``python -m bart_opt.bench.service_jobs --stores`` (or ``python -m bart_opt.bench.service_replicas``)
builds the demo checkpoint (or takes ``--model``), starts a throwaway PostgreSQL cluster
(`bart_opt.bench.postgres.TempCluster`, or uses ``--pg-url``), and for each arm

- ``sqlite x1``: one ``bart-opt serve`` on a SQLite file,
- ``postgresql x1`` / ``x3``: one or three ``bart-opt serve`` on one fresh PostgreSQL database,

sends ``--jobs`` small jobs (``--records`` inline records each, tiny generation settings so the
store's work shows beside the model's) from ``--clients`` concurrent clients, round-robin over
the arm's replicas, then waits until every job succeeded. It reports **jobs/s accepted**
(jobs over the time from the first ``POST /evaluate`` to the last 202) and **examples/s
written** (examples over the time from the first submission to the last job's end), the best
of ``--repeats`` interleaved runs of each arm, with the ratio to ``sqlite x1``. Every arm
checks that each job has exactly its records' rows.

    python -m bart_opt.bench.service_jobs --stores --jobs 60 --records 4 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import httpx

from bart_opt.bench.service_load import ServerProcess

ARMS = (("sqlite", 1), ("postgresql", 1), ("postgresql", 3))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.service_replicas", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=60, help="jobs per arm (default 60)")
    p.add_argument("--records", type=int, default=4, help="inline records per job (default 4)")
    p.add_argument("--clients", type=int, default=6, help="concurrent submitting clients (default 6)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved runs of each arm; the best is kept")
    p.add_argument("--model", help="a checkpoint folder (default: the demo checkpoint, built here)")
    p.add_argument("--pg-url", help="an existing PostgreSQL server's database to use (its jobs are deleted)")
    p.add_argument("--json", dest="json_path", help="write the results here")
    return p.parse_args(argv)


def job_body(k: int, records: int) -> dict:
    from bart_opt.demo import random_article, random_sentence

    import random

    rng = random.Random(k)
    rows = [{"id": f"j{k}-r{i}", "text": random_article(rng, 2), "reference": random_sentence(rng)}
            for i in range(records)]
    return {"dataset": {"records": rows}, "generation": {"num_beams": 1, "max_length": 4, "min_length": 1}}


def run_arm(model: str, db: str, replicas: int, args: argparse.Namespace, root: Path) -> dict:
    """One arm: `replicas` servers on `db`; accepted jobs/s and written examples/s."""
    settings = {"db": db, "torch_threads": 1, "max_batch_size": args.records, "job_lease_s": 10,
                "dataset_loaders": args.clients}  # no 429: every client may be loading at once
    bodies = [job_body(k, args.records) for k in range(args.jobs)]
    with ExitStack() as stack:
        servers = [stack.enter_context(ServerProcess(model, root / f"serve-{replicas}-{i}.log", settings))
                   for i in range(replicas)]
        started = time.perf_counter()
        with httpx.Client(timeout=120) as http, ThreadPoolExecutor(args.clients) as pool:
            answers = list(pool.map(lambda k: http.post(f"{servers[k % replicas].url}/evaluate", json=bodies[k]),
                                    range(args.jobs)))
            accepted = time.perf_counter() - started
            if any(answer.status_code != 202 for answer in answers):
                raise RuntimeError(f"refused: {[a.text for a in answers if a.status_code != 202][:3]}")
            ids = [answer.json()["id"] for answer in answers]
            views = []
            for k, job_id in enumerate(ids):
                while (view := http.get(f"{servers[k % replicas].url}/evaluate/{job_id}").json())["status"] in (
                        "queued", "running"):
                    time.sleep(0.2)
                views.append(view)
            bad = [view["status"] for view in views if view["status"] != "succeeded"]
            rows = [http.get(f"{servers[0].url}/evaluate/{job_id}/predictions").text.splitlines() for job_id in ids]
    if bad:
        raise RuntimeError(f"jobs ended {bad[:3]}")
    for k, lines in enumerate(rows):
        if [json.loads(line)["id"] for line in lines] != [row["id"] for row in bodies[k]["dataset"]["records"]]:
            raise RuntimeError(f"job {ids[k]} has rows {len(lines)} for {args.records} records")
    finished = max(datetime.fromisoformat(view["finished_at"]).timestamp() for view in views)
    first = min(datetime.fromisoformat(view["created_at"]).timestamp() for view in views)
    examples = args.jobs * args.records
    return {"jobs_per_s": args.jobs / accepted, "examples_per_s": examples / max(finished - first, 1e-9),
            "accepted_s": accepted, "span_s": finished - first}


def table(best: dict[str, dict]) -> str:
    base = best["sqlite x1"]
    lines = ["| store | replicas | jobs/s accepted | vs sqlite x1 | examples/s written | vs sqlite x1 |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, run in best.items():
        store, replicas = name.split(" x")
        lines.append(f"| {store} | {replicas} | {run['jobs_per_s']:.1f} | {run['jobs_per_s'] / base['jobs_per_s']:.2f}x "
                     f"| {run['examples_per_s']:.1f} | {run['examples_per_s'] / base['examples_per_s']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_replicas_") as tmp, ExitStack() as stack:
        root = Path(tmp)
        model = args.model
        if model is None:
            from bart_opt.demo import build_checkpoint

            model = str(build_checkpoint(root / "model", init_std=0.2))
        cluster = None
        if args.pg_url is None:
            from bart_opt.bench.postgres import TempCluster

            cluster = stack.enter_context(TempCluster())
        runs: dict[str, list[dict]] = {f"{store} x{n}": [] for store, n in ARMS}
        for repeat in range(args.repeats):
            for store, n in ARMS:
                if store == "sqlite":
                    db = str(root / f"jobs-{repeat}.db")
                else:
                    db = cluster.create_database() if cluster else args.pg_url
                runs[f"{store} x{n}"].append(run_arm(model, db, n, args, root))
                print(f"repeat {repeat + 1}: {store} x{n}: {runs[f'{store} x{n}'][-1]}", file=sys.stderr)
                if cluster is None and store == "postgresql":
                    _empty(args.pg_url)
    best = {name: max(arm, key=lambda run: run["jobs_per_s"]) for name, arm in runs.items()}
    print(f"{args.jobs} jobs of {args.records} inline records each, {args.clients} clients round-robin over the "
          f"replicas, demo model (1 torch thread a replica, max_length 4), best of {args.repeats}; {_cpu()}\n")
    print(table(best))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(runs, indent=2) + "\n")
    return 0


def _cpu() -> str:
    """The CPU's model name and whether it has AVX-512 (from /proc/cpuinfo, as lscpu shows them)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    return f"{name}, {'AVX-512' if ' avx512f' in info else 'no AVX-512'}"


def _empty(url: str) -> None:
    """Delete every job of an existing database between arms (a run's jobs would slow the next)."""
    from sqlalchemy import text

    from app.jobs.store import JobStore

    store = JobStore(url)
    with store.engine.begin() as connection:
        for table in ("predictions", "batches", "records", "jobs"):
            connection.execute(text(f"DELETE FROM {table}"))
    store.close()


if __name__ == "__main__":
    sys.exit(main())
