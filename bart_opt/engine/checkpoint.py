"""A checkpoint must be whole to serve: its tokenizer files present, its tokenizer fitting its model.

`load_tokenizer` refuses a folder without tokenizer files: `AutoTokenizer` would otherwise
build a BART tokenizer from nothing but its five special tokens (every text then encodes to
``<s></s>`` and every summary is ""). `check_tokenizer` holds a loaded tokenizer against the
model's config and generation config:

* every id the tokenizer maps *text* to (its vocabulary less its special tokens) has an
  embedding row: the highest is below ``config.vocab_size``;
* special tokens beyond the rows are allowed when the config names none of them:
  facebook/bart-large-cnn has 50,264 embedding rows and a 50,265-token tokenizer whose last
  id, 50,264, is ``<mask>``, which its fine-tuning never used. A text that spells such a
  token out is refused by `check_embeddable` (an `InvalidRequest` naming the text), not sent
  to the model;
* fewer tokens than rows are allowed: rows past the tokenizer are never looked up for an
  input (fairseq's bart.base pads its 50,265 tokens to 51,201 rows);
* the tokenizer's ``<s>``, ``</s>`` and ``<pad>`` ids equal the config's ``bos_token_id``,
  ``eos_token_id`` and ``pad_token_id`` (inputs are framed and padded with them), its end token is one of the
  generation config's ``eos_token_id``, and the ids the generation config writes into a
  summary (``decoder_start_token_id``, ``forced_bos_token_id``, ``forced_eos_token_id``) are
  special tokens of the tokenizer, so decoding strips them.

Each refusal is a `bart_opt.errors.CheckpointError` naming the file or token at fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from transformers import BartConfig, GenerationConfig

from bart_opt.errors import CheckpointError, InvalidRequest

# The files a BART tokenizer is read from (those present count in the checkpoint's fingerprint).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json")
_SLOW_FILES = ("vocab.json", "merges.txt")
_FRAMING_TOKENS = ("bos", "eos", "pad")
_WRITTEN_IDS = ("decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id")


def check_tokenizer_files(folder: Path) -> None:
    """Raise `CheckpointError` unless `folder` holds ``tokenizer.json``, or ``vocab.json`` and ``merges.txt``."""
    if (folder / "tokenizer.json").is_file():
        return
    missing = [name for name in _SLOW_FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"the tokenizer files are missing: there is no tokenizer.json, and no "
                              f"{' and no '.join(missing)}; copy the tokenizer the model was trained with into "
                              "the checkpoint folder", folder)


def load_tokenizer(folder: Path):
    """The tokenizer (`AutoTokenizer`) of the checkpoint `folder` (local, or the hub cache's:
    `bart_opt.engine.loading.resolve_checkpoint`), once its files are known to be there.

    Raises `CheckpointError` for missing tokenizer files or a tokenizer that cannot be read.
    """
    from transformers import AutoTokenizer

    check_tokenizer_files(folder)
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError, KeyError) as error:  # the classes a broken tokenizer file raises
        raise CheckpointError("the tokenizer files cannot be read", folder, f"{type(error).__name__}: {error}") from error


def special_ids(tokenizer) -> set[int]:
    """Ids of the tokenizer's special tokens (named ones and added tokens marked special)."""
    added = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    return added | set(tokenizer.all_special_ids)


def check_tokenizer(tokenizer, config: BartConfig, generation_config: GenerationConfig) -> None:
    """Raise `CheckpointError` unless `tokenizer` fits the model (the rules in the module docstring)."""
    rows = config.vocab_size
    special = special_ids(tokenizer)
    vocabulary = tokenizer.get_vocab()  # token -> id, added tokens included
    regular = {i: token for token, i in vocabulary.items() if i not in special}
    if not regular:
        raise CheckpointError(f"the tokenizer holds only its {len(special)} special tokens and no vocabulary "
                              "(its files are empty or not this model's)")
    highest = max(regular)
    if highest >= rows:
        raise CheckpointError(
            f"the tokenizer maps text to ids up to {highest} (token {regular[highest]!r}), but the model has "
            f"{rows} embedding rows (vocab_size in config.json); use the tokenizer the model was trained with")
    for name in _FRAMING_TOKENS:
        ours, theirs = getattr(tokenizer, f"{name}_token_id"), getattr(config, f"{name}_token_id")
        if theirs is not None and ours != theirs:
            token = getattr(tokenizer, f"{name}_token", None)
            raise CheckpointError(f"the tokenizer's {name} token {token!r} is id {ours}, but config.json says "
                                  f"{name}_token_id {theirs}; the tokenizer is not this model's")
    ends = _ids(generation_config.eos_token_id)
    if ends and tokenizer.eos_token_id not in ends:
        raise CheckpointError(f"the tokenizer's end token {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}) is "
                              f"not the generation config's eos_token_id {generation_config.eos_token_id}")
    for key in _WRITTEN_IDS:
        value = getattr(generation_config, key, None)
        if value is None and key == "decoder_start_token_id":
            value = config.decoder_start_token_id
        for token_id in _ids(value):
            if token_id not in special or token_id >= rows:
                where = "outside the model's embedding rows" if token_id >= rows else "not a special token of the tokenizer"
                raise CheckpointError(f"the generation config's {key} {token_id} is {where}; summaries would "
                                      "carry it as text")


def check_embeddable(ids_per_text: Sequence[Sequence[int]], rows: int, tokenizer) -> None:
    """Raise `InvalidRequest` naming ``texts[i]`` for the first text whose ids reach past the
    model's `rows` embedding rows (a special token beyond them, spelt out in the text)."""
    for i, ids in enumerate(ids_per_text):
        if ids and max(ids) >= rows:
            token_id = next(t for t in ids if t >= rows)
            token = tokenizer.convert_ids_to_tokens(token_id)
            raise InvalidRequest(f"texts[{i}]", f"holds the token {token!r} (id {token_id}), which this model has no "
                                 f"embedding for (it has {rows} rows); remove it from the text")


def _ids(value) -> tuple[int, ...]:
    """A token id setting (None, an int or a list of ints) as a tuple."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)
