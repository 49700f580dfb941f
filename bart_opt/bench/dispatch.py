"""Ops and bytes per decoder step, host syncs per generate: the static search against the default.

Counted on a CPU with a `TorchDispatchMode` (`DispatchCounter`): every ATen op a generate call
dispatches, views left out (they launch nothing on a GPU). Ops run inside `Bart.decode_step`
are the decoder step; the others from the first step on are the search's bookkeeping. A host
sync is an op that makes the host read the device: `item` and `_local_scalar_dense` (`int()`, `bool()`,
`.item()`), `nonzero`, `is_nonzero`, `equal`, `masked_select`, `unique*`, and `.tolist()`; and the
hidden ones a CPU run does not show (`HIDDEN_SYNCS`): indexing with a mask (a `nonzero` inside) or a
Python list, tensors made from Python values, CPU tensors in an op on another device. On a CPU
nothing waits; on a GPU each of them drains the GPU's queue or blocks the host on a copy. With
`count_bytes` the counter also sums the bytes each op reads and writes (`op_bytes`).

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
import math
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from bart_opt.bench.fidelity import SHAPES as FIDELITY_SHAPES
from bart_opt.bench.workloads import CNN_SETTINGS, SIZES

SYNC_OPS = frozenset({"_local_scalar_dense", "item", "nonzero", "nonzero_numpy", "is_nonzero", "equal",
                      "masked_select", "unique",
                      "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive", "tolist"})
HIDDEN_SYNCS = {
    "mask_index": "indexing with a bool or uint8 tensor (`x[mask]`, `x[mask] = v`): a `nonzero` inside",
    "list_index": "indexing with a Python list (`x[[0, 2]]`, `x[:, ids] = v`): a tensor made on the host, then copied",
    "python_values": "`torch.tensor` / `torch.as_tensor` of Python values: made on the host, then copied",
    "host_tensor": "a CPU tensor of one or more dimensions in an op on another device: a host-to-device copy",
}
"""The syncs a CPU run hides: on a GPU each is a `nonzero` or a blocking host-to-device copy. `host_tensor`
can only show off the CPU (on the `meta` device, say), where the model's tensors are not CPU tensors."""
SHAPES = {
    # The measurement: 12+12 layers at d_model 64 (few FLOPs, the same ops per step as bart-large).
    "issue": {"d_model": 64, "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 4,
              "decoder_attention_heads": 4, "ffn_dim": 256, "vocab_size": 1000, "max_position_embeddings": 256},
    "d256": FIDELITY_SHAPES["d256"],
    "base": SIZES["base"],
    "large": SIZES["large"],
    "tiny": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 2,
             "decoder_attention_heads": 2, "ffn_dim": 64, "vocab_size": 200, "max_position_embeddings": 160},
}
MODES = ("static", "default (GPU layout)", "default (CPU layout)")
_INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
# Ops that read of their source only what they return (their output's bytes), not the whole source.
_GATHERS = {"index_select": "self", "gather": "self", "embedding": "weight", "index": "self", "take": "self"}
# In-place ops that write only part of `self`: what they touch, in elements, and whether they read it too.
_PARTIAL_WRITES = frozenset({"index_copy_", "index_add_", "index_fill_", "index_put_", "_index_put_impl_",
                             "scatter_", "scatter_add_", "scatter_reduce_"})
_WRITE_ONLY_SELF = frozenset({"copy_", "fill_", "zero_", "normal_", "uniform_", "random_"})


def tensors_of(value) -> list[torch.Tensor]:
    """The tensors in `value`: a tensor, or lists and tuples of them (nested), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def is_alias(func, args, out) -> bool:
    """Whether `func` returned a view of one of its inputs (it launches nothing): a view op whose output
    shares an input's storage. `to`, `reshape`, `contiguous` and the like are marked as views but return
    a new tensor when they must convert or copy; then they count."""
    if not func.is_view:
        return False
    inputs = {t.untyped_storage().data_ptr() for t in tensors_of(list(args)) if t.device.type != "meta"}
    outputs = tensors_of(out)
    if any(t.device.type == "meta" for t in outputs):  # no storage to compare: shapes tell
        return all(t.dtype == a.dtype for t in outputs for a in tensors_of(list(args))[:1])
    return bool(outputs) and all(t.untyped_storage().data_ptr() in inputs for t in outputs)


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes an op reads or writes of `t`: its elements, a broadcast (stride 0) dimension counted once."""
    elements = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            elements *= size
    return elements * t.element_size()


def _touched(name: str, bound: dict) -> int:
    """Bytes of `self` a partial in-place write touches (`_PARTIAL_WRITES`)."""
    self = bound["self"]
    if name in ("index_copy_", "index_add_"):
        return tensor_bytes(bound["source"]) * (2 if name == "index_add_" else 1)
    if name == "index_fill_":
        dim = bound["dim"] % max(self.dim(), 1)
        return bound["index"].numel() * (self.numel() // max(self.shape[dim], 1)) * self.element_size() if self.dim() \
            else self.element_size()
    if name.startswith("scatter"):
        return bound["index"].numel() * self.element_size() * (1 if name == "scatter_" else 2)
    # index_put_: the indexed positions, each a slice of the dimensions no index covers.
    indexed, covered = 1, 0
    shapes = []
    for index in bound["indices"]:
        if index is None:
            continue
        if index.dtype in (torch.bool, torch.uint8):
            indexed *= int(index.sum()) if index.device.type != "meta" else index.numel()
            covered += index.dim()
        else:
            shapes.append(index.shape)
            covered += 1
    if shapes:
        indexed *= math.prod(torch.broadcast_shapes(*shapes))
    rest = math.prod(self.shape[covered:])
    return indexed * rest * self.element_size() * (2 if bound.get("accumulate") else 1)


def op_bytes(func, args, kwargs, out) -> int:
    """Bytes `func` reads and writes, as a GPU kernel would move them: every tensor argument read (a
    gather's source only as far as it returns, a write-only argument not at all), every output written
    (a partial in-place write only where it writes)."""
    name = func.overloadpacket.__name__
    bound = {arg.name: value for arg, value in zip(func._schema.arguments, args)}
    bound.update(kwargs)
    write_only = {arg.name for arg in func._schema.arguments
                  if arg.alias_info is not None and arg.alias_info.is_write and arg.kwarg_only}  # out=
    if name in _PARTIAL_WRITES or name in _WRITE_ONLY_SELF:
        write_only.add("self")
    total = 0
    for key, value in bound.items():
        if key in write_only or _GATHERS.get(name) == key:
            continue
        total += sum(tensor_bytes(t) for t in tensors_of(value))
    outputs = tensors_of(out)
    if name in _PARTIAL_WRITES:
        return total + _touched(name, bound)
    written = sum(tensor_bytes(t) for t in outputs)
    return total + written * (2 if name in _GATHERS else 1)  # a gather reads what it writes


class DispatchCounter(TorchDispatchMode):
    """Counts non-view ATen ops by name (`is_alias`), per phase (`phase`: set by the caller), host syncs, and with
    `count_bytes` the bytes every op reads and writes (`op_bytes`), per phase.

    Host syncs are the ops that read the device (`SYNC_OPS`, and `.tolist()`) and the hidden ones
    (`HIDDEN_SYNCS`): indexing with a mask or a Python list and tensors made from Python values, seen
    where they are called (a `TorchFunctionMode` beside this one), and CPU tensors in an op on another
    device. `scaled_dot_product_attention` counts as one op (a fused kernel on a GPU; on the `meta`
    device torch decomposes it into a materialized softmax that no GPU runs)."""

    def __init__(self, count_bytes: bool = False) -> None:
        super().__init__()
        self.phase = "prepare"
        self.steps = 0  # decoder steps (`counting` counts them)
        self.ops: dict[str, Counter] = {}
        self.syncs: Counter = Counter()
        self.count_bytes = count_bytes
        self.bytes: Counter = Counter()  # phase -> bytes read and written
        self._functions = _FunctionCounter(self)
        self._fused = 0

    def __enter__(self):
        self._functions.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._functions.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._functions.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._fused:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if is_alias(func, args, out):
            return out
        name = func.overloadpacket.__name__
        self.count(name)
        self._hidden(name, args, kwargs)
        if self.count_bytes:
            self.bytes[self.phase] += op_bytes(func, args, kwargs, out)
        return out

    def _hidden(self, name: str, args, kwargs) -> None:
        tensors = tensors_of(list(args) + list(kwargs.values()))
        if name in _INDEXING and len(args) > 1 and any(
                t.dtype in (torch.bool, torch.uint8) for t in tensors_of(args[1])):
            self.sync("mask_index")
        devices = {t.device.type for t in tensors}
        if len(devices) > 1 and "cpu" in devices and any(t.device.type == "cpu" and t.dim() > 0 for t in tensors):
            self.sync("host_tensor")

    def count(self, name: str) -> None:
        self.ops.setdefault(self.phase, Counter())[name] += 1
        if name in SYNC_OPS:
            self.syncs[f"{self.phase}: {name}"] += 1

    def sync(self, name: str) -> None:
        """Count a hidden sync (`HIDDEN_SYNCS`) in the current phase."""
        self.syncs[f"{self.phase}: {name}"] += 1

    def fused(self, name: str, args, kwargs, call):
        """Run `call()` as one op `name`: its inner ops are not counted, its bytes are its tensors'."""
        self.count(name)
        self._fused += 1
        try:
            out = call()
        finally:
            self._fused -= 1
        if self.count_bytes:
            self.bytes[self.phase] += sum(tensor_bytes(t) for t in tensors_of([*args, *kwargs.values(), out]))
        return out

    def total(self, phase: str) -> int:
        return sum(self.ops.get(phase, Counter()).values())

    def hidden(self) -> int:
        """The hidden syncs counted, every phase."""
        return sum(n for key, n in self.syncs.items() if key.split(": ")[1] in HIDDEN_SYNCS)


def _has_list(index) -> bool:
    return isinstance(index, list) or (isinstance(index, tuple) and any(isinstance(i, list) for i in index))


class _FunctionCounter(TorchFunctionMode):
    """What a dispatch mode cannot tell apart, seen where it is called: `torch.tensor` of Python values,
    indexing with a Python list, `.tolist()`, and attention as one fused op (see `DispatchCounter`)."""

    def __init__(self, counter: DispatchCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c = self.counter
        if c._fused:
            return func(*args, **kwargs)
        if func in _FROM_DATA and args and not isinstance(args[0], torch.Tensor):
            c.sync("python_values")
        elif func in _INDEX_METHODS and len(args) > 1 and _has_list(args[1]):
            c.sync("list_index")
        elif func is torch.Tensor.tolist:
            c.count("tolist")
        elif func is F.scaled_dot_product_attention:
            return c.fused("scaled_dot_product_attention", args, kwargs, lambda: func(*args, **kwargs))
        return func(*args, **kwargs)


_FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray)
_INDEX_METHODS = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)


@contextlib.contextmanager
def counting(model, count_bytes: bool = False) -> Iterator[DispatchCounter]:
    """Count what `model.generate` dispatches in the block, split into "prepare" (before the first
    decoder step), "decode" (inside `decode_step`) and "search" (the rest from the first step on)."""
    counter = DispatchCounter(count_bytes=count_bytes)
    decode_step = model.decode_step

    def counted_step(*args, **kwargs):
        counter.steps += 1
        counter.phase = "decode"
        try:
            return decode_step(*args, **kwargs)
        finally:
            counter.phase = "search"

    model.decode_step = counted_step
    try:
        with counter:
            yield counter
    finally:
        del model.decode_step


@contextlib.contextmanager
def layout(mode: str, model) -> Iterator[None]:
    """`model` set up for one of `MODES` within the block: "default (GPU layout)" forces what the default
    takes off the CPU (one attention call for the batch, `packing.attends_per_input`; the sync-free n-gram
    ban, `hardware.host_reads_are_free`)."""
    import bart_opt.engine.model as model_module
    from bart_opt.engine import hardware

    model.static = mode == "static"
    forced = mode == "default (GPU layout)"
    per_input, free_reads = model_module.packing_rules.attends_per_input, hardware.host_reads_are_free
    if forced:
        model_module.packing_rules.attends_per_input = lambda device: False
        hardware.host_reads_are_free = lambda device: False
    try:
        yield
    finally:
        model_module.packing_rules.attends_per_input = per_input
        hardware.host_reads_are_free = free_reads
        model.static = False


def measure(model, ids: torch.Tensor, mask: torch.Tensor, settings: dict, modes=MODES) -> list[dict]:
    """One row per mode: steps, ops per step (decode, search), host syncs per generate (all, in the loop;
    the visible ones and the hidden ones apart) and bytes read and written per step (decode, search)."""
    rows = []
    for mode in modes:
        with layout(mode, model), counting(model, count_bytes=True) as counter:
            out = model.generate(ids, mask, **settings)
        steps = counter.steps
        loop = {key: n for key, n in counter.syncs.items() if not key.startswith("prepare")}
        loop_hidden = sum(n for key, n in loop.items() if key.split(": ")[1] in HIDDEN_SYNCS)
        rows.append({
            "mode": mode, "steps": steps, "output_len": out.shape[1],
            "decode_ops_per_step": counter.total("decode") / steps,
            "search_ops_per_step": counter.total("search") / steps,
            "ops_per_step": (counter.total("decode") + counter.total("search")) / steps,
            "syncs": sum(counter.syncs.values()), "hidden_syncs": counter.hidden(),
            "loop_syncs": sum(loop.values()), "loop_hidden_syncs": loop_hidden,
            "loop_syncs_per_step": sum(loop.values()) / steps, "sync_ops": dict(counter.syncs),
            "decode_bytes_per_step": counter.bytes["decode"] / steps,
            "search_bytes_per_step": counter.bytes["search"] / steps,
            "bytes_per_step": (counter.bytes["decode"] + counter.bytes["search"]) / steps,
            "decode_top_ops": dict(counter.ops.get("decode", Counter()).most_common(8)),
            "search_top_ops": dict(counter.ops.get("search", Counter()).most_common(8)),
            "ids": out.tolist(),
        })
    return rows


def format_table(title: str, rows: list[dict]) -> str:
    """Markdown: one row per mode."""
    lines = [f"### {title}", "",
             "| mode | decoder steps | non-view ops / step: decode_step | search | total "
             "| host syncs / generate (hidden) | of them in the loop (hidden; per step) "
             "| MiB read + written / step: decode_step | search | total |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    mib = 2**20
    for r in rows:
        lines.append(f"| {r['mode']} | {r['steps']} | {r['decode_ops_per_step']:.1f} | {r['search_ops_per_step']:.1f} "
                     f"| {r['ops_per_step']:.1f} | {r['syncs']} ({r['hidden_syncs']}) "
                     f"| {r['loop_syncs']} ({r['loop_hidden_syncs']}; {r['loop_syncs_per_step']:.2f}) "
                     f"| {r['decode_bytes_per_step'] / mib:.2f} | {r['search_bytes_per_step'] / mib:.2f} "
                     f"| {r['bytes_per_step'] / mib:.2f} |")
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
