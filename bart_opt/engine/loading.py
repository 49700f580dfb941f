"""Reading Hugging Face BART checkpoints: one place for the format's quirks.

* files come from a local folder, or from the hub through huggingface_hub's cache;
* weights from `model.safetensors` (preferred) or `pytorch_model.bin` (only with `weights_only=True`);
* keys lose their `model.` prefix; `lm_head` and the encoder/decoder `embed_tokens` are ties of
  `shared` and are dropped; a missing `final_logits_bias` means zeros;
* the model is built on the meta device and the tensors are assigned, so weights exist once;
  the pages of checkpoint tensors it no longer needs (copied into fused projections, or converted)
  are handed back to the kernel (`release_pages`);
* the files read are fingerprinted (`bart_opt.engine.fingerprint`) before the weights are read, and
  checked unchanged after: ``model.fingerprint`` names what was loaded. A damaged weights file
  (truncated, a broken header) is a `CheckpointError`, not the reader's own exception.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import BartConfig, GenerationConfig

from bart_opt.errors import CheckpointError
from bart_opt.engine.fingerprint import fingerprint

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TIED_KEYS = ("lm_head.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
OPTIONAL_KEYS = ("final_logits_bias",)
# The files of a BART checkpoint fetched from the hub (other models name theirs: bart_opt.scoring.models).
CHECKPOINT_PATTERNS = ("config.json", "generation_config.json", "*.safetensors", "pytorch_model.bin", "tokenizer*",
                       "vocab.json", "merges.txt", "special_tokens_map.json")

__all__ = ["CHECKPOINT_PATTERNS", "Checkpoint", "CheckpointError", "load_generation_config", "load_pretrained",
           "normalize_keys", "read_state_dict", "release_pages", "resolve_checkpoint", "weights_file"]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint found once: `folder` holds its files, `name` is how the caller named it (a folder or a
    hub id). `bart_opt.Summarizer.from_options` finds it, reads the tokenizer from it and hands it to
    `bart_opt.Bart.from_pretrained`, which reads the weights from the same folder without looking again."""

    name: str
    folder: Path

    @classmethod
    def find(cls, name_or_path: str | os.PathLike | Checkpoint) -> Checkpoint:
        """The checkpoint `name_or_path` names (`resolve_checkpoint`); a `Checkpoint` is already found, and is
        returned as it is."""
        if isinstance(name_or_path, Checkpoint):
            return name_or_path
        return cls(str(name_or_path), resolve_checkpoint(name_or_path))


def resolve_checkpoint(name_or_path: str | os.PathLike, patterns: Sequence[str] = CHECKPOINT_PATTERNS) -> Path:
    """A local folder as is; anything else is a hub id fetched into (or found in) the hub cache,
    the files matching `patterns` (with HF_HUB_OFFLINE=1, only what the cache holds)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError("is a file; expected a checkpoint folder or a hub id", name_or_path)
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id=str(name_or_path), allow_patterns=list(patterns))
    except Exception as err:  # hub errors come in many classes; all mean "could not get it"
        raise CheckpointError("no such checkpoint folder here, and no such model on the hub (or it cannot be "
                              "reached)", name_or_path, detail=f"{type(err).__name__}: {err}") from err
    return Path(folder)


def weights_file(folder: Path) -> Path:
    """The weights file of `folder`: model.safetensors, else pytorch_model.bin."""
    for name in WEIGHT_FILES:
        if (folder / name).exists():
            return folder / name
    raise CheckpointError(f"no weights: expected one of {', '.join(WEIGHT_FILES)}", folder)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of weights file `path` on CPU; `CheckpointError` when the file is damaged.

    safetensors checks its header against the file (a truncated or lengthened file, a header
    that is not JSON or declares tensors the bytes do not cover); torch.load fails on a broken pickle.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except (SafetensorError, pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as error:
        raise CheckpointError(f"{path.name} is damaged and cannot be read", path.parent, detail=str(error)) from error


def normalize_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint keys -> our module names: strip `model.`, drop tied copies of `shared`."""
    out = {}
    for key, tensor in state.items():
        name = key.removeprefix("model.")
        if name in TIED_KEYS:
            continue
        out[name] = tensor
    return out


def load_generation_config(folder: Path, config: BartConfig) -> GenerationConfig:
    """The folder's generation_config.json, else the generation fields of config.json."""
    if (folder / "generation_config.json").exists():
        return GenerationConfig.from_pretrained(str(folder))
    return GenerationConfig.from_model_config(config)


def load_pretrained(cls, checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype,
                    quantize: str | None = None):
    """Build `cls(config, generation_config)` on the meta device and assign `checkpoint`'s tensors on `device`
    in `dtype`; with `quantize="int8"`, quantize its layers from the float32 weights, then convert the rest to
    `dtype`. The checkpoint, device and dtype come resolved (`Checkpoint.find`, `bart_opt.engine.hardware.choose_dtype`:
    `bart_opt.Bart.from_pretrained` resolves them, once)."""
    folder, name_or_path = checkpoint.folder, checkpoint.name
    if not (folder / "config.json").exists():
        raise CheckpointError("no config.json", folder)
    weights = weights_file(folder)
    identity = fingerprint(folder, weights.name)
    config = BartConfig.from_pretrained(str(folder))
    generation_config = load_generation_config(folder, config)
    with torch.device("meta"):
        model = cls(config, generation_config)
    state = normalize_keys(read_state_dict(weights))
    identity.check_unchanged()
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state) - set(OPTIONAL_KEYS))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"the weights do not fit config.json: missing {missing[:8]}, unexpected {unexpected[:8]}", name_or_path
        )
    for key in OPTIONAL_KEYS:
        state.setdefault(key, torch.zeros(expected[key].shape))
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise CheckpointError(f"{key} has shape {tuple(tensor.shape)}; config.json implies "
                                  f"{tuple(expected[key].shape)}", name_or_path)
        state[key] = tensor.to(device=device, dtype=torch.float32 if quantize else dtype)
    model.load_state_dict(state, assign=True, strict=True)
    release_pages(unused_tensors(state.values(), model))
    if quantize:
        from bart_opt.engine.quantize import quantize_model

        release_pages(unused_tensors(quantize_model(model), model))
        model.to(dtype)
        trim_heap()
    model.name_or_path = name_or_path
    model.fingerprint = identity
    return model.eval()


def unused_tensors(tensors: Iterable[torch.Tensor], model: torch.nn.Module) -> list[torch.Tensor]:
    """The CPU tensors among `tensors` whose memory no parameter or buffer of `model` shares (the
    projections `Attention.fuse` copied into one tensor, sources of a dtype conversion, weights quantized)."""
    kept = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()] if t.device.type == "cpu"}
    return [t for t in tensors if t.device.type == "cpu" and t.untyped_storage().data_ptr() not in kept]


def release_pages(tensors: list[torch.Tensor]) -> None:
    """Tell the kernel this process no longer needs the memory pages lying wholly inside the storages of `tensors`.

    safetensors memory-maps the checkpoint: tensors the model uses as they are stay views of the
    file, so the mapping lives as long as the model, and the pages of every tensor read once
    (the separate Q/K/V weights, read to fuse them: 109 MiB at bart-base shape in float32) would
    stay in the process's resident memory with it. `madvise(MADV_DONTNEED)` drops them from this
    process (a file page stays in the page cache; an anonymous one, e.g. from `pytorch_model.bin`,
    is simply freed early). Only whole pages inside a storage are released, never a page it shares
    with a neighbour. The caller guarantees nothing reads these storages again. A no-op where the
    platform has no `madvise`.
    """
    madvise = _libc_function("madvise") if hasattr(mmap, "MADV_DONTNEED") else None
    if madvise is None:
        return
    page = mmap.PAGESIZE
    # Whole storages, once each: a tensor's own span (data_ptr, nbytes) can reach past its memory
    # (an expanded view of a 4-byte storage spans its full shape).
    spans = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    for start, nbytes in spans.items():
        first = -(-start // page) * page  # first page boundary inside the storage
        last = (start + nbytes) // page * page  # last page boundary inside it
        if last > first:
            madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), mmap.MADV_DONTNEED)


def trim_heap() -> None:
    """Hand the C heap's free pages back to the kernel (glibc's `malloc_trim`; elsewhere a no-op).

    Quantizing frees a float copy of every weight through the heap; its free pages otherwise stay in
    the process's resident memory between the int8 weights (measured at bart-base shape: 249 -> 233 MiB,
    and one load in three left 321 MiB)."""
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(ctypes.c_size_t(0))


@functools.cache
def _libc_function(name: str):
    """libc's function `name`, or None (Windows, or a libc without it); looked up once per process."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
