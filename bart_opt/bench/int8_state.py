"""A/B of the int8 mode's attention state: float32 (torch's attention, the cache reordered by copy) against
bfloat16 (bart_opt's kernel, a row table), on one int8 model, the peer benchmark's CNN-length documents, runs
interleaved; prints each run, then the best of each and the ratio as JSON (docs/cpu.md, "The bfloat16 attention
state"). With ``--profile`` it profiles one generate per state instead (torch.profiler, CPU) and prints the top
operators by self time as a Markdown table each, with their share of the call.

    python3 -m bart_opt.bench.int8_state [THREADS [DOCS]] [--profile]   # default 2 threads, 12 documents
"""

import json
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from transformers import BartConfig

from bart_opt import Bart
from bart_opt.engine import native
from bart_opt.bench.workloads import CNN_SETTINGS, build_random_checkpoint
from bart_opt.bench.vs_peers import make_docs
from bart_opt.bench.engines import pad_batch

STATES = (("float32 state", None), ("bfloat16 state", torch.bfloat16))
TOP_OPS = 12


def top_ops_table(events, top: int = TOP_OPS) -> str:
    """A Markdown table of the `top` operators by self CPU time, from a profiler's `key_averages()`.

    Each row: the operator, its calls, its self time in seconds and its share of all operators' self time
    (the shares of the whole call, since self times partition it).
    """
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1.0
    lines = ["| operator | calls | self seconds | share |", "|---|---:|---:|---:|"]
    for e in rows[:top]:
        lines.append(f"| `{e.key}` | {e.count} | {e.self_cpu_time_total / 1e6:.2f} | "
                     f"{100 * e.self_cpu_time_total / total:.1f}% |")
    return "\n".join(lines)


def _recorded(function, label: str):
    """`function`, recorded by the profiler as one operator named `label` (bart_opt's kernel is not a torch
    operator, so without this its time would be missing from the table)."""
    def call(*args, **kwargs):
        with record_function(label):
            return function(*args, **kwargs)
    return call


def profile_states(model, ids, mask) -> None:
    """Profile one generate per attention state and print each one's top operators."""
    kernel_call = native.decode_attention
    native.decode_attention = _recorded(kernel_call, "bart_opt::decode_attention")
    try:
        for name, dtype in STATES:
            model.state_dtype = dtype
            with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
                model.generate(ids, attention_mask=mask, **CNN_SETTINGS)
            print(f"\n#### int8, {name} (uses_kernel={model.uses_kernel()})\n")
            print(top_ops_table(prof.key_averages()), flush=True)
    finally:
        native.decode_attention = kernel_call


def main() -> None:
    """Run the A/B (arguments: threads, documents, optionally --profile) and print it."""
    args = [a for a in sys.argv[1:] if a != "--profile"]
    threads = int(args[0]) if args else 2
    docs_n = int(args[1]) if len(args) > 1 else 12
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_random_checkpoint(tmp, "base", 0, 1.5)
        cfg = BartConfig.from_pretrained(folder)
        docs = make_docs(cfg, docs_n, 1024, 0)
        model = Bart.from_pretrained(folder, quantize="int8").eval()
    ids, mask = pad_batch(docs, cfg.pad_token_id)
    print("kernel isa", native.kernel_isa(), "threads", threads, "docs", docs_n, flush=True)
    if "--profile" in sys.argv[1:]:
        profile_states(model, ids, mask)
        return
    times = {"float32 state": [], "bfloat16 state": []}
    outs = {}
    for r in range(3):
        for name, dtype in STATES:
            model.state_dtype = dtype
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=mask, **CNN_SETTINGS)
            times[name].append(time.perf_counter() - start)
            outs[name] = out
            print(f"  run {r+1} {name} uses_kernel={model.uses_kernel()} {times[name][-1]:.2f} s", flush=True)
    a, b = min(times["float32 state"]), min(times["bfloat16 state"])
    same = sum(torch.equal(x, y) for x, y in zip(outs["float32 state"], outs["bfloat16 state"]))
    print(json.dumps({"float32_state_s": a, "bfloat16_state_s": b, "speedup": a / b,
                      "rows_identical": f"{same}/{len(docs)}"}))


if __name__ == "__main__":
    main()
