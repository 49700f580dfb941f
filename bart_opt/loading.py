"""Reading Hugging Face BART checkpoints: one place for the format's quirks.

* files come from a local folder, or from the hub through huggingface_hub's cache;
* weights from `model.safetensors` (preferred) or `pytorch_model.bin` (only with `weights_only=True`);
* keys lose their `model.` prefix; `lm_head` and the encoder/decoder `embed_tokens` are ties of
  `shared` and are dropped; a missing `final_logits_bias` means zeros;
* the model is built on the meta device and the tensors are assigned, so weights exist once.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import BartConfig, GenerationConfig

from bart_opt.config import resolve_dtype

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TIED_KEYS = ("lm_head.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
OPTIONAL_KEYS = ("final_logits_bias",)


class CheckpointError(ValueError):
    """The checkpoint folder is missing files or holds weights that do not fit the config."""


def resolve_checkpoint(name_or_path: str | os.PathLike) -> Path:
    """A local folder as is; anything else is a hub id fetched into (or found in) the hub cache."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{name_or_path} is a file; expected a checkpoint folder or a hub id")
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            repo_id=str(name_or_path),
            allow_patterns=["config.json", "generation_config.json", "*.safetensors", "pytorch_model.bin",
                            "tokenizer*", "vocab.json", "merges.txt", "special_tokens_map.json"],
        )
    except Exception as err:  # hub errors come in many classes; all mean "could not get it"
        raise CheckpointError(
            f"could not find {name_or_path!r} locally or on the hub ({type(err).__name__}: {err})"
        ) from err
    return Path(folder)


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Weights of `folder` on CPU, safetensors first."""
    safetensors_file = folder / WEIGHT_FILES[0]
    if safetensors_file.exists():
        from safetensors.torch import load_file

        return load_file(str(safetensors_file))
    bin_file = folder / WEIGHT_FILES[1]
    if bin_file.exists():
        return torch.load(str(bin_file), map_location="cpu", weights_only=True)
    raise CheckpointError(f"{folder} has no weights: expected one of {', '.join(WEIGHT_FILES)}")


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


def load_pretrained(cls, name_or_path, device="cpu", dtype=torch.float32):
    """Build `cls(config, generation_config)` on the meta device and assign the checkpoint's tensors."""
    folder = resolve_checkpoint(name_or_path)
    if not (folder / "config.json").exists():
        raise CheckpointError(f"{folder} has no config.json")
    config = BartConfig.from_pretrained(str(folder))
    generation_config = load_generation_config(folder, config)
    dtype = resolve_dtype(dtype)
    device = torch.device(device)
    with torch.device("meta"):
        model = cls(config, generation_config)
    state = normalize_keys(read_state_dict(folder))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state) - set(OPTIONAL_KEYS))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {name_or_path} does not fit its config: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    for key in OPTIONAL_KEYS:
        state.setdefault(key, torch.zeros(expected[key].shape))
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise CheckpointError(f"{key} has shape {tuple(tensor.shape)}; the config implies {tuple(expected[key].shape)}")
        state[key] = tensor.to(device=device, dtype=dtype)
    model.load_state_dict(state, assign=True, strict=True)
    model.name_or_path = str(name_or_path)
    return model.eval()
