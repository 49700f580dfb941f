"""EL-attention's speed against the default mode: one bart_opt model, the two modes interleaved, best of N.

    python -m bart_opt.bench.el_speed --size base --inputs 2 --max-len 128 --repeats 3

Random weights of `--size` (EOS logit raised by 1.5, so that outputs end at varied lengths), inputs of
uneven length padded to `--max-len` (`bart_opt.bench.vs_transformers.make_batch`), the CNN settings (4
beams, up to 142 tokens). A first round warms up; then `--repeats` rounds, each running the default and
EL-attention one after the other, and the best of each is kept: the ratio is of two figures measured
side by side under the same load. `bart-opt bench --el-attention` also times both, with transformers
and the memory counter, which makes it too slow for this on a busy 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch

from bart_opt.bench.vs_transformers import EL_ENGINE, make_batch, set_mode, timed
from bart_opt.bench.workloads import CNN_SETTINGS, SIZES, build_random_checkpoint

ENGINES = ("bart_opt", EL_ENGINE)


def measure(size: str, inputs: int, max_len: int, repeats: int, device: torch.device) -> dict:
    """{"seconds": {engine: best}, "ratio": el / default, "same_ids": bool, "output_len": int}."""
    from bart_opt import Bart

    with tempfile.TemporaryDirectory(prefix="bart-opt-el-speed-") as tmp:
        model = Bart.from_pretrained(build_random_checkpoint(tmp, size, seed=0, eos_bias=1.5), device=device)
    batch = make_batch(model.config, inputs, max_len, device, seed=0)
    best = dict.fromkeys(ENGINES, float("inf"))
    outputs = {}

    def call():
        return model.generate(batch["input_ids"], batch["attention_mask"], **CNN_SETTINGS)

    for round_ in range(repeats + 1):  # round 0 warms up
        for engine in ENGINES:
            set_mode(model, engine)
            outputs[engine], seconds = timed(call, device)
            print(f"  {engine} round {round_}: {seconds:.2f} s", file=sys.stderr, flush=True)
            if round_:
                best[engine] = min(best[engine], seconds)
    a, b = outputs["bart_opt"], outputs[EL_ENGINE]
    return {"seconds": best, "ratio": best[EL_ENGINE] / best["bart_opt"],
            "same_ids": a.shape == b.shape and bool(torch.equal(a, b)), "output_len": a.shape[1]}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bart_opt.bench.el_speed``: prints one markdown table."""
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.el_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="base", choices=sorted(SIZES))
    p.add_argument("--inputs", type=int, default=2)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    if args.inputs < 1 or args.max_len < 3 or args.repeats < 1:
        p.error("--inputs must be >= 1, --max-len >= 3 and --repeats >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    r = measure(args.size, args.inputs, args.max_len, args.repeats, torch.device(args.device))
    s = r["seconds"]
    print(f"### EL-attention vs default: random {args.size}, {args.inputs} inputs padded to {args.max_len}, "
          f"CNN settings, {args.device}, {torch.get_num_threads()} threads, best of {args.repeats} interleaved\n\n"
          "| default s | EL-attention s | EL / default | same ids | output length |\n|---:|---:|---:|---|---:|\n"
          f"| {s['bart_opt']:.4g} | {s[EL_ENGINE]:.4g} | {r['ratio']:.2f}x | {'yes' if r['same_ids'] else 'no'} | "
          f"{r['output_len']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
