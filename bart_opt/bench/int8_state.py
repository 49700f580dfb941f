"""A/B of the int8 mode's attention state: float32 (torch's attention, the cache reordered by copy) against
bfloat16 (bart_opt's kernel, a row table), on one int8 model, the peer benchmark's CNN-length documents, runs
interleaved; prints each run, then the best of each and the ratio as JSON (docs/cpu.md, "The bfloat16 attention
state").

    python3 -m bart_opt.bench.int8_state [THREADS [DOCS]]      # default 2 threads, 12 documents
"""

import json
import sys
import tempfile
import time

import torch
from transformers import BartConfig

from bart_opt import Bart, native
from bart_opt.bench.workloads import CNN_SETTINGS, build_random_checkpoint
from bart_opt.bench.vs_peers import make_docs
from bart_opt.bench.engines import pad_batch



def main() -> None:
    """Run the A/B (arguments: threads, documents) and print it."""
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    docs_n = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_random_checkpoint(tmp, "base", 0, 1.5)
        cfg = BartConfig.from_pretrained(folder)
        docs = make_docs(cfg, docs_n, 1024, 0)
        model = Bart.from_pretrained(folder, quantize="int8").eval()
    ids, mask = pad_batch(docs, cfg.pad_token_id)
    print("kernel isa", native.kernel_isa(), "threads", threads, "docs", docs_n, flush=True)
    times = {"float32 state": [], "bfloat16 state": []}
    outs = {}
    for r in range(3):
        for name, dtype in (("float32 state", None), ("bfloat16 state", torch.bfloat16)):
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
