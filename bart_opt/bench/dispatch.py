"""Non-view ATen ops per decoder step and host syncs per generate: the static search against the default.

Counted on a CPU with a `TorchDispatchMode` (`DispatchCounter`): every ATen op a generate call
dispatches, views left out (they launch nothing on a GPU). Ops run inside `Bart.decode_step`
are the decoder step; the others from the first step on are the search's bookkeeping. A host
sync is an op that makes the host read the device: `item` and `_local_scalar_dense` (`int()`, `bool()`,
`.item()`), `nonzero`, `is_nonzero`, `equal`, `masked_select`, `unique*`, and `.tolist()` (which a
CPU tensor answers without an op, so the counter wraps it). On a CPU nothing waits; on a GPU
each of them drains the GPU's queue.

Three ways of generating the same batch:

- `static`: `Bart.static` (fixed shapes, history table, dense n-gram ban, a check every
  `CHECK_EVERY` steps);
- `default (GPU layout)`: the default mode as it runs off the CPU (one attention call for the
  batch, padded keys masked), forced here;
- `default (CPU layout)`: the default mode as it runs on a CPU (one attention call per input).

    python -m bart_opt.bench.dispatch                 # the issue's shape: 12+12 layers, d_model 64
    python -m bart_opt.bench.dispatch --shape base    # bart-base
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bart_opt.bench.workloads import CNN_SETTINGS, SIZES

SYNC_OPS = frozenset({"_local_scalar_dense", "item", "nonzero", "is_nonzero", "equal", "masked_select", "unique",
                      "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive", "tolist"})
SHAPES = {
    # The measurement: 12+12 layers at d_model 64 (few FLOPs, the same ops per step as bart-large).
    "issue": {"d_model": 64, "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 4,
              "decoder_attention_heads": 4, "ffn_dim": 256, "vocab_size": 1000, "max_position_embeddings": 256},
    "base": SIZES["base"],
    "tiny": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 2,
             "decoder_attention_heads": 2, "ffn_dim": 64, "vocab_size": 200, "max_position_embeddings": 160},
}
MODES = ("static", "default (GPU layout)", "default (CPU layout)")


class DispatchCounter(TorchDispatchMode):
    """Counts non-view ATen ops by name, per phase (`phase`: set by the caller), and host syncs."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "prepare"
        self.steps = 0  # decoder steps (`counting` counts them)
        self.ops: dict[str, Counter] = {}
        self.syncs: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.count(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

    def count(self, name: str) -> None:
        self.ops.setdefault(self.phase, Counter())[name] += 1
        if name in SYNC_OPS:
            self.syncs[f"{self.phase}: {name}"] += 1

    def total(self, phase: str) -> int:
        return sum(self.ops.get(phase, Counter()).values())


@contextlib.contextmanager
def counting(model) -> Iterator[DispatchCounter]:
    """Count what `model.generate` dispatches in the block, split into "prepare" (before the first
    decoder step), "decode" (inside `decode_step`) and "search" (the rest from the first step on);
    `.tolist()` calls count as syncs too."""
    counter = DispatchCounter()
    decode_step, tolist = model.decode_step, torch.Tensor.tolist

    def counted_step(*args, **kwargs):
        counter.steps += 1
        counter.phase = "decode"
        try:
            return decode_step(*args, **kwargs)
        finally:
            counter.phase = "search"

    def counted_tolist(tensor):
        counter.count("tolist")
        return tolist(tensor)

    model.decode_step = counted_step
    torch.Tensor.tolist = counted_tolist
    try:
        with counter:
            yield counter
    finally:
        torch.Tensor.tolist = tolist
        del model.decode_step


@contextlib.contextmanager
def layout(mode: str, model) -> Iterator[None]:
    """`model` set up for one of `MODES` within the block."""
    import bart_opt.model as model_module

    model.static = mode == "static"
    forced = mode == "default (GPU layout)"
    per_input = model_module.packing_rules.attends_per_input
    if forced:
        model_module.packing_rules.attends_per_input = lambda device: False
    try:
        yield
    finally:
        model_module.packing_rules.attends_per_input = per_input
        model.static = False


def measure(model, ids: torch.Tensor, mask: torch.Tensor, settings: dict, modes=MODES) -> list[dict]:
    """One row per mode: steps, ops per step (decode, search), host syncs per generate (all, in the loop)."""
    rows = []
    for mode in modes:
        with layout(mode, model), counting(model) as counter:
            out = model.generate(ids, mask, **settings)
        steps = counter.steps
        loop_syncs = sum(n for key, n in counter.syncs.items() if not key.startswith("prepare"))
        rows.append({
            "mode": mode, "steps": steps, "output_len": out.shape[1],
            "decode_ops_per_step": counter.total("decode") / steps,
            "search_ops_per_step": counter.total("search") / steps,
            "ops_per_step": (counter.total("decode") + counter.total("search")) / steps,
            "syncs": sum(counter.syncs.values()), "loop_syncs": loop_syncs,
            "loop_syncs_per_step": loop_syncs / steps, "sync_ops": dict(counter.syncs),
            "decode_top_ops": dict(counter.ops.get("decode", Counter()).most_common(8)),
            "search_top_ops": dict(counter.ops.get("search", Counter()).most_common(8)),
            "ids": out.tolist(),
        })
    return rows


def format_table(title: str, rows: list[dict]) -> str:
    """Markdown: one row per mode."""
    lines = [f"### {title}", "",
             "| mode | decoder steps | non-view ops / step: decode_step | search | total "
             "| host syncs / generate | of them in the loop (per step) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['steps']} | {r['decode_ops_per_step']:.1f} | {r['search_ops_per_step']:.1f} "
                     f"| {r['ops_per_step']:.1f} | {r['syncs']} | {r['loop_syncs']} ({r['loop_syncs_per_step']:.2f}) |")
    return "\n".join(lines)


def make_batch(config, inputs: int, max_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`inputs` random documents of uneven lengths (the longest `max_len`), right-padded."""
    from bart_opt.bench.vs_transformers import make_batch as bench_batch

    batch = bench_batch(config, inputs, max_len, torch.device("cpu"), seed)
    return batch["input_ids"], batch["attention_mask"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bart_opt.bench.dispatch``."""
    p = argparse.ArgumentParser(prog="python -m bart_opt.bench.dispatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="issue")
    p.add_argument("--inputs", type=int, default=8, help="documents in the batch (default 8)")
    p.add_argument("--max-len", type=int, default=128, help="longest document, the others shorter (default 128)")
    p.add_argument("--eos-bias", type=float, default=1.5,
                   help="added to the random weights' EOS logit (default 1.5, as the GPU bench: outputs end at "
                        "min_length at the issue's shape)")
    p.add_argument("--init-std", type=float, default=0.02, help="std of the random weights (default 0.02, transformers')")
    p.add_argument("--max-length", type=int, help="override the CNN settings' max_length (142)")
    p.add_argument("--min-length", type=int, help="override the CNN settings' min_length (56)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", dest="json_path")
    args = p.parse_args(argv)
    if args.inputs < 1 or args.max_len < 2 or args.threads < 1:
        p.error("--inputs and --threads must be >= 1, --max-len >= 2")
    from bart_opt import Bart
    from bart_opt.demo import build_checkpoint

    torch.set_num_threads(args.threads)
    settings = dict(CNN_SETTINGS)
    for key in ("max_length", "min_length"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    with tempfile.TemporaryDirectory(prefix="bart-opt-dispatch-") as tmp:
        folder = build_checkpoint(tmp, seed=0, with_tokenizer=False, eos_bias=args.eos_bias, init_std=args.init_std,
                                  **SHAPES[args.shape])
        model = Bart.from_pretrained(str(folder))
    ids, mask = make_batch(model.config, args.inputs, min(args.max_len, model.config.max_position_embeddings), 0)
    print(f"counting {args.shape} ...", file=sys.stderr, flush=True)
    rows = measure(model, ids, mask, settings)
    c = model.config
    title = (f"ATen ops and host syncs, {c.encoder_layers}+{c.decoder_layers} layers, d_model {c.d_model}, "
             f"{args.inputs} inputs padded to {ids.shape[1]}, CNN settings ({settings['num_beams']} beams, "
             f"min_length {settings['min_length']}, max_length {settings['max_length']}, "
             f"no_repeat_ngram_size {settings['no_repeat_ngram_size']}), CPU, torch {torch.__version__}")
    print(format_table(title, rows))
    if args.json_path:
        payload = {"shape": args.shape, "config": SHAPES[args.shape], "settings": settings, "inputs": args.inputs,
                   "input_len": ids.shape[1], "torch": torch.__version__, "rows": rows}
        Path(args.json_path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
