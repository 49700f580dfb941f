"""Generation settings, resolved once: `GenerationSpec`.

A spec is resolved from three sources, in transformers 5's order of precedence: the caller's
overrides, then the checkpoint's generation config (``generation_config.json``; transformers 5
leaves unset fields ``None``), then transformers' global defaults. The result is frozen and
hashable: the same value is the service's micro-batching key, what a job stores, and what
`Bart.generate` and the `Summarizer` run. Nothing downstream re-validates or re-merges it.

Length semantics are transformers 5's, with BART's one-token decoder prompt (the decoder
start token) counted in every length:

- ``max_new_tokens`` (caller's or checkpoint's) wins over ``max_length``:
  ``max_length = max_new_tokens + 1``; with neither set anywhere, ``max_length = min(20 + 1,
  max_position_embeddings)``;
- ``min_new_tokens`` wins over ``min_length``: ``min_length = min_new_tokens + 1``.

Every rule is checked here and a violation raises `InvalidRequest` naming the option.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from bart_opt.errors import InvalidRequest


@dataclass(frozen=True)
class RequestOption:
    """One option a user may set: its kind (``count``: an integer of at least `minimum`; ``number``:
    a finite number; ``early_stopping``: true, false or "never"), a short label and a description."""

    kind: str
    label: str
    help: str
    minimum: int | None = None


# Options a user of the service or the command line may set (None: "the checkpoint's default"): the
# one list the command line's flags, the API's GenerationOptions and the dashboard's form come from.
REQUEST_OPTIONS: dict[str, RequestOption] = {
    "num_beams": RequestOption("count", "Beams", "Beams; 1 is greedy search. At most MAX_BEAMS.", 1),
    "max_length": RequestOption(
        "count", "Max length", "Longest output, decoder start token included; at most the model's positions + 1.", 1),
    "max_new_tokens": RequestOption(
        "count", "Max new tokens", "Longest output, start token excluded (wins over max_length).", 1),
    "min_length": RequestOption("count", "Min length", "Shortest output, decoder start token included.", 0),
    "min_new_tokens": RequestOption(
        "count", "Min new tokens", "Shortest output, start token excluded (wins over min_length).", 0),
    "length_penalty": RequestOption("number", "Length penalty", "Exponent of the length normalization, in [-10, 10]."),
    "no_repeat_ngram_size": RequestOption(
        "count", "No-repeat n-gram", "No n-gram of this size appears twice; 0 is off.", 0),
    "early_stopping": RequestOption("early_stopping", "Early stopping", 'Beam search stop rule: true, false or "never".'),
}
EARLY_STOPPING = (True, False, "never")  # the values early_stopping takes
# Token options, for library callers; as in transformers, an explicit None switches one off.
TOKEN_OPTIONS = (
    "forced_bos_token_id", "forced_eos_token_id", "decoder_start_token_id", "bos_token_id", "eos_token_id",
    "pad_token_id",
)
# Options that would change the output unless left at these values: accepted only at them.
NEUTRAL_VALUES: dict[str, Any] = {
    "do_sample": False, "num_return_sequences": 1, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None, "force_words_ids": None, "constraints": None, "sequence_bias": None,
    "suppress_tokens": None, "begin_suppress_tokens": None, "exponential_decay_length_penalty": None,
    "renormalize_logits": False, "remove_invalid_values": False, "guidance_scale": None, "use_cache": True,
    "max_time": None, "stop_strings": None, "low_memory": None,
}
# transformers 5's `GenerationConfig._get_default_generation_params()` for the options we implement.
GLOBAL_DEFAULTS = {"max_length": 20, "min_length": 0, "num_beams": 1, "length_penalty": 1.0,
                   "no_repeat_ngram_size": 0, "early_stopping": False}
# |length_penalty| bound: 1025 ** 10 ~ 1.3e30 keeps every length-normalized score finite in float32.
LENGTH_PENALTY_LIMIT = 10.0
_COUNTS = {name: option.minimum for name, option in REQUEST_OPTIONS.items() if option.kind == "count"}


@dataclass(frozen=True)
class GenerationSpec:
    """Resolved generation settings; lengths count the decoder start token, as transformers does.

    Build it with `GenerationSpec.resolve` (or `Bart.generation_spec` / `Summarizer.generation_spec`);
    `to_dict` / `from_dict` round-trip it through JSON for storage.
    """

    num_beams: int
    max_length: int
    min_length: int
    length_penalty: float
    no_repeat_ngram_size: int
    early_stopping: bool | str
    forced_bos_token_id: int | None
    forced_eos_token_id: tuple[int, ...] | None
    decoder_start_token_id: int
    eos_token_id: tuple[int, ...] | None
    pad_token_id: int | None

    @property
    def max_new_tokens(self) -> int:
        """Most tokens generated after the decoder start token."""
        return self.max_length - 1

    @classmethod
    def resolve(
        cls,
        config,
        generation_config,
        overrides: Mapping[str, Any] | None = None,
        *,
        max_beams: int | None = None,
    ) -> GenerationSpec:
        """Merge `overrides` over the checkpoint's `generation_config` over the global defaults, and check.

        `config` is the model's `BartConfig` (positions, vocabulary, fallback token ids);
        `max_beams` caps ``num_beams`` (None: no cap). Raises `InvalidRequest` naming the option.
        """
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(REQUEST_OPTIONS) - set(TOKEN_OPTIONS) - set(NEUTRAL_VALUES))
        if unknown:
            raise InvalidRequest(unknown[0], f"unsupported generation option {unknown[0]!r}; supported: "
                                             f"{', '.join(REQUEST_OPTIONS)}")
        given = {key: value for key, value in overrides.items() if value is not None or key in TOKEN_OPTIONS}
        merged = _Merged(given, generation_config, config)
        for key in (*REQUEST_OPTIONS, *TOKEN_OPTIONS):
            problem = _type_problem(key, merged.token(key) if key in TOKEN_OPTIONS else merged.get(key))
            if problem is not None:
                raise InvalidRequest(key, merged.blame(key, problem))
        for key, neutral in NEUTRAL_VALUES.items():
            value = merged.get(key)
            if value is not None and value != neutral and not (neutral is None and value in ([], {})):
                raise InvalidRequest(key, merged.blame(key, f"{value!r} is not supported (only {neutral!r})"))
        spec = cls(
            num_beams=merged.get("num_beams", GLOBAL_DEFAULTS["num_beams"]),
            max_length=_max_length(merged, config),
            min_length=_min_length(merged),
            length_penalty=float(merged.get("length_penalty", GLOBAL_DEFAULTS["length_penalty"])),
            no_repeat_ngram_size=merged.get("no_repeat_ngram_size", GLOBAL_DEFAULTS["no_repeat_ngram_size"]),
            early_stopping=merged.get("early_stopping", GLOBAL_DEFAULTS["early_stopping"]),
            forced_bos_token_id=merged.token("forced_bos_token_id"),
            forced_eos_token_id=_as_tuple(merged.token("forced_eos_token_id")),
            decoder_start_token_id=_start_token(merged),
            eos_token_id=_as_tuple(merged.token("eos_token_id")),
            pad_token_id=_pad_token(merged),
        )
        _check_rules(spec, merged, config, max_beams)
        return spec

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (token id tuples as lists)."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GenerationSpec:
        """Rebuild a spec stored with `to_dict` (the stored value was checked when it was resolved)."""
        names = {f.name for f in fields(cls)}
        if set(data) != names:
            raise ValueError(f"a stored generation spec needs exactly the keys {sorted(names)}; got {sorted(data)}")
        values = dict(data)
        for key in ("forced_eos_token_id", "eos_token_id"):
            values[key] = _as_tuple(values[key])
        return cls(**values)


class _Merged:
    """Where each value comes from: the caller's overrides, else the checkpoint's generation config.

    Token ids come from the generation config alone, as in transformers 5 (a generation config
    without ``eos_token_id`` generates to ``max_length``). One extension: a generation config that
    names no start token at all (neither ``decoder_start_token_id`` nor ``bos_token_id``), with
    which transformers cannot generate, takes every token id from the model's config.json instead.
    """

    def __init__(self, given: dict[str, Any], generation_config, config) -> None:
        self.given = given
        self.generation_config = generation_config
        self.config = config
        self.tokens_from_config = all(self._stated(key) is None for key in ("decoder_start_token_id", "bos_token_id"))

    def _stated(self, key: str) -> Any:
        """The caller's value (an explicit None included), else the generation config's (None when unset)."""
        return self.given[key] if key in self.given else getattr(self.generation_config, key, None)

    def get(self, key: str, default: Any = None) -> Any:
        value = self._stated(key)
        return default if value is None else value

    def token(self, key: str) -> Any:
        """A token id option as stated, or the config.json value when `tokens_from_config`."""
        value = self._stated(key)
        if value is None and self.tokens_from_config and key not in self.given:
            value = getattr(self.config, key, None)
        return value

    def is_set(self, key: str) -> bool:
        return self.get(key) is not None

    def blame(self, key: str, message: str) -> str:
        """`message`, saying when the value is the checkpoint's rather than the caller's."""
        if key in self.given:
            return message
        return f"{message} (the checkpoint's generation_config.json sets it; override {key})"


def _type_problem(key: str, value: Any) -> str | None:
    """What is wrong with the type of `value` for option `key` (None when nothing): strict types,
    no bools for numbers, no strings but early_stopping's "never"."""
    if value is None:
        return None
    if key in _COUNTS:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, got {_describe(value)}"
        if value < _COUNTS[key]:
            return f"must be >= {_COUNTS[key]}, got {value}"
    elif key == "length_penalty":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"must be a finite number, got {_describe(value)}"
    elif key == "early_stopping":
        if not (isinstance(value, bool) or value == "never"):
            return f'must be true, false or "never", got {_describe(value)}'
    elif key in TOKEN_OPTIONS:
        ids = value if isinstance(value, (list, tuple)) else [value]
        multiple = key in ("eos_token_id", "forced_eos_token_id")
        if not ids or (len(ids) > 1 and not multiple) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            return f"must be {'a token id or a list of token ids' if multiple else 'a token id'}, got {_describe(value)}"
    return None


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _max_length(merged: _Merged, config) -> int:
    max_new = merged.get("max_new_tokens")
    if max_new is not None:
        return max_new + 1
    if merged.is_set("max_length"):
        return merged.get("max_length")
    return min(GLOBAL_DEFAULTS["max_length"] + 1, config.max_position_embeddings)


def _min_length(merged: _Merged) -> int:
    min_new = merged.get("min_new_tokens")
    if min_new is not None:
        return min_new + 1
    return merged.get("min_length", GLOBAL_DEFAULTS["min_length"])


def _start_token(merged: _Merged) -> int:
    start = merged.token("decoder_start_token_id")
    if start is None:
        start = merged.token("bos_token_id")
    if start is None:
        raise InvalidRequest("decoder_start_token_id", "must be set (or bos_token_id) to generate")
    return start


def _pad_token(merged: _Merged) -> int | None:
    pad = merged.token("pad_token_id")
    if pad is None:
        eos = _as_tuple(merged.token("eos_token_id"))
        pad = eos[0] if eos else None
    return pad


def _as_tuple(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def _length_field(merged: _Merged, new_key: str, key: str) -> str:
    """Which option decided a length: the `*_new_tokens` one when it is set, else the plain one."""
    return new_key if merged.is_set(new_key) else key


def _check_rules(spec: GenerationSpec, merged: _Merged, config, max_beams: int | None) -> None:
    """Cross-field rules and the model's limits."""
    if max_beams is not None and spec.num_beams > max_beams:
        raise InvalidRequest("num_beams", merged.blame("num_beams", f"{spec.num_beams} is above the limit of {max_beams}"))
    max_field = _length_field(merged, "max_new_tokens", "max_length")
    if spec.max_length < 2:
        raise InvalidRequest(max_field, merged.blame(
            max_field, "leaves no room for a summary: max_length counts the decoder start token, so it must be >= 2"))
    positions = config.max_position_embeddings
    if spec.max_length - 1 > positions:
        raise InvalidRequest(max_field, merged.blame(
            max_field, f"asks for {spec.max_length - 1} decoder positions; the model has {positions} (max_position_embeddings)"))
    if spec.min_length > spec.max_length:
        min_field = _length_field(merged, "min_new_tokens", "min_length")
        culprit = min_field if min_field in merged.given or max_field not in merged.given else max_field
        raise InvalidRequest(culprit, (
            f"min_length {spec.min_length} is above max_length {spec.max_length} (both count the decoder start "
            f"token; {_origin(merged, min_field)} {min_field}, {_origin(merged, max_field)} {max_field}); "
            "lower the minimum or raise the maximum"))
    if abs(spec.length_penalty) > LENGTH_PENALTY_LIMIT:
        raise InvalidRequest("length_penalty", merged.blame(
            "length_penalty", f"{spec.length_penalty} is outside [-{LENGTH_PENALTY_LIMIT:g}, {LENGTH_PENALTY_LIMIT:g}]"))
    vocab = config.vocab_size
    for key in ("forced_bos_token_id", "forced_eos_token_id", "decoder_start_token_id", "eos_token_id", "pad_token_id"):
        ids = _as_tuple(getattr(spec, key))
        if ids and any(not 0 <= i < vocab for i in ids):
            raise InvalidRequest(key, merged.blame(key, f"{getattr(spec, key)!r} is outside the vocabulary [0, {vocab})"))


def _origin(merged: _Merged, key: str) -> str:
    return "your" if key in merged.given else "the checkpoint's"
