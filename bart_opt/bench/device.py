"""The device check: one command for a lent GPU machine, about 6 minutes on an H200.

    PYTHONPATH=$PWD python3 -m bart_opt.bench.device --out $OUT          # on the lent machine
    python -m bart_opt.bench.device --device cpu --size tiny --out /tmp/d  # here, to test it (seconds)

In order, each part writing `device.json` and `device.md` into `--out` as it ends (a run cut short
keeps what it finished):

1. ceilings: a 2 GB device-to-device copy (bytes read and written per second) and an 8192^3
   fp16 matrix product (TFLOP/s);
2. throughput: bart-large shape, fp16, random weights (EOS logit raised by 1.5, so that summaries
   end at varied lengths), inputs of uneven length padded to 1,024 tokens, CNN settings, at 48 and
   128 inputs: transformers, bart_opt's default, `static` (its graph replays under
   `torch.cuda.set_sync_debug_mode("error")`: a host sync inside a replay fails the engine),
   EL-attention (`el_attention=True`) and EL-attention with `static`; one memory run, then the
   best of the timed runs; docs/s, peak memory above the weights, and how many outputs equal
   transformers'. Then, while time is left, the largest batch of each bart_opt mode (`probe`):
   the batch its peaks at the plan's two batch sizes predict fills the device's free memory
   (less a margin), run once (the memory run, timed); where it does not fit, 0.8x of it, twice at most;
3. profiles: one generate of each bart_opt mode at 48 inputs under torch.profiler: host launch
   calls, kernels run, GPU-busy seconds, the top kernels (`bart_opt.bench.profiling`);
4. the CUDA-only tests (`pytest -k cuda` over the files that hold them; log in `tests.log`);
5. `bart-opt check --device cuda` (its `check.json` in `--out/check`, its output in `check.log`).

`--parts` picks some of them (the CPU test runs the first three).

`--budget-s` bounds part 2: no larger batch starts once it is spent. Parts 4 and 5 have
timeouts of their own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bart_opt.bench.fidelity import strip
from bart_opt.bench.profiling import profile_call
from bart_opt.bench.vs_transformers import EL_ENGINE, make_batch, memory_run, set_mode, timed, weights_bytes
from bart_opt.bench.workloads import CNN_SETTINGS, SIZES, build_random_checkpoint
from bart_opt.graphs import strict_replays

MODES = ("bart_opt", "bart_opt_static", EL_ENGINE, "bart_opt_el_static")  # bart_opt's engines, as `set_mode` names them
PROBE_ORDER = ("bart_opt", EL_ENGINE, "bart_opt_static", "bart_opt_el_static")  # the two first
CUDA_TEST_FILES = ("tests/bart_opt/test_graphs.py", "tests/bart_opt/test_memory.py")
PARTS = ("ceilings", "throughput", "profiles", "tests", "check")
EOS_BIAS = 1.5


@dataclass(frozen=True)
class Plan:
    """The sizes of one run."""

    size: str
    dtype: str
    batches: tuple[int, ...]
    probe_cap: int  # the largest batch a probe tries (bounds its time)
    probe_bytes: int | None  # memory a probe may fill: None for the device's free memory (CUDA)
    max_len: int
    copy_bytes: int
    matmul_n: int
    matmul_dtype: str
    repeats: int
    settings: dict  # generation settings: the CNN ones, shortened on a CPU

    @staticmethod
    def for_run(device: torch.device, size: str) -> Plan:
        if device.type == "cuda":
            return Plan(size=size, dtype="float16", batches=(48, 128), probe_cap=2048, probe_bytes=None, max_len=1024,
                        copy_bytes=2 * 10**9, matmul_n=8192, matmul_dtype="float16", repeats=1,
                        settings=dict(CNN_SETTINGS))
        return Plan(size=size, dtype="float32", batches=(1, 2), probe_cap=4, probe_bytes=2**30, max_len=24,
                    copy_bytes=16 * 2**20,
                    matmul_n=256, matmul_dtype="float32", repeats=1,
                    settings={**CNN_SETTINGS, "min_length": 4, "max_length": 14})


def _seconds(fn, device: torch.device, repeats: int) -> float:
    """Best wall time of `repeats` calls of `fn` (synchronized on CUDA)."""
    return min(timed(fn, device)[1] for _ in range(repeats))


def ceilings(device: torch.device, plan: Plan) -> dict:
    """The copy bandwidth (read + write) and the matrix-product rate the device reaches."""
    src = torch.empty(plan.copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_s = _seconds(lambda: dst.copy_(src), device, 5)
    n, dtype = plan.matmul_n, getattr(torch, plan.matmul_dtype)
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    for _ in range(3):
        a @ b
    matmul_s = _seconds(lambda: a @ b, device, 10)
    del src, dst, a, b
    return {"copy_bytes": plan.copy_bytes, "copy_s": copy_s, "copy_tb_per_s": 2 * plan.copy_bytes / copy_s / 1e12,
            "matmul_n": n, "matmul_dtype": plan.matmul_dtype, "matmul_s": matmul_s,
            "matmul_tflop_per_s": 2 * n**3 / matmul_s / 1e12}


def load(folder: str, device: torch.device, dtype: torch.dtype) -> dict:
    """transformers' model and bart_opt's (one model for all of its modes: `set_mode` switches them)."""
    from transformers import BartForConditionalGeneration

    from bart_opt import Bart

    return {"transformers": BartForConditionalGeneration.from_pretrained(folder, dtype=dtype).to(device).eval(),
            "bart_opt": Bart.from_pretrained(folder, device=device, dtype=dtype)}


def engines(models: dict) -> dict[str, tuple]:
    """Engine name -> (model, its `set_mode` engine name, or None for transformers)."""
    return {"transformers": (models["transformers"], None),
            **{mode: (models["bart_opt"], mode) for mode in MODES}}


def generate_call(model, mode: str | None, batch: dict, settings: dict):
    """A zero-argument generate; the static search's under `strict_replays()`."""
    ids, mask = batch["input_ids"], batch["attention_mask"]

    def run():
        with torch.inference_mode():
            if mode is None:
                return model.generate(input_ids=ids, attention_mask=mask, **settings)
            set_mode(model, mode)
            if model.static:
                with strict_replays():
                    return model.generate(ids, mask, **settings)
            return model.generate(ids, mask, **settings)
    return run


def throughput(name: str, model, mode: str | None, batch: dict, device: torch.device, plan: Plan,
               reference: list | None) -> dict:
    """One engine at one batch: a memory run, then the best timed run; a failure is a row with its error."""
    fn = generate_call(model, mode, batch, plan.settings)
    row = {"engine": name, "inputs": batch["input_ids"].shape[0]}
    try:
        out, first_s, log = memory_run(fn, device)
        seconds = min(first_s, _seconds(fn, device, plan.repeats)) if plan.repeats else first_s
    except Exception as error:  # reported in the table; the run goes on with the next engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {**row, "error": f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"}
    pad = model.config.pad_token_id
    rows = [strip(r, pad) for r in out.cpu()]
    row.update(seconds=seconds, first_call_s=first_s, docs_per_s=len(rows) / seconds,
               peak_bytes=log.report()["peak_bytes"], output_tokens=sum(len(r) - 1 for r in rows), outputs=rows)
    if reference is not None:
        row["same_as_transformers"] = sum(a == b for a, b in zip(rows, reference))
    return row


def run_throughput(models: dict, device: torch.device, plan: Plan, deadline: float) -> list[dict]:
    """Every engine at every batch of the plan, then each bart_opt mode's largest batch while time is left."""
    cfg = models["bart_opt"].config
    results = []
    for inputs in plan.batches:
        batch = make_batch(cfg, inputs, plan.max_len, device, seed=0)
        reference = None
        for name, (model, mode) in engines(models).items():
            _progress(f"throughput: {name} at {inputs} inputs")
            row = throughput(name, model, mode, batch, device, plan, reference)
            if name == "transformers" and "outputs" in row:
                reference = row["outputs"]
            results.append(row)
        del batch
    for name in PROBE_ORDER:
        results += probe(name, models["bart_opt"], results, device, plan, deadline)
    for row in results:
        row.pop("outputs", None)
    return results


def predicted_batch(rows: list[dict], free_bytes: int, plan: Plan) -> int | None:
    """The batch whose peak, on the line through `rows`' peaks (one mode at the plan's batches), fills
    90% of `free_bytes`, at most `plan.probe_cap` (from 64 up rounded down to a multiple of 8), or None
    when it is no larger than the plan's largest batch or a row failed."""
    if len(rows) < 2 or any("error" in r for r in rows):
        return None
    (n0, p0), (n1, p1) = [(r["inputs"], r["peak_bytes"]) for r in rows[-2:]]
    per_input = (p1 - p0) / (n1 - n0)
    if per_input <= 0:
        return plan.probe_cap
    inputs = min(plan.probe_cap, n1 + int((0.9 * free_bytes - p1) / per_input))
    if inputs >= 64:
        inputs -= inputs % 8
    return inputs if inputs > n1 else None


def probe(name: str, model, results: list[dict], device: torch.device, plan: Plan, deadline: float) -> list[dict]:
    """Mode `name`'s largest batch: the predicted one (`predicted_batch`), then 0.8x of the last that failed,
    twice at most, while time is left. Rows marked "probe"; the one that ran, "largest"."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = plan.probe_bytes
    inputs = predicted_batch([r for r in results if r["engine"] == name], free, plan)
    rows = []
    for _ in range(3):
        if inputs is None or inputs <= plan.batches[-1] or time.monotonic() > deadline:
            break
        _progress(f"probe: {name} at {inputs} inputs")
        batch = make_batch(model.config, inputs, plan.max_len, device, seed=0)
        # One run (the memory run, timed): at the largest batches a second run would double the probe's time.
        row = {**throughput(name, model, name, batch, device, dataclasses.replace(plan, repeats=0), None),
               "probe": True}
        del batch
        rows.append(row)
        if "error" not in row:
            row["largest"] = True
            break
        inputs = int(inputs * 0.8)
    return rows


def run_profiles(models: dict, device: torch.device, plan: Plan) -> dict:
    """One profiled generate per bart_opt mode at the plan's first batch (None per mode off CUDA)."""
    batch = make_batch(models["bart_opt"].config, plan.batches[0], plan.max_len, device, seed=0)
    out = {}
    for name, (model, mode) in engines(models).items():
        if mode is not None:
            _progress(f"profile: {name}")
            out[name] = profile_call(generate_call(model, mode, batch, plan.settings), device)
    return out


def subprocess_part(argv: list[str], timeout_s: float, log: Path | None = None) -> dict:
    """Run one command of the check; its status and the end of its output."""
    start = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s)
        rc, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        rc, output = "timeout", (expired.stdout or b"") + (expired.stderr or b"")
    output = output.decode(errors="replace")
    if log is not None:
        log.write_text(output, encoding="utf-8")
    return {"argv": argv, "rc": rc, "seconds": time.monotonic() - start, "tail": output[-3000:]}


def commands(device: torch.device, out: Path) -> dict[str, list[str]]:
    """The CUDA-only tests and the self-check, as commands run from the repository root."""
    return {"tests": [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "cuda",
                      *CUDA_TEST_FILES],
            "check": [sys.executable, "-m", "bart_opt.bench.check", "--device", str(device), "--out", str(out / "check")]}


def format_report(report: dict) -> str:
    """Markdown of everything measured so far."""
    lines = [f"### bart-opt device check: {report['device']} (torch {report['torch']})", ""]
    c = report.get("ceilings")
    if c:
        lines += [f"ceilings: a {c['copy_bytes'] / 1e9:.3g} GB copy {c['copy_s'] * 1e3:.2f} ms = "
                  f"{c['copy_tb_per_s']:.3g} TB/s (read + write); {c['matmul_n']}^3 {c['matmul_dtype']} product "
                  f"{c['matmul_s'] * 1e3:.2f} ms = {c['matmul_tflop_per_s']:.3g} TFLOP/s", ""]
    if report.get("throughput"):
        plan = report["plan"]
        lines += [f"throughput: random {plan['size']}, {plan['dtype']}, inputs padded to {plan['max_len']}, "
                  f"settings {plan['settings']}, EOS bias {EOS_BIAS}; best of a memory run and "
                  f"{plan['repeats']} timed run(s)", "",
                  "| inputs | engine | seconds | docs/s | peak above weights | same as transformers | first call s |",
                  "|---:|---|---:|---:|---:|---:|---:|"]
        for r in report["throughput"]:
            engine = r["engine"] + (" (largest)" if r.get("largest") else " (probe)" if r.get("probe") else "")
            if "error" in r:
                lines.append(f"| {r['inputs']} | {engine} | **{r['error']}** | | | | |")
                continue
            same = f"{r['same_as_transformers']}/{r['inputs']}" if "same_as_transformers" in r else "-"
            lines.append(f"| {r['inputs']} | {engine} | {r['seconds']:.3f} | {r['docs_per_s']:.1f} | "
                         f"{r['peak_bytes'] / 2**20:.0f} MiB | {same} | {r['first_call_s']:.3f} |")
        lines += ["", *versus_default(report["throughput"]), ""]
    if "profiles" in report:
        lines += ["| profiled mode | launches / generate | kernels run | GPU-busy s | of wall time | top kernels (s) |",
                  "|---|---:|---:|---:|---:|---|"]
        for name, p in report["profiles"].items():
            if p is None:
                lines.append(f"| {name} | n/a | n/a | n/a | n/a | no GPU timeline off CUDA |")
                continue
            top = "; ".join(f"{k['name'][:40]} {k['seconds']:.3f}" for k in p["top_kernels"][:4])
            lines.append(f"| {name} | {p['launches']} | {p['kernels']} | {p['gpu_busy_s']:.3f} | "
                         f"{p['gpu_busy_fraction']:.0%} | {top} |")
        lines.append("")
    for part in ("tests", "check"):
        if part in report:
            lines += [f"{part}: rc {report[part]['rc']} in {report[part]['seconds']:.0f} s", "```",
                      report[part]["tail"][-1500:].strip(), "```", ""]
    return "\n".join(lines)


def versus_default(rows: list[dict]) -> list[str]:
    """Markdown: each mode's docs/s over the default's at every batch both ran (the plan's and the probes')."""
    docs = {(r["engine"], r["inputs"]): r["docs_per_s"] for r in rows if "error" not in r}
    lines = ["| inputs | " + " | ".join(f"{m} / bart_opt docs/s" for m in MODES[1:]) + " |",
             "|---:|" + "---:|" * (len(MODES) - 1)]
    for inputs in sorted({n for _, n in docs}):
        if ("bart_opt", inputs) not in docs:
            continue
        cells = [f"{docs[m, inputs] / docs['bart_opt', inputs]:.2f}x" if (m, inputs) in docs else "-"
                 for m in MODES[1:]]
        lines.append(f"| {inputs} | " + " | ".join(cells) + " |")
    return lines


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bart_opt.bench.device``; 0 when every part ran (1: a part failed)."""
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.device", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for device.json, device.md, tests.log, check.log and check/")
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="large", choices=sorted(SIZES), help="model shape (default large; tiny to test)")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="seconds after which no larger batch is tried (default 240)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    args = p.parse_args(argv)
    parts = [part for part in args.parts.split(",") if part]
    if not parts or set(parts) - set(PARTS):
        p.error(f"--parts takes a comma-separated subset of {','.join(PARTS)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bart_opt.bench.device: --device cuda given but no CUDA device is available", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = Plan.for_run(device, args.size)
    deadline = time.monotonic() + args.budget_s
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
              "torch": torch.__version__, "plan": asdict(plan)}

    def save():
        (out / "device.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        (out / "device.md").write_text(format_report(report) + "\n", encoding="utf-8")

    if "ceilings" in parts:
        _progress("ceilings ...")
        report["ceilings"] = ceilings(device, plan)
        save()
    if "throughput" in parts or "profiles" in parts:
        with tempfile.TemporaryDirectory(prefix="bart-opt-device-") as tmp:
            folder = build_random_checkpoint(tmp, plan.size, seed=0, eos_bias=EOS_BIAS)
            models = load(folder, device, getattr(torch, plan.dtype))
        report["weights_bytes"] = weights_bytes(models["bart_opt"])
        if "throughput" in parts:
            report["throughput"] = run_throughput(models, device, plan, deadline)
            save()
        if "profiles" in parts:
            report["profiles"] = run_profiles(models, device, plan)
            save()
        del models
        if device.type == "cuda":
            torch.cuda.empty_cache()
    runs = commands(device, out)
    for part, timeout_s in (("tests", 120), ("check", 240)):
        if part in parts:
            _progress(f"{part} ...")
            report[part] = subprocess_part(runs[part], timeout_s, log=out / f"{part}.log")
            save()
    print(format_report(report))
    failed = any("error" in r for r in report.get("throughput", [])) or any(
        report[part]["rc"] != 0 for part in ("tests", "check") if part in report)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
