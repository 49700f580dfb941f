"""Bytes read and written by one beam-search decoder step at real shapes: the static search's and the
default's, counted on the `meta` device (shapes, no data, no memory) with the dispatch counter's byte
mode (`bart_opt.bench.dispatch.op_bytes`: every op's tensor inputs and outputs, a gather's source only as
far as it returns, a partial write only where it writes, attention as one fused kernel).

    python -m bart_opt.bench.step_bytes                  # bart-large, 48 inputs x 4 beams, sources of 1,024, fp16
    python -m bart_opt.bench.step_bytes --inputs 128 --json bytes.json

At each position t (tokens so far) of a call at the CNN settings (max_length 142: t = 1 .. 141):

- `static`: one `BeamSearch.step` (`bart_opt.engine.static_generation`), its cache read as far as
  `length_span(t)` positions;
- `default`: one `generation.BeamRun.step` (the cache filled to t - 1 positions, the decoder reading t)
  and the cache's reorder of the rows the beam step moved. How many move is data: the default copies
  only those (it reads their count from the device), so it is counted at a fraction of the rows:
  none (the default's best case), and the fraction a real CPU run of the d256 shape moved on average
  (measured here, `--moved-fraction` to give one).

The mean over every position is the figure per decoder step of a call that runs to max_length.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import BartConfig

from bart_opt.bench.dispatch import SHAPES, counting
from bart_opt.bench.workloads import CNN_SETTINGS

POSITIONS_SHOWN = (1, 32, 33, 64, 96, 128, 141)


def meta_model(shape: dict, dtype: torch.dtype):
    """A Bart of `shape` (`bart_opt.bench.dispatch.SHAPES` keys) on the meta device."""
    from bart_opt import Bart

    fields = {k: v for k, v in shape.items() if k != "ffn_dim"}
    config = BartConfig(**fields, encoder_ffn_dim=shape["ffn_dim"], decoder_ffn_dim=shape["ffn_dim"])
    with torch.device("meta"):
        model = Bart(config)
    return model.to(dtype)


def _state(model, inputs: int, source: int, beams: int):
    memory = torch.empty(inputs, source, model.config.d_model, dtype=model.dtype, device="meta")
    mask = torch.ones(inputs, source, dtype=torch.long, device="meta")
    return model.cross_attention(memory, mask, beams=beams)


@torch.inference_mode()
def static_bytes(model, spec, inputs: int, source: int, cur_len: int) -> dict:
    """{"decode", "search"}: bytes of one static step at `cur_len` tokens."""
    from bart_opt.engine.buffers import FreshBuffers
    from bart_opt.engine.static_generation import BeamSearch

    model.static = True
    try:
        cross = _state(model, inputs, source, spec.num_beams)
        search = BeamSearch(model, inputs, inputs, source, cross, spec, FreshBuffers())
        search.at(cur_len)
        with counting(model, count_bytes=True) as counter:
            counter.phase = "search"
            search.step()
    finally:
        model.static = False
    return {"decode": counter.bytes["decode"], "search": counter.bytes["search"]}


@torch.inference_mode()
def default_bytes(model, spec, inputs: int, source: int, cur_len: int, moved_fraction: float) -> dict:
    """{"decode", "search"}: bytes of one default step at `cur_len` tokens, `moved_fraction` of its cache
    rows moved by the beam step."""
    from bart_opt.engine.generation import BeamRun

    cross = _state(model, inputs, source, spec.num_beams)
    run = BeamRun(model, inputs, spec)
    run.length.value = cur_len
    run.cache.length = cur_len - 1
    rows = inputs * spec.num_beams
    with counting(model, count_bytes=True) as counter:
        counter.phase = "search"
        parents, _ = run.step(cross)
        run.cache.reorder(parents, moved=round(moved_fraction * rows))
    return {"decode": counter.bytes["decode"], "search": counter.bytes["search"]}


def measured_moved_fraction(seed: int = 0) -> float:
    """The fraction of cache rows a default beam step moves, averaged over a CPU generate of 8 documents of
    up to 128 tokens at the d256 shape (random weights, EOS logit raised by 1.5, CNN settings)."""
    import tempfile

    from bart_opt import Bart
    from bart_opt.bench.dispatch import make_batch
    from bart_opt.engine.cache import KVCache
    from bart_opt.demo import build_checkpoint

    fractions = []
    reorder = KVCache.reorder

    def counted(self, rows, moved=None):
        fractions.append((moved if moved is not None else int((rows != torch.arange(len(rows))).sum())) / len(rows))
        return reorder(self, rows, moved)

    with tempfile.TemporaryDirectory(prefix="bart-opt-bytes-") as tmp:
        model = Bart.from_pretrained(str(build_checkpoint(tmp, seed=seed, with_tokenizer=False, eos_bias=1.5,
                                                          **SHAPES["d256"])))
    ids, mask = make_batch(model.config, 8, 128, seed)
    KVCache.reorder = counted
    try:
        model.generate(ids, mask, **CNN_SETTINGS)
    finally:
        KVCache.reorder = reorder
    return sum(fractions) / len(fractions)


def measure(shape: str, inputs: int, source: int, dtype: torch.dtype, moved_fraction: float, stride: int = 1) -> dict:
    """Per position: the static step's bytes and the default's at no moved row and at `moved_fraction`."""
    model = meta_model(SHAPES[shape], dtype)
    spec = model.generation_spec(CNN_SETTINGS)
    positions = sorted(set(range(1, spec.max_length, stride)) | {t for t in POSITIONS_SHOWN if t < spec.max_length})
    rows = []
    for t in positions:
        rows.append({"position": t, "static": static_bytes(model, spec, inputs, source, t),
                     "default_none_moved": default_bytes(model, spec, inputs, source, t, 0.0),
                     "default": default_bytes(model, spec, inputs, source, t, moved_fraction)})
    total = lambda r, mode: r[mode]["decode"] + r[mode]["search"]  # noqa: E731
    means = {mode: sum(total(r, mode) for r in rows) / len(rows) for mode in ("static", "default_none_moved", "default")}
    return {"shape": shape, "inputs": inputs, "beams": spec.num_beams, "source": source, "dtype": str(dtype),
            "moved_fraction": moved_fraction, "positions": rows, "mean_bytes_per_step": means}


def format_table(result: dict) -> str:
    gib = 2**30
    total = lambda r, mode: (r[mode]["decode"] + r[mode]["search"]) / gib  # noqa: E731
    lines = [f"### Bytes read + written per decoder step: {result['shape']}, {result['inputs']} inputs x "
             f"{result['beams']} beams, sources of {result['source']}, {result['dtype']}, CNN settings (meta device)",
             "", f"| position | static GiB (decode + search) | default GiB, no row moved | default GiB, "
             f"{result['moved_fraction']:.0%} of rows moved | static / default |", "|---:|---:|---:|---:|---:|"]
    for r in result["positions"]:
        if r["position"] in POSITIONS_SHOWN:
            lines.append(f"| {r['position']} | {total(r, 'static'):.3f} | {total(r, 'default_none_moved'):.3f} "
                         f"| {total(r, 'default'):.3f} | {total(r, 'static') / total(r, 'default'):.2f}x |")
    m = result["mean_bytes_per_step"]
    lines.append(f"| mean over every position | {m['static'] / gib:.3f} | {m['default_none_moved'] / gib:.3f} "
                 f"| {m['default'] / gib:.3f} | {m['static'] / m['default']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bart_opt.bench.step_bytes``."""
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.step_bytes", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="large")
    p.add_argument("--inputs", type=int, default=48)
    p.add_argument("--source", type=int, default=1024, help="source positions (padded), default 1,024")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--moved-fraction", type=float, help="rows a default beam step moves (default: measured)")
    p.add_argument("--stride", type=int, default=1, help="count every this many positions (default 1)")
    p.add_argument("--json", dest="json_path")
    args = p.parse_args(argv)
    if args.inputs < 1 or args.source < 1 or args.stride < 1:
        p.error("--inputs, --source and --stride must be >= 1")
    moved = args.moved_fraction
    if moved is None:
        print("measuring the default's moved rows on the CPU (d256) ...", file=sys.stderr, flush=True)
        moved = measured_moved_fraction()
    result = measure(args.shape, args.inputs, args.source, getattr(torch, args.dtype), moved, args.stride)
    print(format_table(result))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
