"""The device check: one command for a lent GPU machine, within one time budget (default 420 s).

    PYTHONUNBUFFERED=1 PYTHONPATH=$PWD python3 -m bart_opt.bench.device --out $OUT    # on the lent machine
    python -m bart_opt.bench.device --device cpu --size tiny --out /tmp/d               # here, to test it

In order (`--parts` picks some):

1. `env`: the GPU, driver, CUDA, cuDNN, torch, transformers (installed, and the version the project
   is tested against), clocks (nvidia-smi), and the ceilings: a device-to-device copy and an fp16
   matrix product;
2. `gates`, correctness at the plan's widths (bart-large) with 2+2 layers, 8 inputs (`device_tasks.gates`):
   graph replays bit-equal to the same shapes stepped eagerly; the static search equal to the default in
   float32; the static search's, the default's and transformers' total output lengths within 5% of each
   other. A gate that fails prints `GATE FAILED` and makes the run exit 1;
3. `speed`: every engine (transformers, bart_opt's default, static, EL-attention, EL-attention with
   static) at 8, 48 and 128 inputs (bart-large, fp16, random weights with the EOS logit raised by 1.5,
   inputs of uneven length padded to 1,024, CNN settings): a memory run, then the best timed run; docs/s,
   peak above the weights, outputs equal to transformers', and per call the decoder steps and, with graphs,
   the captures, their seconds, the row buckets and length buckets visited;
4. `profiles`: one profiled repeat call per bart_opt mode at 48 inputs: host launches, kernels, GPU-busy
   share, launches per decoder step;
5. `probes`, while time is left: each bart_opt mode's largest batch (its peaks at 48 and 128 inputs
   predict the batch that fills the free memory);
6. `tests`: the CUDA tests (`pytest -k cuda` over `CUDA_TEST_FILES`), with what is left of the budget.

Every task runs in a process of its own (`bart_opt/bench/device_tasks.py`) with its own timeout, never
past the budget's end: a crash, a sticky CUDA error or a hang costs that task only, its full traceback kept.
Each row is written to `device.json` (every row that finished, whatever ends the run) and `device.md`,
and one line is printed, as it ends. The tasks' own output goes to `workers.log`, the tests' to
`tests.log`: four files in `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ENGINES = ("transformers", "bart_opt", "bart_opt_static", "bart_opt_el", "bart_opt_el_static")
MODES = ENGINES[1:]  # bart_opt's, as `vs_transformers.set_mode` names them
PARTS = ("env", "gates", "speed", "profiles", "probes", "tests")
CUDA_TEST_FILES = ("tests/bart_opt/engine/test_graphs.py", "tests/bart_opt/engine/test_memory.py")
TESTED_TRANSFORMERS = "5.24.0"
"""The transformers the project's suite runs against (pyproject.toml's comment; the env block carries it)."""
LENGTH_TOLERANCE = 0.05
"""The lengths gate: total output lengths within this fraction of each other."""
EOS_BIAS = 1.5
MIN_TASK_S = 5.0  # a task is not started with less of the budget left
FAULTS = ("raise", "crash", "hang", "row-then-hang")  # what --fault injects into a task (the check's own tests)


@dataclass(frozen=True)
class Plan:
    """The sizes and time caps of one run."""

    size: str
    dtype: str
    batches: tuple[int, ...]
    gate_batch: int
    profile_batch: int
    probe_cap: int  # the largest batch a probe tries (bounds its time)
    probe_bytes: int | None  # memory a probe may fill: None for the device's free memory (CUDA)
    max_len: int
    copy_bytes: int
    matmul_n: int
    matmul_dtype: str
    repeats: int
    settings: dict  # generation settings: the CNN ones, shortened on a CPU
    eos_bias: float
    caps: dict  # part -> seconds a task of it may take at most
    tests_reserve_s: float  # kept for the CUDA tests: probes stop short of it

    @staticmethod
    def for_run(device: str, size: str) -> Plan:
        from bart_opt.bench.workloads import CNN_SETTINGS

        if device.startswith("cuda"):
            return Plan(size=size, dtype="float16", batches=(8, 48, 128), gate_batch=8, profile_batch=48,
                        probe_cap=2048, probe_bytes=None, max_len=1024, copy_bytes=2 * 10**9, matmul_n=8192,
                        matmul_dtype="float16", repeats=1, settings=dict(CNN_SETTINGS), eos_bias=EOS_BIAS,
                        caps={"checkpoints": 120, "env": 60, "gates": 120, "speed": 150, "profiles": 60,
                              "probes": 90, "tests": 150},
                        tests_reserve_s=90)
        return Plan(size=size, dtype="float32", batches=(1, 2, 3), gate_batch=2, profile_batch=2, probe_cap=4,
                    probe_bytes=2**30, max_len=24, copy_bytes=16 * 2**20, matmul_n=256, matmul_dtype="float32",
                    repeats=1, settings={**CNN_SETTINGS, "min_length": 4, "max_length": 14}, eos_bias=EOS_BIAS,
                    caps={"checkpoints": 120, "env": 120, "gates": 240, "speed": 240, "profiles": 120, "probes": 120,
                          "tests": 300},
                    tests_reserve_s=0)


class Report:
    """Every row so far, written to `device.json` and `device.md` as each arrives, with its one line printed."""

    def __init__(self, out: Path, header: dict):
        self.out, self.header, self.rows = out, header, []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.save()
        print(line(row), flush=True)

    def save(self) -> None:
        payload = {**self.header, "rows": self.rows, "failed": failures(self.rows)}
        (self.out / "device.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        (self.out / "device.md").write_text(format_report(payload) + "\n", encoding="utf-8")


class Runner:
    """Runs the tasks in processes of their own within the budget's deadline, streaming their rows."""

    def __init__(self, report: Report, plan: Plan, device: str, work: Path, deadline: float, faults: dict,
                 task_timeout_s: float | None = None):
        self.report, self.plan, self.device, self.work = report, plan, device, work
        self.deadline, self.faults, self.task_timeout_s = deadline, faults, task_timeout_s
        self.folders: dict = {}
        self.log = report.out / "workers.log"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, task: str, part: str, extra: dict | None = None, keep_s: float = 0.0) -> list[dict]:
        """Task `task` with the timeout of its part (or `--task-timeout-s`), never past the deadline less
        `keep_s`; its rows as they came (a timeout, a crash or no time left adds a row saying so)."""
        if self.left() - keep_s < MIN_TASK_S:
            row = {"task": task, "skipped": f"budget: {max(self.left(), 0):.0f} s left"}
            self.report.add(row)
            return [row]
        timeout = min(self.task_timeout_s or self.plan.caps[part], self.left() - keep_s)
        rows_file = self.work / f"rows-{task.replace(':', '-')}.jsonl"
        rows_file.write_text("", encoding="utf-8")
        spec = {"task": task, "device": self.device, "plan": asdict(self.plan), "folders": self.folders,
                "work": str(self.work), "rows": str(rows_file), "fault": self.faults.get(task), **(extra or {})}
        worker = Path(__file__).with_name("device_tasks.py")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                           os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        start = time.monotonic()
        with open(self.log, "a", encoding="utf-8") as log:
            log.write(f"\n===== {task} (timeout {timeout:.0f} s)\n")
            log.flush()
            process = subprocess.Popen([sys.executable, str(worker), json.dumps(spec)], stdout=log, stderr=log,
                                       start_new_session=True, env=env)
            seen, rows, status = 0, [], None
            while status is None:
                try:
                    process.wait(timeout=0.5)
                    status = process.returncode
                except subprocess.TimeoutExpired:
                    if time.monotonic() - start > timeout:
                        os.killpg(process.pid, signal.SIGKILL)
                        process.wait()
                        status = "timeout"
                seen = self._collect(rows_file, seen, rows)
        seconds = time.monotonic() - start
        if status == "timeout":
            row = {"task": task, "error": f"timeout after {seconds:.0f} s (its finished rows are kept)"}
            self.report.add(row)
            rows.append(row)
        elif status != 0 and not any("error" in r for r in rows):
            row = {"task": task, "error": f"exit status {status}", "traceback": _tail(self.log, 4000)}
            self.report.add(row)
            rows.append(row)
        return rows

    def _collect(self, path: Path, seen: int, rows: list) -> int:
        """Report the rows the task finished since `seen` (a line still being written waits)."""
        text = path.read_text(encoding="utf-8")
        complete = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
        for text in complete[seen:]:
            row = json.loads(text)
            rows.append(row)
            self.report.add(row)
        return len(complete)

    def tests(self) -> None:
        """The CUDA tests with what is left (and the tests' cap), their output in `tests.log`."""
        timeout = min(self.task_timeout_s or self.plan.caps["tests"], self.left())
        if self.left() < MIN_TASK_S:
            self.report.add({"task": "tests", "skipped": f"budget: {max(self.left(), 0):.0f} s left"})
            return
        argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "cuda",
                *CUDA_TEST_FILES]
        start = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout, cwd=Path(__file__).parents[2])
            rc, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as expired:
            rc, output = "timeout", (expired.stdout or b"") + (expired.stderr or b"")
        text = output.decode(errors="replace")
        (self.report.out / "tests.log").write_text(text, encoding="utf-8")
        self.report.add({"task": "tests", "rc": rc, "seconds": time.monotonic() - start,
                         "summary": (text.strip().splitlines() or [""])[-1][:300]})


def _tail(path: Path, chars: int) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-chars:]


def failures(rows: list[dict]) -> list[str]:
    """What makes the run fail: errors, failed gates, failed tests."""
    out = [f"{r['task']}: {r['error']}" for r in rows if "error" in r and not r.get("probe")]
    out += [f"gate {r['gate']} FAILED" for r in rows if r.get("gate") and not r.get("passed")]
    out += [f"tests rc {r['rc']}" for r in rows if r["task"] == "tests" and "rc" in r and r["rc"] != 0]
    return out


def line(row: dict) -> str:
    """The one line printed as a row ends."""
    task = row["task"]
    if "skipped" in row:
        return f"{task}: skipped ({row['skipped']})"
    if "error" in row:
        return f"{task}: ERROR {row['error']}"
    if "gate" in row:
        return f"{task} {row['gate']}: {'passed' if row['passed'] else 'GATE FAILED'} " + json.dumps(
            {k: v for k, v in row.items() if k not in ("task", "gate", "passed")})
    if "docs_per_s" in row:
        extra = "".join(f", {key} {row[key]}" for key in ("steps", "first_call_captures", "captures", "buckets",
                                                          "length_buckets") if key in row)
        same = f", {row['same_as_transformers']}/{row['inputs']} = transformers" if "same_as_transformers" in row else ""
        return (f"{task} at {row['inputs']}: {row['docs_per_s']:.1f} docs/s ({row['seconds']:.3f} s, first call "
                f"{row['first_call_s']:.3f} s), peak {row['peak_bytes'] / 2**20:.0f} MiB{same}{extra}")
    if "profile" in row:
        p = row["profile"]
        return f"{task}: no GPU timeline off CUDA" if p is None else (
            f"{task}: {p['launches']} launches ({row['launches_per_step']:.1f} a step), GPU busy "
            f"{p['gpu_busy_fraction']:.0%} of {p['wall_s']:.2f} s")
    if task == "tests":
        return f"tests: rc {row['rc']} in {row['seconds']:.0f} s: {row['summary']}"
    if task == "env":
        c, smi = row["ceilings"], row.get("nvidia_smi")
        clocks = (f", SM {smi.get('clocks.sm')} of {smi.get('clocks.max.sm')}, memory {smi.get('clocks.mem')}"
                  if isinstance(smi, dict) else "")
        return (f"env: {row.get('gpu', row['cpu'])}, driver {row.get('driver')}, CUDA {row['cuda']}, cuDNN "
                f"{row.get('cudnn')}, torch {row['torch']}, transformers {row['transformers']} (tested "
                f"{row['transformers_tested']}){clocks}; copy {c['copy_tb_per_s']:.3g} TB/s, {c['matmul_dtype']} "
                f"product {c['matmul_tflop_per_s']:.3g} TFLOP/s")
    return f"{task}: " + json.dumps({k: v for k, v in row.items() if k != "task"})[:400]


def format_report(report: dict) -> str:
    """Markdown of everything measured so far."""
    rows = report["rows"]
    lines = [f"### bart-opt device check: {report['device']}, {report['plan']['size']} {report['plan']['dtype']}, "
             f"budget {report['budget_s']:.0f} s", ""]
    if report["failed"]:
        lines += ["**FAILED**: " + "; ".join(report["failed"]), ""]
    for r in rows:
        if r["task"] == "env" and "error" not in r and "skipped" not in r:
            env = {k: v for k, v in r.items() if k not in ("task", "ceilings")}
            lines += ["environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), ""]
            c = r["ceilings"]
            lines += [f"ceilings: a {c['copy_bytes'] / 1e9:.3g} GB copy {c['copy_s'] * 1e3:.2f} ms = "
                      f"{c['copy_tb_per_s']:.3g} TB/s (read + write); {c['matmul_n']}^3 {c['matmul_dtype']} product "
                      f"{c['matmul_s'] * 1e3:.2f} ms = {c['matmul_tflop_per_s']:.3g} TFLOP/s", ""]
    gates = [r for r in rows if "gate" in r]
    if gates:
        lines += ["| gate | passed | detail |", "|---|---|---|"]
        lines += [f"| {r['gate']} | {'yes' if r['passed'] else '**NO**'} | "
                  + ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("task", "gate", "passed")) + " |"
                  for r in gates]
        lines.append("")
    speed = [r for r in rows if "docs_per_s" in r]
    if speed:
        lines += ["| inputs | engine | docs/s | seconds | first call s | peak above weights | = transformers "
                  "| steps | captures: first call (s) / timed call | row / length buckets |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in speed:
            engine = r["engine"] + (" (largest)" if r.get("largest") else "")
            same = f"{r['same_as_transformers']}/{r['inputs']}" if "same_as_transformers" in r else "-"
            caps = (f"{r['first_call_captures']} ({r['first_call_capture_s']:.2f}) / {r['captures']}"
                    if "captures" in r else "-")
            buckets = f"{r['buckets']} / {r['length_buckets']}" if "buckets" in r else "-"
            lines.append(f"| {r['inputs']} | {engine} | {r['docs_per_s']:.1f} | {r['seconds']:.3f} | "
                         f"{r['first_call_s']:.3f} | {r['peak_bytes'] / 2**20:.0f} MiB | {same} | {r.get('steps', '-')} "
                         f"| {caps} | {buckets} |")
        lines += ["", *versus_default(speed), ""]
    profiles = [r for r in rows if "profile" in r]
    if profiles:
        lines += ["| profiled mode | inputs | launches | launches / step | kernels | GPU-busy s | of wall time "
                  "| top kernels (s) |", "|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in profiles:
            p = r["profile"]
            if p is None:
                lines.append(f"| {r['engine']} | {r['inputs']} | n/a | n/a | n/a | n/a | n/a | no GPU timeline off CUDA |")
                continue
            top = "; ".join(f"{k['name'][:40]} {k['seconds']:.3f}" for k in p["top_kernels"][:4])
            lines.append(f"| {r['engine']} | {r['inputs']} | {p['launches']} | {r['launches_per_step']:.1f} | "
                         f"{p['kernels']} | {p['gpu_busy_s']:.3f} | {p['gpu_busy_fraction']:.0%} | {top} |")
        lines.append("")
    for r in rows:
        if r["task"] == "tests" and "rc" in r:
            lines += [f"tests: rc {r['rc']} in {r['seconds']:.0f} s: {r['summary']}", ""]
    trouble = [r for r in rows if "error" in r or "skipped" in r]
    if trouble:
        lines += ["| task | what happened |", "|---|---|"]
        lines += [f"| {r['task']} | {r.get('error') or 'skipped: ' + r['skipped']} |" for r in trouble]
        lines.append("")
    return "\n".join(lines)


def versus_default(rows: list[dict]) -> list[str]:
    """Markdown: each mode's docs/s over the default's at every batch both ran."""
    docs = {(r["engine"], r["inputs"]): r["docs_per_s"] for r in rows}
    lines = ["| inputs | " + " | ".join(f"{m} / bart_opt docs/s" for m in MODES[1:]) + " |",
             "|---:|" + "---:|" * (len(MODES) - 1)]
    for inputs in sorted({n for _, n in docs}):
        if ("bart_opt", inputs) not in docs:
            continue
        cells = [f"{docs[m, inputs] / docs['bart_opt', inputs]:.2f}x" if (m, inputs) in docs else "-" for m in MODES[1:]]
        lines.append(f"| {inputs} | " + " | ".join(cells) + " |")
    return lines


def _faults(values: list[str]) -> dict:
    faults = {}
    for value in values:
        task, _, kind = value.partition("=")
        if kind not in FAULTS:
            raise argparse.ArgumentTypeError(f"--fault {value!r}: TASK={'|'.join(FAULTS)}")
        faults[task] = kind
    return faults


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bart_opt.bench.device``; 0 when every part ran and passed (1: a failure)."""
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.device", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for device.json, device.md, workers.log and tests.log")
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="large", help="model shape (default large; tiny to test)")
    p.add_argument("--budget-s", type=float, default=420.0, help="seconds the whole check may take (default 420)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of the speed part's engines")
    p.add_argument("--task-timeout-s", type=float, help="one timeout for every task (default: each part's own)")
    p.add_argument("--fault", action="append", default=[], help=f"TASK={'|'.join(FAULTS)} (the check's own tests)")
    args = p.parse_args(argv)
    from bart_opt.bench.workloads import SIZES

    parts = [part for part in args.parts.split(",") if part]
    engines = [e for e in args.engines.split(",") if e]
    if not parts or set(parts) - set(PARTS) or set(engines) - set(ENGINES) or args.size not in SIZES:
        p.error(f"--parts takes a subset of {','.join(PARTS)}, --engines of {','.join(ENGINES)}, "
                f"--size one of {','.join(SIZES)}")
    try:
        faults = _faults(args.fault)
    except argparse.ArgumentTypeError as error:
        p.error(str(error))
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():  # only asks the driver how many devices there are
            print("bart_opt.bench.device: --device cuda given but no CUDA device is available", file=sys.stderr)
            return 2
    deadline = time.monotonic() + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "workers.log").write_text("", encoding="utf-8")
    plan = Plan.for_run(args.device, args.size)
    report = Report(out, {"device": args.device, "budget_s": args.budget_s, "plan": asdict(plan), "parts": parts})
    report.save()
    with tempfile.TemporaryDirectory(prefix="bart-opt-device-") as work:
        runner = Runner(report, plan, args.device, Path(work), deadline, faults, args.task_timeout_s)
        _run(runner, parts, engines)
    report.save()
    failed = failures(report.rows)
    print(f"device check: {'FAILED: ' + '; '.join(failed) if failed else 'every part passed'} "
          f"({args.budget_s - max(runner.left(), 0):.0f} of {args.budget_s:.0f} s)", flush=True)
    return 1 if failed else 0


def _run(runner: Runner, parts: list[str], engines: list[str]) -> None:
    plan = runner.plan
    if "env" in parts:
        runner.run("env", "env")
    if set(parts) & {"gates", "speed", "profiles", "probes"}:
        rows = runner.run("checkpoints", "checkpoints")
        folders = next((r["folders"] for r in rows if "folders" in r), None)
        if folders is None:
            return
        runner.folders = folders
    if "gates" in parts:
        runner.run("gates", "gates")
    speed = []
    if "speed" in parts:
        for engine in engines:
            speed += runner.run(f"speed:{engine}", "speed")
    if "profiles" in parts:
        for mode in (m for m in MODES if m in engines):
            if runner.device.startswith("cuda"):
                runner.run(f"profile:{mode}", "profiles")
            else:  # no GPU timeline to profile: nothing to start a process for
                runner.report.add({"task": f"profile:{mode}", "engine": mode, "inputs": plan.profile_batch,
                                   "profile": None})
    if "probes" in parts:
        for mode in (m for m in MODES if m in engines):
            peaks = [(r["inputs"], r["peak_bytes"]) for r in speed if r.get("engine") == mode and "peak_bytes" in r]
            if len(peaks) < 2:
                runner.report.add({"task": f"probe:{mode}", "skipped": "no two speed rows to predict from"})
                continue
            runner.run(f"probe:{mode}", "probes", {"peaks": peaks[-2:]}, keep_s=plan.tests_reserve_s)
    if "tests" in parts:
        runner.tests()


if __name__ == "__main__":
    raise SystemExit(main())
