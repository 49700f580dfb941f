"""The device check's tasks (`bart_opt.bench.device`), each run in a process of its own.

    python bart_opt/bench/device_tasks.py SPEC_JSON     # what the check runs, once per task

`SPEC_JSON` names the task, the device, the plan, the checkpoint folders, where the task's rows go (one
JSON object a line, written and flushed as each row ends: a task killed at its timeout keeps the rows it
finished) and an injected fault, if any (for the check's own tests: "raise" in the task, "crash" of the
process, "hang", "row-then-hang"; before anything is imported, so that those tests cost no model). An
exception ends the task with a row holding its full traceback: after a CUDA error a process's later calls fail too, so the next
task starts afresh in a new process.

Run as a file, not as a module: `python -m` would import the package's `bart_opt/__init__` (torch,
transformers) before the fault is seen.
"""

from __future__ import annotations

import json
import sys
import time
import traceback


def emit(spec: dict, row: dict) -> dict:
    """Append `row` (the task's name added) to the task's rows file, flushed."""
    row = {"task": spec["task"], **row}
    with open(spec["rows"], "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
    return row


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    fault = spec.get("fault")
    if fault == "crash":  # the process dies: no row, its traceback on stderr only
        raise RuntimeError(f"injected crash in {spec['task']}")
    if fault in ("hang", "row-then-hang"):
        if fault == "row-then-hang":
            emit(spec, {"injected": True, "finished": True})
        while True:
            time.sleep(1)
    try:
        if fault == "raise":
            raise RuntimeError(f"injected failure in {spec['task']}")
        TASKS[spec["task"].split(":")[0]](spec)
    except BaseException as error:  # the row keeps the full traceback; the process ends
        emit(spec, {"error": f"{type(error).__name__}: {' '.join(str(error).split())[:500]}",
                    "traceback": traceback.format_exc()})
        return 1
    return 0


# ------------------------------------------------------------------------------------------------ tasks

def _device(spec: dict):
    import torch

    return torch.device(spec["device"])


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def checkpoints(spec: dict) -> None:
    """The random checkpoints the other tasks load: the plan's size, and its widths with 2+2 layers (gates)."""
    from bart_opt.bench.workloads import SIZES
    from bart_opt.demo import build_checkpoint

    plan, start = spec["plan"], time.perf_counter()
    shape = SIZES[plan["size"]]
    folders = {}
    for name, layers in (("gates", {"encoder_layers": 2, "decoder_layers": 2}), ("full", {})):
        folders[name] = str(build_checkpoint(f"{spec['work']}/ckpt-{name}", seed=0, with_tokenizer=False,
                                             eos_bias=plan["eos_bias"], **{**shape, **layers}))
    emit(spec, {"folders": folders, "seconds": time.perf_counter() - start})


def environment(spec: dict) -> None:
    """The machine and its software, and the ceilings the floors come from (copy bandwidth, product rate)."""
    import os
    import platform
    import subprocess

    import torch
    import transformers

    from bart_opt.bench.device import TESTED_TRANSFORMERS

    device = _device(spec)
    row = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "transformers_tested": TESTED_TRANSFORMERS, "cuda": torch.version.cuda, "cpu": platform.processor() or
           platform.machine(), "cpu_count": os.cpu_count()}
    try:
        row["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                       timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        row["commit"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        row.update(gpu=props.name, gpu_memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count,
                   capability=f"{props.major}.{props.minor}", cudnn=torch.backends.cudnn.version())
        query = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,pstate,temperature.gpu"
        try:
            smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20).stdout.strip().splitlines()
            row["nvidia_smi"] = dict(zip(query.split(","), (v.strip() for v in smi[0].split(",")))) if smi else None
        except (OSError, subprocess.SubprocessError) as error:
            row["nvidia_smi"] = f"unavailable: {error}"
        row["driver"] = (row["nvidia_smi"] or {}).get("driver_version") if isinstance(row["nvidia_smi"], dict) else None
    row["ceilings"] = ceilings(device, spec["plan"])
    emit(spec, row)


def _best(fn, device, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def ceilings(device, plan: dict) -> dict:
    """The copy bandwidth (bytes read and written per second) and the matrix-product rate the device reaches."""
    import torch

    src = torch.empty(plan["copy_bytes"], dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_s = _best(lambda: dst.copy_(src), device, 5)
    n, dtype = plan["matmul_n"], getattr(torch, plan["matmul_dtype"])
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    for _ in range(3):
        a @ b
    matmul_s = _best(lambda: a @ b, device, 10)
    return {"copy_bytes": plan["copy_bytes"], "copy_s": copy_s, "copy_tb_per_s": 2 * plan["copy_bytes"] / copy_s / 1e12,
            "matmul_n": n, "matmul_dtype": plan["matmul_dtype"], "matmul_s": matmul_s,
            "matmul_tflop_per_s": 2 * n**3 / matmul_s / 1e12}


class _Steps:
    """Counts `model.decode_step` calls (the decoder steps of a call) while installed."""

    def __init__(self, model):
        self.model, self.count = model, 0
        step = model.decode_step

        def counted(*args, **kwargs):
            self.count += 1
            return step(*args, **kwargs)

        model.decode_step = counted


def _call(model, mode: str | None, batch: dict, settings: dict):
    """A zero-argument generate; the static search's under `strict_replays()` (a host sync in a step raises)."""
    import torch

    from bart_opt.bench.vs_transformers import set_mode
    from bart_opt.engine.graphs import strict_replays

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


def _rows(out, pad: int) -> list[list[int]]:
    """Each output row without its trailing padding, as a list (what JSON gives back)."""
    from bart_opt.bench.fidelity import strip

    return [list(strip(r, pad)) for r in out.cpu()]


def _call_stats(model, steps: _Steps) -> dict:
    """What one call did: its decoder steps; with graphs the captures, their seconds and the shapes visited."""
    stats = {"steps": steps.count}
    graphs = getattr(model, "graph_stats", None)
    if graphs is not None:
        call = graphs["last_call"]
        keys = call.get("keys", [])
        stats.update(captures=call.get("captures", 0), capture_s=call.get("capture_s", 0.0), shapes=len(keys),
                     buckets=len({k[2] for k in keys}), length_buckets=len({k[4] for k in keys}),
                     graphs_held=graphs["graphs"], graph_pool_bytes=graphs["pool_bytes"],
                     graph_buffers_bytes=graphs["buffers_bytes"])
    return stats


def _load(spec: dict, folder: str, dtype: str, transformers: bool = False):
    import torch

    if transformers:
        from transformers import BartForConditionalGeneration

        return BartForConditionalGeneration.from_pretrained(folder, dtype=getattr(torch, dtype)).to(
            _device(spec)).eval()
    from bart_opt import Bart

    return Bart.from_pretrained(folder, device=_device(spec), dtype=getattr(torch, dtype))


def measure_engine(spec: dict, model, engine: str, inputs: int, repeats: int, reference: list | None) -> dict:
    """One engine at one batch: a memory run (the first call: captures included), then the best of `repeats`
    timed calls; docs/s, peak above the weights, output tokens, the last call's steps and graphs."""
    from bart_opt.bench.vs_transformers import make_batch, memory_run

    device, plan = _device(spec), spec["plan"]
    mode = None if engine == "transformers" else engine
    batch = make_batch(model.config, inputs, plan["max_len"], device, seed=0)
    fn = _call(model, mode, batch, plan["settings"])
    steps = _Steps(model) if mode is not None else None
    out, first_s, log = memory_run(fn, device)
    first = _call_stats(model, steps) if steps is not None else {}
    seconds = first_s
    for _ in range(repeats):
        if steps is not None:
            steps.count = 0
        seconds = min(seconds, _best(fn, device, 1))
    rows = _rows(out, model.config.pad_token_id)
    row = {"engine": engine, "inputs": inputs, "seconds": seconds, "first_call_s": first_s,
           "docs_per_s": inputs / seconds, "peak_bytes": log.report()["peak_bytes"],
           "output_tokens": sum(len(r) - 1 for r in rows), "outputs": rows}
    if steps is not None:  # the timed call's figures; the first call's captures beside them
        row.update(_call_stats(model, steps), **{f"first_call_{k}": first[k] for k in ("captures", "capture_s")
                                                 if k in first})
        del model.decode_step
    if reference is not None:
        row["same_as_transformers"] = sum(a == b for a, b in zip(rows, reference))
    return row


def _reference(spec: dict, inputs: int) -> list | None:
    from pathlib import Path

    path = Path(spec["work"]) / f"transformers-{inputs}.json"
    return json.loads(path.read_text()) if path.exists() else None


def speed(spec: dict) -> None:
    """One engine at each of the plan's batches; transformers' outputs kept for the engines after it."""
    from pathlib import Path

    engine, plan = spec["task"].split(":")[1], spec["plan"]
    model = _load(spec, spec["folders"]["full"], plan["dtype"], transformers=engine == "transformers")
    for inputs in plan["batches"]:
        row = measure_engine(spec, model, engine, inputs, plan["repeats"], _reference(spec, inputs))
        outputs = row.pop("outputs")
        if engine == "transformers":
            (Path(spec["work"]) / f"transformers-{inputs}.json").write_text(json.dumps(outputs))
        emit(spec, row)


def profile(spec: dict) -> None:
    """One profiled generate of a bart_opt mode (`bart_opt.bench.profiling`): launches, kernels, GPU-busy share,
    and launches per decoder step."""
    from bart_opt.bench.profiling import profile_call
    from bart_opt.bench.vs_transformers import make_batch

    engine, plan, device = spec["task"].split(":")[1], spec["plan"], _device(spec)
    model = _load(spec, spec["folders"]["full"], plan["dtype"])
    batch = make_batch(model.config, plan["profile_batch"], plan["max_len"], device, seed=0)
    fn = _call(model, engine, batch, plan["settings"])
    fn()  # captures (static) and warms every kernel: the profile is of a repeat call
    steps = _Steps(model)
    result = profile_call(fn, device)
    row = {"engine": engine, "inputs": plan["profile_batch"], "steps": steps.count, "profile": result}
    if result is not None:
        row["launches_per_step"] = result["launches"] / max(steps.count, 1)
    emit(spec, row)


def predicted_batch(peaks: list[tuple[int, int]], free_bytes: int, cap: int) -> int | None:
    """The batch whose peak, on the line through `peaks` ((inputs, peak bytes) at two batches), fills 90% of
    `free_bytes`, at most `cap` (from 64 up rounded down to a multiple of 8), or None when it is no larger
    than the larger of the two."""
    (n0, p0), (n1, p1) = sorted(peaks)[-2:]
    per_input = (p1 - p0) / (n1 - n0)
    if per_input <= 0:
        return cap
    inputs = min(cap, n1 + int((0.9 * free_bytes - p1) / per_input))
    if inputs >= 64:
        inputs -= inputs % 8
    return inputs if inputs > n1 else None


def probe(spec: dict) -> None:
    """A mode's largest batch: the one its peaks predict fills the free memory, then 0.8x of one that ran out
    of memory, three tries at most; one call each (the memory run, timed). Rows marked "largest" ran."""
    import torch

    engine, plan, device = spec["task"].split(":")[1], spec["plan"], _device(spec)
    model = _load(spec, spec["folders"]["full"], plan["dtype"])
    if device.type == "cuda":
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = plan["probe_bytes"]
    inputs = predicted_batch([tuple(p) for p in spec["peaks"]], free, plan["probe_cap"])
    for _ in range(3):
        if inputs is None:
            emit(spec, {"engine": engine, "probe": True, "skipped": "no larger batch fits"})
            return
        try:
            row = measure_engine(spec, model, engine, inputs, 0, None)
        except torch.OutOfMemoryError as error:
            emit(spec, {"engine": engine, "inputs": inputs, "probe": True, "error": f"OutOfMemoryError: {error}"[:300]})
            model.release_graphs()
            torch.cuda.empty_cache()
            inputs = int(inputs * 0.8)
            continue
        row.pop("outputs")
        emit(spec, {**row, "probe": True, "largest": True})
        return


def gates(spec: dict) -> None:
    """The correctness gates, at the plan's widths with 2+2 layers and `gate_batch` inputs:

    * graphs: the static search with its graphs against the same shapes and buffers stepped eagerly
      (`bart_opt.engine.graphs.EagerSteps`), in the plan's dtype: bit-equal ids (off CUDA, where there are no
      graphs, the persistent-buffer path against the eager search of its own tensors);
    * float32: the static search against the default in float32: equal ids;
    * lengths: the total output length of the static search, the default and transformers in the plan's
      dtype, within `LENGTH_TOLERANCE` of each other (a broken search ends early or runs to the end).
    """
    import torch

    from bart_opt.bench.device import LENGTH_TOLERANCE
    from bart_opt.bench.vs_transformers import make_batch
    from bart_opt.engine.graphs import EagerSteps, StepGraphs

    plan, device = spec["plan"], _device(spec)
    folder = spec["folders"]["gates"]
    model = _load(spec, folder, plan["dtype"])
    batch = make_batch(model.config, plan["gate_batch"], plan["max_len"], device, seed=1)
    settings, pad = plan["settings"], model.config.pad_token_id
    static = _call(model, "bart_opt_static", batch, settings)
    steps = _Steps(model)
    if device.type != "cuda":
        model._step_graphs = StepGraphs(device, backend=EagerSteps())
    graphed = static()
    stats = _call_stats(model, steps)
    model._step_graphs = StepGraphs(device, backend=EagerSteps()) if device.type == "cuda" else None
    eager = static()
    emit(spec, {"gate": "graphs", "passed": bool(torch.equal(graphed, eager)), "dtype": plan["dtype"],
             "compared": "graph replays / the same shapes stepped eagerly" if device.type == "cuda"
             else "persistent buffers, stepped eagerly / the eager search's own tensors", **stats})
    model.release_graphs()

    default = _rows(_call(model, "bart_opt", batch, settings)(), pad)
    hf = _load(spec, folder, plan["dtype"], transformers=True)
    reference = _rows(_call(hf, None, batch, settings)(), pad)
    del hf
    totals = {"static": sum(len(r) for r in _rows(graphed, pad)), "default": sum(len(r) for r in default),
              "transformers": sum(len(r) for r in reference)}
    spread = (max(totals.values()) - min(totals.values())) / max(min(totals.values()), 1)
    emit(spec, {"gate": "lengths", "passed": spread <= LENGTH_TOLERANCE, "dtype": plan["dtype"], "totals": totals,
                "spread": spread})

    model = _load(spec, folder, "float32")
    fp32_static = _rows(_call(model, "bart_opt_static", batch, settings)(), pad)
    fp32_default = _rows(_call(model, "bart_opt", batch, settings)(), pad)
    same = sum(a == b for a, b in zip(fp32_static, fp32_default))
    emit(spec, {"gate": "float32", "passed": same == len(fp32_static), "dtype": "float32", "same": same,
                "inputs": len(fp32_static)})


TASKS = {"checkpoints": checkpoints, "env": environment, "gates": gates, "speed": speed, "profile": profile,
         "probe": probe}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
