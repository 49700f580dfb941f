"""`bart-opt check`: an offline self-check of the engine on this machine's hardware.

It builds random checkpoints (nothing is downloaded) and runs, on the chosen device:

1. parity: bart_opt against transformers on the same batches, greedy and beam search, in
   every dtype the device runs: exact mode must be identical; the default's agreement and the
   score gaps of its differences are reported (`bart_opt.bench.fidelity`);
2. out of memory: a batch that cannot fit is split and retried. On CUDA the memory is really
   capped (`torch.cuda.set_per_process_memory_fraction`); elsewhere the failure is injected;
3. memory: the seed's table, forward and 9-step generate against transformers
   (`bart_opt.bench`), at bart-large shape in float32 and float16 on CUDA;
4. service: one request to the HTTP service, in process (skipped without the serve extra).

On a CPU it first names the processor (`bart_opt.engine.hardware`: its model, the ISA torch runs on,
`torch.backends.cpu.get_cpu_capability()`, and the AVX-512 VNNI / BF16 and AMX flags) and says which
modes are fast on it. It prints a table and writes `check.json` into `--out`. On CPU every part runs at a reduced
size (about a minute); on CUDA at full size (a few minutes).

    bart-opt check --device cuda --out check-h100
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bart_opt import extras
from bart_opt.engine import hardware
from bart_opt.bench.fidelity import Workload, measure_dtype
from bart_opt.bench.fidelity import build_checkpoint as build_fidelity_checkpoint


@dataclass(frozen=True)
class Plan:
    """The sizes one run of the check uses."""

    parity_shape: str
    parity_dtypes: tuple[str, ...]
    parity_work: Workload
    self_consistency: bool
    oom_inputs: int
    oom_sentences: int  # per input text (about 15 tokens each)
    bench_runs: tuple[tuple[str, ...], ...]  # argument lists for bart_opt.bench

    @staticmethod
    def for_device(device: torch.device) -> Plan:
        if device.type == "cuda":
            bench = ["--size", "large", "--device", str(device), "--skip-throughput", "--skip-overhead",
                     "--repeats", "1"]
            return Plan(parity_shape="d256", parity_dtypes=("float32", "float16", "bfloat16"),
                        parity_work=Workload(), self_consistency=True, oom_inputs=8, oom_sentences=60,
                        bench_runs=(tuple(bench + ["--dtype", "float32"]), tuple(bench + ["--dtype", "float16"])))
        bench = ["--size", "tiny", "--device", str(device), "--skip-throughput", "--skip-overhead", "--repeats", "0",
                 "--batch-size", "3", "--max-len", "32"]
        return Plan(parity_shape="small", parity_dtypes=("float32", "bfloat16"),
                    parity_work=Workload(n=4, max_len=40, batch_size=2, new_tokens=10), self_consistency=False,
                    oom_inputs=4, oom_sentences=6, bench_runs=(tuple(bench + ["--dtype", "float32"]),))


@dataclass
class Outcome:
    """One line of the check's table."""

    name: str
    ok: bool
    detail: str
    data: dict = field(default_factory=dict)
    seconds: float = 0.0


def check_parity(device: torch.device, plan: Plan, workdir: Path) -> list[Outcome]:
    """Exact mode identical to transformers in every dtype; the default's agreement reported."""
    folder = build_fidelity_checkpoint(str(workdir / "parity"), plan.parity_shape, seed=0, eos_bias=0.0,
                                       init_std=0.02)
    outcomes = []
    for name in plan.parity_dtypes:
        report = measure_dtype(folder, getattr(torch, name), device, plan.parity_work, modes=("default", "exact"),
                               self_consistency=plan.self_consistency, float32_reference=False)
        exact = [report[search]["exact"] for search in ("beam", "greedy")]
        default = report["beam"]["default"]
        ok = all(c["identical"] == c["total"] for c in exact)
        detail = (f"exact: beam {exact[0]['identical']}/{exact[0]['total']}, greedy "
                  f"{exact[1]['identical']}/{exact[1]['total']} identical; default: beam "
                  f"{default['identical']}/{default['total']}, greedy "
                  f"{report['greedy']['default']['identical']}/{report['greedy']['default']['total']}")
        if "transformers_b1" in report["beam"]:
            alone = report["beam"]["transformers_b1"]
            detail += f"; transformers alone vs batched: {alone['identical']}/{alone['total']}"
        outcomes.append(Outcome(f"parity {plan.parity_shape} {name}", ok, detail, report))
    return outcomes


def check_oom_split(device: torch.device, plan: Plan, workdir: Path) -> Outcome:
    """A batch too big for the memory is halved and retried until every input is summarized."""
    from bart_opt.demo import build_checkpoint, random_article
    from bart_opt.pipeline.summarizer import Summarizer

    folder = build_checkpoint(workdir / "oom", seed=0, d_model=256, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=8, decoder_attention_heads=8, ffn_dim=1024, init_std=0.02)
    rng = random.Random(0)
    texts = [random_article(rng, plan.oom_sentences) for _ in range(plan.oom_inputs)]
    settings = {"num_beams": 4, "max_new_tokens": 8, "min_length": 0}
    summarizer = Summarizer.from_pretrained(str(folder), device=device, dtype=torch.float32,
                                            max_batch_size=plan.oom_inputs, max_batch_tokens=10**9)
    if device.type == "cuda":
        return _real_cuda_oom(summarizer, texts, settings, device)

    def inject(positions):
        if len(positions) > 1:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")

    summarizer.before_model_call = inject
    result = summarizer.summarize(texts, **settings)
    ok = result.oom_splits >= 1 and result.errors == [None] * len(texts)
    return Outcome("out-of-memory split (injected: no CUDA)", ok,
                   f"{result.oom_splits} splits, {sum(e is None for e in result.errors)}/{len(texts)} summarized",
                   {"oom_splits": result.oom_splits, "errors": result.errors})


def _real_cuda_oom(summarizer, texts, settings, device: torch.device) -> Outcome:
    """Cap the process's CUDA memory between what half the batch and the whole batch need."""
    torch.cuda.empty_cache()
    whole = summarizer.summarize(texts, **settings).memory["peak_bytes"]
    base = torch.cuda.memory_allocated(device)
    total = torch.cuda.get_device_properties(device).total_memory
    cap = base + int(0.75 * whole)
    torch.cuda.empty_cache()
    index = device.index  # None (a plain "cuda") is the current device; the fraction setter refuses the device itself
    torch.cuda.set_per_process_memory_fraction(cap / total, index)
    try:
        result = summarizer.summarize(texts, **settings)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
        torch.cuda.empty_cache()
    summarized = sum(e is None for e in result.errors)
    ok = result.oom_splits >= 1 and summarized == len(texts)
    return Outcome("out-of-memory split (CUDA, memory capped)", ok,
                   f"batch of {len(texts)} needs {whole / 2**20:.0f} MiB above the weights; capped at "
                   f"{(cap - base) / 2**20:.0f} MiB: {result.oom_splits} splits, {summarized}/{len(texts)} summarized",
                   {"batch_peak_bytes": whole, "cap_bytes": cap, "oom_splits": result.oom_splits,
                    "errors": result.errors, "calls": [c["size"] for c in result.batches]})


def check_memory(device: torch.device, plan: Plan, workdir: Path) -> list[Outcome]:
    """The seed's table: bart_opt's and transformers' peaks, and whether the outputs agree."""
    from bart_opt.bench import vs_transformers as bench

    outcomes = []
    for k, argv in enumerate(plan.bench_runs):
        path = workdir / f"bench-{k}.json"
        with contextlib.redirect_stdout(io.StringIO()) as tables:  # the check prints its own table
            status = bench.main([*argv, "--json", str(path)])
        if status != 0:
            outcomes.append(Outcome(f"memory {' '.join(argv)}", False, "bart-opt bench failed"))
            continue
        payload = json.loads(path.read_text())
        cfg, ratios = payload["config"], payload["ratios"]
        parts, ok = [], True
        for task, q in ratios.items():
            exact = q.get("exact", {})
            same_exact = exact.get("outputs_equal", exact.get("max_abs_logit_diff") == 0.0)
            ok = ok and bool(same_exact) and q["peak"] is not None and q["peak"] < 1.0
            parts.append(f"{task}: {q['peak']:.2f}x memory (exact {exact.get('peak', float('nan')):.2f}x), "
                         f"exact {'identical' if same_exact else 'DIFFERENT'}")
        outcomes.append(Outcome(f"memory {cfg['size']} {cfg['dtype']}", ok, "; ".join(parts),
                                {**payload, "tables": tables.getvalue()}))
    return outcomes


def check_service(device: torch.device, workdir: Path) -> Outcome:
    """One POST /summarize against the app, in process, on the demo checkpoint; skipped (and said so) without
    the serve extra."""
    if absent := extras.missing("serve"):
        return Outcome("service", True, f"skipped: {extras.MissingExtra('the service check', 'serve', absent)}",
                       {"skipped": True})
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings
    from bart_opt.demo import build_checkpoint

    folder = build_checkpoint(workdir / "demo", seed=0, init_std=0.2)
    settings = Settings(model=str(folder), device=str(device), db=str(workdir / "jobs.db"),
                        data_dir=str(workdir))
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code != 200:
            if time.monotonic() > deadline:
                return Outcome("service", False, "the model did not load within 120 s")
            time.sleep(0.1)
        response = client.post("/summarize", json={
            "texts": ["The city council voted on Monday to build a new school near the river."],
            "generation": {"num_beams": 2, "max_length": 16, "min_length": 2}})
    body = response.json()
    ok = response.status_code == 200 and len(body.get("summaries", [])) == 1 and bool(body["summaries"][0])
    return Outcome("service", ok, f"POST /summarize -> {response.status_code}, device {body.get('memory', {}).get('device')}",
                   {"status": response.status_code, "memory": body.get("memory")})


def run_checks(device: torch.device, workdir: Path) -> list[Outcome]:
    """Every check in order; a check that raises is a failed line, not an aborted run."""
    plan = Plan.for_device(device)
    steps: list[tuple[str, Callable[[], list[Outcome] | Outcome]]] = [
        ("parity", lambda: check_parity(device, plan, workdir)),
        ("out-of-memory split", lambda: check_oom_split(device, plan, workdir)),
        ("memory", lambda: check_memory(device, plan, workdir)),
        ("service", lambda: check_service(device, workdir)),
    ]
    outcomes = []
    for name, step in steps:
        print(f"check: {name} ...", file=sys.stderr, flush=True)
        tick = time.perf_counter()
        try:
            got = step()
        except Exception as error:  # reported as a failed check, with the traceback in the JSON
            got = Outcome(name, False, f"{type(error).__name__}: {' '.join(str(error).split())[:300]}",
                          {"traceback": traceback.format_exc()})
        got = got if isinstance(got, list) else [got]
        seconds = (time.perf_counter() - tick) / len(got)
        for outcome in got:
            outcome.seconds = seconds
        outcomes += got
    return outcomes


def format_table(device: torch.device, outcomes: list[Outcome]) -> str:
    lines = [f"### bart-opt check on {_device_name(device)}", ""]
    if device.type == "cpu":
        cpu = hardware.probe()
        lines += [f"CPU: {cpu.describe()}", "", "| mode | on this CPU |", "|---|---|",
                  *(f"| {mode} | {verdict} |" for mode, verdict in hardware.fast_modes(cpu).items()), ""]
    lines += ["| check | result | detail |", "|---|---|---|"]
    for o in outcomes:
        result = "skipped" if o.data.get("skipped") else "pass" if o.ok else "**FAIL**"
        lines.append(f"| {o.name} | {result} | {o.detail} |")
    return "\n".join(lines)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``bart-opt check``; 0 when every check passed, 1 otherwise (2: bad usage)."""
    p = argparse.ArgumentParser(prog="bart-opt check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)")
    p.add_argument("--out", default="bart-opt-check", help="folder for check.json (default ./bart-opt-check)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads for the run")
    args = p.parse_args(argv)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bart-opt check: --device cuda given but no CUDA device is available", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        payload = _run(device, Path(args.out))
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (tests, the CLI)
    return 0 if payload["passed"] else 1


def _run(device: torch.device, out: Path) -> dict:
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bart-opt-check-") as tmp:
        outcomes = run_checks(device, Path(tmp))
    print(format_table(device, outcomes))
    cpu = hardware.probe() if device.type == "cpu" else None
    payload = {"device": _device_name(device), "torch": torch.__version__, "transformers": transformers.__version__,
               "cpu": cpu and {**cpu.as_dict(), "modes": hardware.fast_modes(cpu)},
               "passed": all(o.ok for o in outcomes),
               "checks": [{"name": o.name, "ok": o.ok, "detail": o.detail, "seconds": o.seconds, "data": o.data}
                          for o in outcomes]}
    (out / "check.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return payload


if __name__ == "__main__":
    raise SystemExit(main())
