"""The checkpoints of the model-based metrics (BERTScore's encoder, the consistency metric's NLI
classifier), opened the way the summarizer's are.

`open_checkpoint` resolves a local folder, or a hub id through huggingface_hub's cache
(`bart_opt.engine.loading.resolve_checkpoint`: with ``HF_HUB_OFFLINE=1`` nothing is downloaded, an
uncached id is refused), refuses a folder that cannot serve (no ``config.json``, no weights, no
tokenizer files), and fingerprints the files that will be read (`bart_opt.engine.fingerprint`) before
they are read. `load_checked` reads them and then checks that none changed in between, so the
fingerprint names what was loaded.

`call_cost` condenses the memory log a metric's `score` call ran under into what the metric reports.

Every refusal is the caller's mistake, an `InvalidRequest` whose field is the setting that named
the checkpoint (``bertscore_model``, ``consistency_model``): the CLI prints it as one line and the
service answers 422, never a stack trace.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bart_opt.errors import CheckpointError, InvalidRequest
from bart_opt.engine.fingerprint import Fingerprint, fingerprint

# The files of a BERT, RoBERTa, DeBERTa or ALBERT checkpoint fetched from the hub: config,
# weights and any tokenizer's files (WordPiece vocab.txt, BPE vocab.json + merges.txt, a
# sentencepiece model, or tokenizer.json, which any of them may have instead).
PATTERNS = ("config.json", "*.safetensors", "pytorch_model.bin", "tokenizer*", "vocab.txt", "vocab.json",
            "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model")
# Tokenizer files beyond BART's that the fingerprint hashes where present.
VOCABULARY_FILES = ("vocab.txt", "spiece.model", "sentencepiece.bpe.model", "spm.model")
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_UNSET_LENGTH = 1_000_000  # transformers' "no limit" is 1e30; a real model's input limit is far below this

T = TypeVar("T")


@dataclass(frozen=True)
class ScoringCheckpoint:
    """A checkpoint a metric may load: `name` as the caller gave it, the `folder` its files are
    read from, its `weights` file name, its `fingerprint`, and `field` (the setting that named it)."""

    name: str
    folder: Path
    weights: str
    fingerprint: Fingerprint
    field: str

    def refuse(self, message: str) -> InvalidRequest:
        """The `InvalidRequest` that refuses this checkpoint for `message`, naming it and its field."""
        return InvalidRequest(self.field, f"{self.name}: {message}")


def open_checkpoint(name_or_path: str | os.PathLike, field: str) -> ScoringCheckpoint:
    """The checkpoint `name_or_path` (a folder or a hub id), whole and fingerprinted, its files not yet read.

    Raises `InvalidRequest` (`field`) when it cannot be found, or lacks config.json, weights or tokenizer files.
    """
    from bart_opt.engine.loading import resolve_checkpoint

    name = str(name_or_path)
    try:
        folder = resolve_checkpoint(name_or_path, patterns=PATTERNS)
        if not (folder / "config.json").is_file():
            raise CheckpointError("there is no config.json")
        weights = next((w for w in _WEIGHTS if (folder / w).is_file()), None)
        if weights is None:
            raise CheckpointError(f"there are no weights: expected one of {', '.join(_WEIGHTS)}")
        _check_tokenizer_files(folder)
        identity = fingerprint(folder, weights, extra=VOCABULARY_FILES)
    except CheckpointError as error:
        raise InvalidRequest(field, f"{name}: {error.problem}") from error
    return ScoringCheckpoint(name, folder, weights, identity, field)


def load_checked(checkpoint: ScoringCheckpoint, load: Callable[[Path], T]) -> T:
    """``load(folder)``, then a check that no fingerprinted file changed meanwhile.

    A file that cannot be read (damaged weights, a broken tokenizer file) or that changed is
    refused as an `InvalidRequest` naming the checkpoint's field, with the reader's own message.
    """
    try:
        loaded = load(checkpoint.folder)
        checkpoint.fingerprint.check_unchanged()
    except CheckpointError as error:
        raise checkpoint.refuse(error.problem) from error
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:  # transformers' errors for broken files
        raise checkpoint.refuse(f"cannot be loaded ({type(error).__name__}: {error})") from error
    return loaded


def input_limit(checkpoint: ScoringCheckpoint, tokenizer: Any) -> int:
    """The tokenizer's ``model_max_length`` (tokens per input), refused when the checkpoint does not set it."""
    limit = tokenizer.model_max_length
    if not isinstance(limit, int) or limit >= _UNSET_LENGTH:
        raise checkpoint.refuse("its tokenizer sets no model_max_length (in tokenizer_config.json), so inputs "
                                "cannot be truncated to what the model's positions allow; set it there")
    return limit


def call_cost(log: Any, batches: int) -> dict[str, Any]:
    """``{"batches", "seconds", "peak_bytes", "peak_source"}`` of a `bart_opt.engine.memory.MemoryLog` over
    one `score` call: on CUDA the allocator's peak above the start, on CPU the tensors made meanwhile."""
    report = log.report()
    return {"batches": batches, "seconds": report["seconds"], "peak_bytes": report["peak_bytes"],
            "peak_source": report["peak_source"]}


def _check_tokenizer_files(folder: Path) -> None:
    """Raise `CheckpointError` unless `folder` holds some tokenizer's files.

    AutoTokenizer would otherwise build a tokenizer from its special tokens alone, or fail with a
    message about something else.
    """
    if (folder / "tokenizer.json").is_file() or (folder / "vocab.txt").is_file():
        return
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return
    if any(folder.glob("*.model")):
        return
    raise CheckpointError("the tokenizer files are missing: there is no tokenizer.json, vocab.txt, vocab.json with "
                          "merges.txt, or sentencepiece model; copy the model's tokenizer into the folder")


__all__ = ["PATTERNS", "ScoringCheckpoint", "VOCABULARY_FILES", "call_cost", "input_limit", "load_checked",
           "open_checkpoint"]
