"""Side-by-side benchmark: bart_opt against transformers' BartForConditionalGeneration.

Reproduces the seed's experiment in one run: a BART-shaped model (random weights
at a named size, or a real checkpoint with ``--model``), 6 inputs of uneven
length padded to the longest, and for each engine (transformers; bart_opt in its
default mode; bart_opt with ``exact=True``, unless ``--skip-exact``; with ``--el-attention``, bart_opt's
default mode with EL-attention, ``bart_opt_el``)

- ``forward``: one teacher-forced pass with a full-length decoder input;
- ``generate_9``: ``generate()`` for 9 new tokens with 4 beams;
- ``throughput_cnn``: ``generate()`` at the CNN/DailyMail settings (4 beams,
  length_penalty 2.0, min_length 56, max_length 142, no_repeat_ngram_size 3,
  early_stopping), as samples/s and generated tokens/s.

With ``--static`` it adds ``bart_opt_static`` (`Bart.static`) and a throughput table per engine:
docs/s, peak memory, and on CUDA GPU-busy seconds and kernel launches of one profiled generate
(:mod:`bart_opt.bench.profiling`; "n/a" elsewhere).

    bart-opt bench --size large --device cuda --dtype float16 --static --tasks throughput_cnn

Memory is the peak above what was allocated when the call started (weights and
inputs): live tensor bytes on CPU (:class:`bart_opt.engine.memory.LiveTensorCounter`),
the CUDA caching allocator's true peak on GPU. Each task runs once under the
memory log (which also warms up) and then ``--repeats`` times untimed by any
counter; the best time is reported. Both engines load the same checkpoint folder.

    python -m bart_opt.bench --size tiny --json bench.json --plot bench.png
    bart-opt bench --size large --device cuda --dtype float16

With ``--peers ctranslate2`` it compares engines instead (transformers, bart_opt in float32 and
bfloat16, CTranslate2 in float32 and int8) on a CNN-like workload: see :mod:`bart_opt.bench.vs_peers`.

    bart-opt bench --peers ctranslate2 --json peers.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from bart_opt import extras
from bart_opt.engine import hardware
from bart_opt.bench.isa import ISAS
from bart_opt.bench.workloads import CNN_SETTINGS, DEFAULT_MAX_LEN, SIZES, STEP_SETTINGS, build_random_checkpoint
from bart_opt.engine.memory import MemoryLog, format_bytes, measure
from bart_opt.engine.quantize import MODES as QUANTIZE
from bart_opt.engine.quantize import packed_bytes

TASKS = ("forward", "generate_9", "throughput_cnn")
ENGINES = ("transformers", "bart_opt", "bart_opt_exact")
EL_ENGINE = "bart_opt_el"  # with --el-attention
MODE_FLAGS = {  # one Bart model for all of bart_opt's engines; the engine name sets its mode
    "bart_opt": (),
    "bart_opt_exact": ("exact",),
    "bart_opt_static": ("static",),
    EL_ENGINE: ("el_attention",),
    "bart_opt_el_static": ("el_attention", "static"),  # the device check's (bart_opt.bench.device)
}
OURS = tuple(MODE_FLAGS)
LENGTH_FRACTIONS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)  # uneven inputs, the longest sets the padded length
PEERS = ("ctranslate2",)  # engines --peers can add; see vs_peers.py
DEFAULT_PEERS_EOS_BIAS = 1.5  # random bart-base weights then stop after 75-110 tokens instead of running to 142


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bart-opt bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES),
                   help="random-weight model shape (default large; base with --peers)")
    p.add_argument("--model", help="a real checkpoint folder or hub id instead of random weights")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when available)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--quantize", choices=QUANTIZE, help="bart_opt's int8 mode (CPU; --dtype for the rest, no exact mode)")
    p.add_argument("--batch-size", type=int, default=6, help="inputs per call (default 6)")
    p.add_argument("--max-len", type=int, help="longest input, all padded to it (default 1024; 128 for tiny)")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated subset of {','.join(TASKS)}")
    p.add_argument("--skip-throughput", action="store_true", help="leave out throughput_cnn")
    p.add_argument("--throughput-batch-size", type=int, help="batch for throughput_cnn (default --batch-size)")
    p.add_argument("--throughput-max-len", type=int, help="input length for throughput_cnn (default --max-len)")
    p.add_argument("--repeats", type=int,
                   help="timed runs per task and engine, best kept (default 1; 3 with --peers); "
                        "0 reports the time of the memory run")
    p.add_argument("--skip-overhead", action="store_true", help="leave out the logging-overhead measurement")
    p.add_argument("--skip-exact", action="store_true", help="leave out bart_opt's exact mode")
    p.add_argument("--static", action="store_true", help="add bart_opt's static search (bart_opt_static)")
    p.add_argument("--el-attention", action="store_true",
                   help="add bart_opt's default mode with EL-attention (engine bart_opt_el)")
    p.add_argument("--hf-no-cache", action="store_true",
                   help="call transformers' forward with use_cache=False (default: as users call it)")
    p.add_argument("--eos-bias", type=float,
                   help="random weights only: raise the EOS logit so beams finish at varied lengths "
                        "(default 0; 1.5 with --peers)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's; 2 per engine with --peers)")
    p.add_argument("--peers", type=_peer_list, default=[],
                   help="compare with these engines on the CNN workload instead of running the tasks: ctranslate2")
    p.add_argument("--docs", type=int, default=12, help="with --peers: documents in the batch (default 12)")
    p.add_argument("--isa", choices=ISAS, default="native",
                   help="with --peers: limit every engine's libraries to this instruction set (avx2: see bart_opt.bench.isa)")
    p.add_argument("--engines", type=lambda text: [e for e in text.split(",") if e],
                   help="with --peers: only these rows, by label (e.g. 'transformers float32,bart_opt int8')")
    p.add_argument("--json", dest="json_path", help="write the results as JSON here")
    p.add_argument("--plot", dest="plot_path", help="write a PNG: memory bars and memory over one generate call")
    args = p.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t and not (args.skip_throughput and t == "throughput_cnn")]
    unknown = sorted(set(args.tasks) - set(TASKS))
    if unknown:
        p.error(f"unknown task(s) {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    peers = bool(args.peers)
    if args.quantize and (peers or args.device not in ("cpu", "auto")):
        p.error("--quantize is for bart_opt against transformers on a CPU (--peers has its own int8 rows)")
    if (args.isa != "native" or args.engines) and not peers:
        p.error("--isa and --engines go with --peers")
    args.skip_exact = args.skip_exact or bool(args.quantize)  # exact mode is float arithmetic: int8 refuses it
    args.size = args.size or ("base" if peers else "large")
    args.repeats = (3 if peers else 1) if args.repeats is None else args.repeats
    args.eos_bias = (DEFAULT_PEERS_EOS_BIAS if peers else 0.0) if args.eos_bias is None else args.eos_bias
    if peers:
        args.threads = args.threads or 2
        args.max_len = args.max_len or DEFAULT_MAX_LEN[args.size]
    if args.batch_size < 1 or args.repeats < 0 or args.docs < 1:
        p.error("--batch-size and --docs must be >= 1 and --repeats >= 0")
    return args


def _peer_list(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = sorted(set(names) - set(PEERS)) if names else [repr(text)]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    return list(dict.fromkeys(names))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bart-opt bench: --device cuda given but no CUDA device is available")
    return device


def load_engines(folder: str, device: torch.device, dtype: torch.dtype, exact: bool = True,
                 quantize: str | None = None, static: bool = False,
                 el_attention: bool = False) -> dict[str, torch.nn.Module]:
    """The engines from the same folder: transformers' BartForConditionalGeneration and bart_opt.Bart
    (one model object for all of its modes: the weights are loaded once), quantized as `quantize` says."""
    from transformers import BartForConditionalGeneration
    from transformers.utils import logging as hf_logging

    from bart_opt import Bart

    hf_logging.set_verbosity_error()  # e.g. "max_new_tokens and max_length both set": expected here
    hf_logging.disable_progress_bar()
    hf = BartForConditionalGeneration.from_pretrained(folder, dtype=dtype).to(device).eval()
    ours = Bart.from_pretrained(folder, device=device, dtype=dtype, quantize=quantize).eval()
    engines = {"transformers": hf, "bart_opt": ours}
    if exact:
        engines["bart_opt_exact"] = ours
    if static:
        engines["bart_opt_static"] = ours
    if el_attention:
        engines[EL_ENGINE] = ours
    return engines


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters and buffers, tied tensors counted once, and of int8 weights packed outside them."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values()) + packed_bytes(model)


def make_batch(config, batch_size: int, max_len: int, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """Random token ids of uneven lengths (the longest `max_len`), right-padded; bos ... eos like a tokenizer."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [max(3, round(max_len * LENGTH_FRACTIONS[i % len(LENGTH_FRACTIONS)])) for i in range(batch_size)]
    ids = torch.full((batch_size, max_len), config.pad_token_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros(batch_size, max_len, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(4, config.vocab_size, (n,), generator=gen)
        ids[row, 0], ids[row, n - 1] = config.bos_token_id, config.eos_token_id
        mask[row, :n] = 1
    decoder_ids = torch.full_like(ids, config.pad_token_id)  # input_ids shifted right, as transformers does
    decoder_ids[:, 0] = config.decoder_start_token_id
    decoder_ids[:, 1:] = ids[:, :-1]
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "decoder_input_ids": decoder_ids.to(device)}


def set_mode(model, engine: str) -> None:
    """Put the one bart_opt model in the mode `engine` (one of `OURS`) names: every flag off first
    (exact excludes the others), then the engine's own on."""
    model.static = model.el_attention = model.exact = False
    for flag in MODE_FLAGS[engine]:
        setattr(model, flag, True)


def task_call(task: str, engine: str, model, batch: dict, hf_no_cache: bool):
    """A zero-argument callable running `task` on `engine` under inference mode; returns a tensor."""
    ids, mask, dec = batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"]

    def forward():
        with torch.inference_mode():
            if engine == "transformers":
                extra = {"use_cache": False} if hf_no_cache else {}
                return model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, **extra).logits
            set_mode(model, engine)
            return model(ids, attention_mask=mask, decoder_input_ids=dec)

    def generate(settings):
        def run():
            with torch.inference_mode():
                if engine == "transformers":
                    return model.generate(input_ids=ids, attention_mask=mask, **settings)
                set_mode(model, engine)
                return model.generate(ids, attention_mask=mask, **settings)
        return run

    return {"forward": forward, "generate_9": generate(STEP_SETTINGS), "throughput_cnn": generate(CNN_SETTINGS)}[task]


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device):
    """(output, seconds) of one call, synchronized on CUDA."""
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - start


def memory_run(fn, device: torch.device, model=None):
    """One call under an active MemoryLog (attached to `model` when given); (output, seconds, log)."""
    with measure(device) as log:
        if model is not None:
            model.attach_log(log)
        try:
            out, seconds = timed(fn, device)
        finally:
            if model is not None:
                model.attach_log(None)
    return out, seconds, log


def run_task(task: str, engines: dict, batch: dict, device: torch.device, args) -> tuple[list[dict], MemoryLog | None]:
    """Memory run then timed runs for each engine, interleaved; result rows and bart_opt's memory log."""
    calls = {name: task_call(task, name, model, batch, args.hf_no_cache) for name, model in engines.items()}
    outputs, rows, ours_log = {}, {}, None
    for name, model in engines.items():
        out, seconds, log = memory_run(calls[name], device, model if name in OURS else None)
        _progress(f"  {name}: memory run {seconds:.2f} s, peak {format_bytes(log.report()['peak_bytes'])}")
        outputs[name] = out
        if name == "bart_opt":
            ours_log = log
        rows[name] = {"engine": name, "task": task, "peak_bytes": log.report()["peak_bytes"],
                      "weights_bytes": weights_bytes(model), "seconds": seconds, "peak_source": log.peak_source,
                      "batch_size": batch["input_ids"].shape[0], "input_len": batch["input_ids"].shape[1],
                      "timed_with_counter": args.repeats == 0}
    best = {name: float("inf") for name in engines}
    for _ in range(args.repeats):
        for name in engines:
            _, seconds = timed(calls[name], device)
            _progress(f"  {name}: timed run {seconds:.2f} s")
            best[name] = min(best[name], seconds)
    for name in engines:
        if args.repeats:
            rows[name]["seconds"] = best[name]
    _add_output_stats(task, rows, outputs, engines["bart_opt"].config.pad_token_id)
    return [rows[name] for name in engines], ours_log


def _add_output_stats(task: str, rows: dict, outputs: dict, pad_id: int) -> None:
    """Output agreement (and for generation, throughput figures) on the result rows."""
    ref = outputs["transformers"]
    for name in OURS:
        if name not in outputs:
            continue
        ours = outputs[name]
        if task == "forward":
            diff = (ref.float() - ours.float()).abs().max().item() if ref.shape == ours.shape else float("inf")
            rows[name]["max_abs_logit_diff"] = diff
        else:
            rows[name]["equal_to_transformers"] = bool(ref.shape == ours.shape and torch.equal(ref, ours.to(ref.device)))
    if task == "forward":
        return
    for name, seqs in outputs.items():
        generated = int((seqs[:, 1:] != pad_id).sum())  # tokens after the decoder start token
        row = rows[name]
        row.update(output_len=seqs.shape[1], generated_tokens=generated,
                   samples_per_s=seqs.shape[0] / row["seconds"], tokens_per_s=generated / row["seconds"])


def _ratio(ours: dict, ref: dict) -> dict:
    entry = {
        "peak": ours["peak_bytes"] / ref["peak_bytes"] if ref["peak_bytes"] else None,
        "seconds": ours["seconds"] / ref["seconds"],
        "speedup": ref["seconds"] / ours["seconds"],
    }
    if "equal_to_transformers" in ours:
        entry["outputs_equal"] = ours["equal_to_transformers"]
    if "max_abs_logit_diff" in ours:
        entry["max_abs_logit_diff"] = ours["max_abs_logit_diff"]
    return entry


def compute_ratios(results: list[dict]) -> dict:
    """Per task: bart_opt / transformers for peak memory and seconds, the speed-up, output agreement;
    under "exact" (and "el") the same for exact mode (EL-attention), plus its peak and seconds relative to
    the default's."""
    ratios = {}
    for task in dict.fromkeys(r["task"] for r in results):
        by = {r["engine"]: r for r in results if r["task"] == task}
        ratios[task] = _ratio(by["bart_opt"], by["transformers"])
        for mode, engine in (("exact", "bart_opt_exact"), ("static", "bart_opt_static"), ("el", EL_ENGINE)):
            if engine in by:
                other, default = by[engine], by["bart_opt"]
                ratios[task][mode] = {
                    **_ratio(other, by["transformers"]),
                    "peak_vs_default": other["peak_bytes"] / default["peak_bytes"] if default["peak_bytes"] else None,
                    "seconds_vs_default": other["seconds"] / default["seconds"],
                }
    return ratios


def measure_overhead(model, batch: dict, device: torch.device, repeats: int) -> dict:
    """What logging costs: one log_mem call, and generate_9 with the tensor counter / an attached log."""
    with measure("cpu") as log:
        start = time.perf_counter()
        for _ in range(2000):
            log.log_mem("overhead probe")
        log_mem_s = (time.perf_counter() - start) / 2000
    start = time.perf_counter()
    for _ in range(20000):
        model.log_mem("detached probe %d", 1)
    detached_s = (time.perf_counter() - start) / 20000

    call = task_call("generate_9", "bart_opt", model, batch, hf_no_cache=False)
    best = {"plain": float("inf"), "counter": float("inf"), "counter_and_log": float("inf")}
    for _ in range(max(repeats, 1)):
        best["plain"] = min(best["plain"], timed(call, device)[1])
        with measure(device):
            best["counter"] = min(best["counter"], timed(call, device)[1])
        best["counter_and_log"] = min(best["counter_and_log"], memory_run(call, device, model)[1])
    return {
        "log_mem_us": log_mem_s * 1e6,
        "detached_log_mem_us": detached_s * 1e6,
        "generate_9_seconds": best,
        "counter_slowdown": best["counter"] / best["plain"],
        "counter_and_log_slowdown": best["counter_and_log"] / best["plain"],
        "counter_applies": device.type != "cuda",
    }


def describe_batches(config: dict) -> str:
    """The batches the run's tasks used, as the table's title gives them."""
    batches = [f"{config['batch_size']} inputs padded to {config['max_len']} tokens"]
    throughput = (config["throughput_batch_size"], config["throughput_max_len"])
    if "throughput_cnn" in config["tasks"] and throughput != (config["batch_size"], config["max_len"]):
        other = f"throughput_cnn: {throughput[0]} inputs padded to {throughput[1]} tokens"
        batches = [other] if config["tasks"] == ["throughput_cnn"] else [*batches, other]
    return "; ".join(batches)


def format_tables(config: dict, results: list[dict], ratios: dict, overhead: dict | None) -> str:
    """Markdown: one row per engine and task, then the ratios, then logging overhead."""
    lines = [
        f"### bart-opt bench: {config['model']} on {config['device']} ({config['dtype']}"
        + (f", bart_opt {config['quantize']}" if config.get("quantize") else "") + f"), {describe_batches(config)}",
        "weights: " + ", ".join(f"{r['engine']} {format_bytes(r['weights_bytes'])}" for r in results
                                if r["task"] == results[0]["task"] and r["engine"] != "bart_opt_exact")
        + "; memory = peak above weights and inputs "
        f"({results[0]['peak_source']}); time = " + (f"best of {config['repeats']} timed run(s)" if config["repeats"]
                                                 else "the memory run (counter on)"),
        *([f"CPU: {hardware.probe().describe()}"] if config.get("cpu") else []),
        "",
        "| task | engine | peak memory | seconds | samples/s | generated tokens/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        sps = f"{r['samples_per_s']:.3f}" if "samples_per_s" in r else ""
        tps = f"{r['tokens_per_s']:.1f}" if "tokens_per_s" in r else ""
        peak = format_bytes(r["peak_bytes"])
        lines.append(f"| {r['task']} | {r['engine']} | {peak} | {r['seconds']:.3f} | {sps} | {tps} |")
    lines += ["", "| task | mode | peak (bart_opt / transformers) | time (bart_opt / transformers) | speed-up "
              "| same output | mode / default: peak, time |", "|---|---|---:|---:|---:|---|---|"]
    for task, default in ratios.items():
        for mode in ("default", "exact", "static", "el"):
            q = default if mode == "default" else default.get(mode)
            if q is None:
                continue
            same = ("yes" if q["outputs_equal"] else "**NO**") if "outputs_equal" in q else (
                f"max logit diff {q['max_abs_logit_diff']:.2e}")
            peak = f"{q['peak']:.3f}x" if q["peak"] is not None else "n/a"
            versus = ""
            if mode != "default":
                versus = (f"{q['peak_vs_default']:.2f}x, " if q["peak_vs_default"] is not None else "n/a, ") + (
                    f"{q['seconds_vs_default']:.2f}x")
            lines.append(f"| {task} | {mode} | {peak} | {q['seconds']:.3f}x | {q['speedup']:.2f}x | {same} | {versus} |")
    if overhead:
        g = overhead["generate_9_seconds"]
        lines += ["", "| logging overhead | value |", "|---|---:|",
                  f"| one log_mem call (CPU, active log) | {overhead['log_mem_us']:.1f} µs |",
                  f"| one log_mem call, no log attached | {overhead['detached_log_mem_us']:.3f} µs |",
                  f"| bart_opt generate_9, plain | {g['plain']:.3f} s |",
                  f"| ... with the live tensor counter | {overhead['counter_slowdown']:.2f}x |",
                  f"| ... with the counter and a log attached | {overhead['counter_and_log_slowdown']:.2f}x |"]
    return "\n".join(lines)


def write_plot(path: str, results: list[dict], log: MemoryLog | None, title: str) -> None:
    """Bars of peak memory per task and engine; memory over time of one bart_opt generate call."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mib = 2**20
    fig, (bars, curve) = plt.subplots(1, 2, figsize=(12, 4.5))
    tasks = list(dict.fromkeys(r["task"] for r in results))
    engines = list(dict.fromkeys(r["engine"] for r in results))
    width = 0.8 / len(engines)
    for k, engine in enumerate(engines):
        peak = {r["task"]: r["peak_bytes"] / mib for r in results if r["engine"] == engine}
        peaks = [peak[t] for t in tasks]
        xs = [i + (k - (len(engines) - 1) / 2) * width for i in range(len(tasks))]
        drawn = bars.bar(xs, peaks, width, label=engine)
        bars.bar_label(drawn, fmt="%.0f", fontsize=8)
    bars.set_xticks(range(len(tasks)), tasks)
    bars.set_ylabel("peak above weights (MiB)")
    bars.set_title("peak memory per call")
    bars.legend()
    if log is not None and log.rows():
        _plot_log(curve, log, mib)
    curve.set_xlabel("seconds into generate")
    curve.set_ylabel("MiB above weights")
    curve.set_title("bart_opt generate: memory over time (MemoryLog rows)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_log(ax, log: MemoryLog, unit: int) -> None:
    """A log's rows as memory over time, from the log's start (0 s, nothing allocated); rare phases shaded."""
    rows = log.rows()
    t = [0.0] + [r["t"] for r in rows]
    ax.plot(t, [0.0] + [r["mem_bytes"] / unit for r in rows], marker=".", label="allocated at row")
    ax.step(t, [0.0] + [r["mem_peak_bytes"] / unit for r in rows], where="pre", label="true peak since previous row")
    phases = log.phases()
    counts = {name: sum(p["name"] == name for p in phases) for name in {p["name"] for p in phases}}
    colors = iter(("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:gray"))
    for name in sorted(n for n, c in counts.items() if c <= 3):
        color = next(colors, "tab:gray")
        for k, p in enumerate(q for q in phases if q["name"] == name):
            ax.axvspan(p["start_t"], p["start_t"] + p["seconds"], color=color, alpha=0.15,
                       label=f"phase {name}" if k == 0 else None)
    ax.legend(fontsize=8)


def _run_all(args, engines: dict, device: torch.device) -> tuple[list[dict], MemoryLog | None]:
    """Every requested task; returns the result rows and the bart_opt generate log to plot."""
    cfg = engines["bart_opt"].config
    batch = make_batch(cfg, args.batch_size, args.max_len, device, args.seed)
    results, plot_log = [], None
    for task in args.tasks:
        task_batch = batch
        if task == "throughput_cnn" and (args.throughput_batch_size or args.throughput_max_len):
            task_batch = make_batch(cfg, args.throughput_batch_size or args.batch_size,
                                    args.throughput_max_len or args.max_len, device, args.seed)
        _progress(f"running {task} ...")
        rows, log = run_task(task, engines, task_batch, device, args)
        results += rows
        if task != "forward":
            plot_log = log
    return results, plot_log


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bart_opt.bench`` and ``bart-opt bench``; returns the exit status."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _bench(args)
    finally:
        torch.set_num_threads(threads)  # main() may be called in-process (tests, the CLI)


def _bench(args) -> int:
    if args.peers:
        return _bench_peers(args)
    if args.plot_path and (absent := extras.missing("bench")):  # before the runs, not after them
        print(f"bart-opt bench: error: {extras.MissingExtra('--plot', 'bench', absent)}", file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="bart-opt-bench-") as tmp:
        folder = args.model or build_random_checkpoint(tmp, args.size, args.seed, args.eos_bias)
        try:
            engines = load_engines(folder, device, dtype, exact=not args.skip_exact, quantize=args.quantize,
                                   static=args.static, el_attention=args.el_attention)
        except (OSError, ValueError) as exc:
            print(f"bart-opt bench: cannot load {folder}: {exc}", file=sys.stderr)
            return 2
    cfg = engines["bart_opt"].config
    if args.max_len is None:
        args.max_len = min(DEFAULT_MAX_LEN[args.size] if not args.model else 1024, cfg.max_position_embeddings)
    import transformers

    config = {
        "model": args.model or f"random {args.size}", "size": None if args.model else args.size,
        "shape": {k: getattr(cfg, k) for k in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                                                "decoder_ffn_dim", "vocab_size", "max_position_embeddings")},
        "device": str(device), "dtype": args.dtype, "quantize": args.quantize, "batch_size": args.batch_size, "max_len": args.max_len,
        "lengths": [max(3, round(args.max_len * LENGTH_FRACTIONS[i % 6])) for i in range(args.batch_size)],
        "tasks": args.tasks, "repeats": args.repeats, "generate_9_settings": STEP_SETTINGS,
        "throughput_settings": CNN_SETTINGS, "throughput_batch_size": args.throughput_batch_size or args.batch_size,
        "throughput_max_len": args.throughput_max_len or args.max_len, "hf_forward_use_cache": not args.hf_no_cache,
        "hf_attn_implementation": getattr(engines["transformers"].config, "_attn_implementation", None),
        "eos_bias": args.eos_bias, "el_attention": args.el_attention, "threads": torch.get_num_threads(),
        "cpu": hardware.probe().as_dict() if device.type == "cpu" else None,
        "torch": torch.__version__, "transformers": transformers.__version__,
    }
    results, plot_log = _run_all(args, engines, device)
    ratios = compute_ratios(results)
    overhead = None
    if not args.skip_overhead:
        _progress("measuring logging overhead ...")
        batch = make_batch(cfg, args.batch_size, args.max_len, device, args.seed)
        overhead = measure_overhead(engines["bart_opt"], batch, device, args.repeats)
    profiles = None
    if args.static and "throughput_cnn" in args.tasks:
        profiles = profile_throughput(args, engines, device)
    print(format_tables(config, results, ratios, overhead))
    if profiles is not None:
        print("\n" + format_throughput(results, profiles))
    if args.json_path:
        payload = {"config": config, "results": results, "ratios": ratios, "log_overhead": overhead,
                   **({"profiles": profiles} if profiles is not None else {})}
        Path(args.json_path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    if args.plot_path:
        write_plot(args.plot_path, results, plot_log, f"{config['model']}, {config['device']}, {config['dtype']}")
    return 0


def profile_throughput(args, engines: dict, device: torch.device) -> dict[str, dict | None]:
    """One profiled throughput_cnn generate per engine (`bart_opt.bench.profiling`); None per engine off CUDA."""
    from bart_opt.bench.profiling import profile_call

    cfg = engines["bart_opt"].config
    batch = make_batch(cfg, args.throughput_batch_size or args.batch_size, args.throughput_max_len or args.max_len,
                       device, args.seed)
    _progress("profiling throughput_cnn ...")
    return {name: profile_call(task_call("throughput_cnn", name, model, batch, args.hf_no_cache), device)
            for name, model in engines.items()}


def format_throughput(results: list[dict], profiles: dict[str, dict | None]) -> str:
    """Markdown: throughput_cnn per engine, with the GPU's figures of one profiled generate ("n/a" off CUDA)."""
    lines = ["| engine | docs/s | peak memory | GPU-busy s / generate | of wall time | kernel launches / generate "
             "| kernels run |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if r["task"] != "throughput_cnn":
            continue
        prof = profiles.get(r["engine"])
        gpu = ("n/a",) * 4 if prof is None else (
            f"{prof['gpu_busy_s']:.3f}", f"{prof['gpu_busy_fraction']:.0%}", str(prof["launches"]), str(prof["kernels"]))
        lines.append(f"| {r['engine']} | {r['samples_per_s']:.2f} | {format_bytes(r['peak_bytes'])} | " + " | ".join(gpu)
                     + " |")
    return "\n".join(lines)


def _bench_peers(args) -> int:
    import importlib.util

    missing = [name for name in args.peers if importlib.util.find_spec(name) is None]
    if missing:
        print(f"bart-opt bench: --peers {','.join(missing)} needs {' '.join(missing)}: pip install 'bart-opt[peers]'",
              file=sys.stderr)
        return 2
    from bart_opt.bench import vs_peers

    return vs_peers.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
