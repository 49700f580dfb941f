"""Which BART configurations the engine honours, checked once before a model is built.

transformers' `BartConfig` is the source of truth for hyper-parameters; this module only
refuses the variants our single model file does not implement, so that an unsupported
checkpoint fails loudly instead of producing wrong output.
"""

from __future__ import annotations

import torch
from transformers import BartConfig
from transformers.activations import ACT2FN

# transformers' own activation modules: "gelu_new", for one, is a composition of ops whose rounding
# differs from F.gelu(approximate="tanh") in the last bit.
ACTIVATIONS = {name: ACT2FN[name] for name in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")}

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

# Flags that older BART/mBART configs carry; only the value plain BART uses is implemented.
_LEGACY_FLAGS = {
    "normalize_before": False,
    "add_final_layer_norm": False,
    "static_position_embeddings": False,
    "normalize_embedding": True,
    "add_bias_logits": False,
}


class UnsupportedConfigError(ValueError):
    """The checkpoint asks for a BART variant this engine does not implement."""


def validate_config(config: BartConfig) -> None:
    """Raise `UnsupportedConfigError` naming the first setting the engine cannot honour."""
    model_type = getattr(config, "model_type", None)
    if model_type != "bart":
        raise UnsupportedConfigError(
            f"model_type {model_type!r} is not supported: bart_opt implements plain BART only "
            "(mBART, PLBart, Marian and others differ in layer norms or embeddings)"
        )
    if config.activation_function not in ACTIVATIONS:
        raise UnsupportedConfigError(
            f"activation_function {config.activation_function!r} is not supported; "
            f"supported: {sorted(ACTIVATIONS)}"
        )
    for flag, expected in _LEGACY_FLAGS.items():
        value = getattr(config, flag, expected)
        if bool(value) != expected:
            raise UnsupportedConfigError(f"config.{flag}={value!r} is not supported (only {expected!r})")
    if not getattr(config, "tie_word_embeddings", True):
        raise UnsupportedConfigError(
            "tie_word_embeddings=False is not supported: bart_opt computes logits from the shared embedding"
        )
    for side in ("encoder", "decoder"):
        heads = getattr(config, f"{side}_attention_heads")
        if config.d_model % heads:
            raise UnsupportedConfigError(f"d_model {config.d_model} is not divisible by {side}_attention_heads {heads}")
    if config.pad_token_id is None:
        raise UnsupportedConfigError("config.pad_token_id is required")


def resolve_dtype(dtype: torch.dtype | str | None, default: torch.dtype = torch.float32) -> torch.dtype:
    """Accept a torch dtype or a name such as "fp16" / "bfloat16"; None gives `default`."""
    if dtype is None:
        return default
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype {dtype} is not supported; use float32, float16 or bfloat16")
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[key]
