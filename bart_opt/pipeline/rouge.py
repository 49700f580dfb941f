"""ROUGE on Google's `rouge-score`, with the CNN/DailyMail conventions built in, in any language.

`RougeSettings` is the one owner of what decides a ROUGE number: the types, the tokenizer, the
language (its stemmer and its sentence splitter, `bart_opt.pipeline.rouge_text`), the backend, and the
bootstrap that gives the interval. It is frozen, recorded with every run and job
(`to_dict`), printed as a sacrebleu-style `signature`, and builds the `RougeScorer` (`scorer`).
Two numbers whose settings agree on the fields in `SCORE_FIELDS` are comparable.

Conventions:

* **Stemming** (on by default): rouge-score's Porter stemmer for English, as the CNN/DM reference
  scripts of the transformers examples use it; Snowball for the languages nltk covers; none else.
* **rougeLsum sentence splitting**: rouge-score computes rougeLsum over lines, so both the
  prediction and the reference are split one sentence per line first
  (`bart_opt.pipeline.rouge_text.split_sentences`). Without this rougeLsum collapses to rougeL (about 30
  instead of about 41 for bart-large-cnn). Nothing is downloaded at run time.
* **The point estimate** (``mid``) is the **mean over examples** of each measure, summed exactly
  (`math.fsum`, so any order of the same examples gives the same float); ``low`` and ``high`` are
  the 2.5th and 97.5th percentiles of `bootstrap_samples` bootstrap means, drawn from a seeded
  numpy `Generator`, as rouge-score's `BootstrapAggregator` computes its interval. rouge-score and
  HF ``evaluate`` put the bootstrap median at ``mid`` instead; it moves with the seed and the
  number of resamples and differs from the mean that paired tests difference (docs/evaluation.md).
* **Several references**: `score_multi` scores against each and keeps, per type, the reference with
  the best F-measure, as rouge-score's ``score_multi`` does.

All scores are on a 0-100 scale.

The scoring itself runs on `rouge-score-rs`, a Rust reimplementation of rouge-score, where it is
installed: it gives bit-identical scores (checked on every score type, with and without stemming
and with a custom tokenizer, over a corpus of CNN-like text, prose and edge cases:
`tests/bart_opt/pipeline/test_rouge.py`) at a fraction of the cost. Without it, rouge-score itself runs.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np
from rouge_score import rouge_scorer as reference_rouge

from bart_opt.errors import InvalidRequest
from bart_opt.pipeline.rouge_text import (
    TOKENIZERS, UnicodeWordTokenizer, check_language, make_tokenizer, split_sentences, splitter_name, stemmer_name,
)
from bart_opt.scoring.base import CONFIDENCE, bootstrap_interval, mean

try:
    from rouge_score_rs import rouge_scorer as fast_rouge
except ImportError:  # no wheel for this platform: rouge-score gives the same scores, slower
    fast_rouge = None

DEFAULT_ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
MEASURES = ("precision", "recall", "fmeasure")
BACKENDS = {"rouge-score-rs": fast_rouge, "rouge-score": reference_rouge}
DEFAULT_BACKEND = "rouge-score-rs" if fast_rouge is not None else "rouge-score"
POINT_ESTIMATE = "mean"  # what ``mid`` is: the mean over examples (see the module docstring)
CUSTOM = "custom"  # the tokenizer of a scorer given a tokenizer object: recorded, not rebuilt

# The recorded fields that change a score (a run scored otherwise is not comparable, nor resumed);
# the others change only the interval (bootstrap) or nothing at all (the backend: bit-identical).
SCORE_FIELDS = ("types", "tokenizer", "lang", "stemmer", "splitter")
INTERVAL_FIELDS = ("bootstrap_samples", "seed", "confidence", "point")
_TYPE_LABELS = {"rougeL": "L", "rougeLsum": "Lsum"}


class Tokenizer(Protocol):
    """What rouge-score accepts as a tokenizer: `tokenize(text) -> list[str]`."""

    def tokenize(self, text: str) -> list[str]: ...


def _check_rouge_types(rouge_types: Sequence[str]) -> tuple[str, ...]:
    types = tuple(rouge_types)
    if not types:
        raise ValueError("rouge_types is empty; expected some of rouge1..rouge9, rougeL, rougeLsum")
    for rouge_type in types:
        if not re.fullmatch(r"rouge[1-9]|rougeL|rougeLsum", str(rouge_type)):
            raise ValueError(
                f"unknown ROUGE type {rouge_type!r}; expected rouge1..rouge9, rougeL or rougeLsum"
            )
    if len(set(types)) != len(types):
        raise ValueError(f"rouge_types has duplicates: {list(types)}")
    return types


def backend_version(backend: str) -> str | None:
    """The installed version of the package behind `backend` (None when it is not installed)."""
    try:
        return importlib.metadata.version({"rouge-score-rs": "rouge-score-rs", "rouge-score": "rouge-score"}[backend])
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class RougeSettings:
    """Everything that decides a ROUGE number (see the module docstring); frozen, checked once here.

    rouge_types: any of rouge1..rouge9, rougeL, rougeLsum.
    tokenizer: ``default`` (rouge-score's: ``[a-z0-9]`` only), ``unicode`` or ``script``
        (`bart_opt.pipeline.rouge_text`); ``custom`` only as recorded from a scorer given a tokenizer object.
    lang: an ISO 639-1 code of `bart_opt.pipeline.rouge_text.LANGUAGES`: it picks the stemmer and the
        rougeLsum sentence splitter. The default tokenizer is English-only: another language needs
        ``unicode`` or ``script``.
    use_stemmer: stem where the language has a stemmer.
    backend: ``rouge-score-rs`` (the default where installed) or ``rouge-score``.
    bootstrap_samples / seed: the bootstrap of the 95% interval.

    Raises `InvalidRequest` naming the field (``tokenizer``, ``lang``, ...) for a bad value.
    """

    rouge_types: tuple[str, ...] = DEFAULT_ROUGE_TYPES
    tokenizer: str = "default"
    lang: str = "en"
    use_stemmer: bool = True
    backend: str = DEFAULT_BACKEND
    bootstrap_samples: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "rouge_types", _check_rouge_types(self.rouge_types))
        except ValueError as error:
            raise InvalidRequest("rouge_types", str(error)) from None
        if self.tokenizer not in (*TOKENIZERS, CUSTOM):
            raise InvalidRequest("tokenizer", f"must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        try:
            check_language(self.lang)
        except ValueError as error:
            raise InvalidRequest("lang", str(error)) from None
        if self.tokenizer == "default" and self.lang != "en":
            raise InvalidRequest("lang", f"the default tokenizer is rouge-score's English one (it keeps only a-z and "
                                 f"0-9); for {self.lang!r} choose the tokenizer unicode or script")
        if BACKENDS.get(self.backend) is None:
            available = [name for name, module in BACKENDS.items() if module is not None]
            raise InvalidRequest("backend", f"unknown or uninstalled ROUGE backend {self.backend!r}; "
                                 f"available: {available}")
        if isinstance(self.bootstrap_samples, bool) or not isinstance(self.bootstrap_samples, int):
            raise InvalidRequest("bootstrap_samples", f"must be an int, got {self.bootstrap_samples!r}")
        if self.bootstrap_samples < 1:
            raise InvalidRequest("bootstrap_samples", f"must be >= 1, got {self.bootstrap_samples}")

    @property
    def stemmer(self) -> str:
        """``porter``, ``snowball-<language>`` or ``none``."""
        if self.tokenizer == CUSTOM:
            return CUSTOM
        return stemmer_name(self.lang, self.use_stemmer)

    @property
    def splitter(self) -> str:
        """The rougeLsum sentence splitter: ``punkt-en`` or ``punkt+marks`` (`bart_opt.pipeline.rouge_text`)."""
        return splitter_name(self.lang)

    def scorer(self) -> RougeScorer:
        """The scorer of these settings (one per distinct settings in a process)."""
        return _scorer(self)

    def to_dict(self) -> dict:
        """The settings as recorded with a run or a job (what `from_dict` reads back), with the
        derived stemmer, splitter, backend version and point estimate."""
        return {"types": list(self.rouge_types), "tokenizer": self.tokenizer, "lang": self.lang,
                "use_stemmer": self.use_stemmer, "stemmer": self.stemmer, "splitter": self.splitter,
                "backend": self.backend, "backend_version": backend_version(self.backend),
                "bootstrap_samples": self.bootstrap_samples, "seed": self.seed, "confidence": CONFIDENCE,
                "point": POINT_ESTIMATE}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RougeSettings:
        """Settings from `to_dict`'s shape (unknown keys and the derived ones are ignored)."""
        keys = {"types": "rouge_types", "tokenizer": "tokenizer", "lang": "lang", "use_stemmer": "use_stemmer",
                "backend": "backend", "bootstrap_samples": "bootstrap_samples", "seed": "seed"}
        given = {name: data[key] for key, name in keys.items() if key in data}
        if "rouge_types" in given:
            given["rouge_types"] = tuple(given["rouge_types"])
        if given.get("backend") is not None and BACKENDS.get(given["backend"]) is None:
            given.pop("backend")  # recorded where another backend was installed: both give the same scores
        return cls(**given)

    def signature(self, nrefs: str | int = 1) -> str:
        """The sacrebleu-style signature of these settings: ``nrefs:1|rouge:1,2,L,Lsum|tok:default|
        lang:en|stem:porter|split:punkt-en|point:mean|ci:95%-bootstrap-1000-seed0|backend:rouge-score-rs-0.2.1``."""
        types = ",".join(_TYPE_LABELS.get(t, t.removeprefix("rouge")) for t in self.rouge_types)
        version = backend_version(self.backend)
        return "|".join([
            f"nrefs:{nrefs}", f"rouge:{types}", f"tok:{self.tokenizer}", f"lang:{self.lang}",
            f"stem:{self.stemmer}", f"split:{self.splitter}", f"point:{POINT_ESTIMATE}",
            f"ci:{CONFIDENCE:.0%}-bootstrap-{self.bootstrap_samples}-seed{self.seed}",
            f"backend:{self.backend}" + (f"-{version}" if version else ""),
        ])


@functools.cache
def _scorer(settings: RougeSettings) -> RougeScorer:
    return RougeScorer(settings=settings)


def settings_differences(earlier: Mapping[str, Any] | None, current: Mapping[str, Any],
                         fields: Sequence[str] = SCORE_FIELDS) -> list[tuple[str, Any, Any]]:
    """``(field, earlier, current)`` for each of `fields` on which two recorded settings (`to_dict`) differ."""
    earlier = earlier or {}
    return [(name, earlier.get(name), current.get(name)) for name in fields if earlier.get(name) != current.get(name)]


class RougeScorer:
    """Per-item ROUGE scores and aggregates (mean, bootstrap interval), on a 0-100 scale.

    Built from `RougeSettings` (``settings=``, or `RougeSettings.scorer`), or from the settings'
    fields as keyword arguments:

    Args:
        use_stemmer: stem where the language has a stemmer (rouge-score's Porter rule for
            English: tokens longer than 3 characters). On by default, as in the CNN/DM reference
            scripts. Ignored when `tokenizer` is an object: stemming is then its job.
        bootstrap_samples: number of bootstrap resamples for the 95% interval (rouge-score and
            the reference scripts use 1000).
        seed: seed of the numpy Generator used by every `aggregate` call; the same items and
            seed always give the same interval.
        rouge_types: any of rouge1..rouge9, rougeL, rougeLsum.
        tokenizer: ``"default"``, ``"unicode"`` or ``"script"`` (`bart_opt.pipeline.rouge_text`), or an
            object with `tokenize(text) -> list[str]` passed to rouge-score as it is. The default
            tokenizer keeps only `[a-z0-9]`, so non-Latin text scores 0 with it.
        backend: "rouge-score-rs" (the default where installed) or "rouge-score": the package
            that computes the scores. Both give identical scores.
        lang: the language (stemmer, sentence splitter); see `RougeSettings`.

    Example:
        >>> scorer = RougeScorer()
        >>> item = scorer.score("the cat sat", "the cat sat down")
        >>> item["rouge1"]["recall"]
        75.0
    """

    def __init__(
        self,
        use_stemmer: bool = True,
        bootstrap_samples: int = 1000,
        seed: int = 0,
        rouge_types: Sequence[str] = DEFAULT_ROUGE_TYPES,
        tokenizer: Tokenizer | str | None = None,
        backend: str = DEFAULT_BACKEND,
        *,
        lang: str = "en",
        settings: RougeSettings | None = None,
    ):
        custom = tokenizer is not None and not isinstance(tokenizer, str)
        if settings is None:
            settings = RougeSettings(tuple(rouge_types), CUSTOM if custom else tokenizer or "default", lang,
                                     bool(use_stemmer) and not custom, backend, bootstrap_samples, seed)
        self.settings = settings
        self.backend = settings.backend
        self.rouge_types = settings.rouge_types
        self.bootstrap_samples = settings.bootstrap_samples
        self.seed = settings.seed
        self.tokenizer = tokenizer if custom else make_tokenizer(settings.tokenizer, settings.lang, settings.use_stemmer)
        # rouge-score's own tokenizer stems with Porter; the others stem inside `tokenize`.
        self.use_stemmer = settings.use_stemmer and self.tokenizer is None
        token_types = [t for t in self.rouge_types if t != "rougeLsum"]
        # rougeLsum gets its own scorer: it sees the sentence-per-line texts, the others the
        # texts as given (rouge-score's tokens are the same either way; this keeps it obvious).
        self._token_scorer = self._make_scorer(token_types) if token_types else None
        self._lsum_scorer = self._make_scorer(["rougeLsum"]) if "rougeLsum" in self.rouge_types else None

    def _make_scorer(self, rouge_types: list[str]):
        return BACKENDS[self.backend].RougeScorer(
            rouge_types, use_stemmer=self.use_stemmer, split_summaries=False, tokenizer=self.tokenizer
        )

    def split(self, text: str) -> list[str]:
        """The sentences of `text` as rougeLsum sees them (the settings' language)."""
        return split_sentences(text, self.settings.lang)

    def score(self, prediction: str, reference: str) -> dict[str, dict[str, float]]:
        """Score one prediction against one reference.

        Returns `{rouge_type: {"precision", "recall", "fmeasure"}}` for each configured type,
        as plain floats in 0-100. Empty texts are allowed and score 0.
        """
        for name, value in (("prediction", prediction), ("reference", reference)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        scores = {}
        if self._token_scorer is not None:
            scores.update(self._token_scorer.score(reference, prediction))
        if self._lsum_scorer is not None:
            scores.update(
                self._lsum_scorer.score("\n".join(self.split(reference)), "\n".join(self.split(prediction)))
            )
        return {
            rouge_type: {m: 100.0 * float(getattr(scores[rouge_type], m)) for m in MEASURES}
            for rouge_type in self.rouge_types
        }

    def score_multi(self, prediction: str, references: Sequence[str]) -> dict[str, dict[str, float]]:
        """Score one prediction against several references: per type, the scores against the reference
        with the highest F-measure (the first of equals), as rouge-score's ``score_multi``."""
        if isinstance(references, str) or not references:
            raise ValueError("score_multi needs a non-empty list of references")
        scored = [self.score(prediction, reference) for reference in references]
        return {t: scored[int(np.argmax([s[t]["fmeasure"] for s in scored]))][t] for t in self.rouge_types}

    def score_any(self, prediction: str, reference: str | Sequence[str]) -> dict[str, dict[str, float]]:
        """`score` for one reference (a str), `score_multi` for a list of them."""
        return self.score(prediction, reference) if isinstance(reference, str) else self.score_multi(prediction, reference)

    def aggregate(
        self, items: Sequence[dict[str, dict[str, float]]]
    ) -> dict[str, dict[str, dict[str, float]]]:
        """Aggregate of per-item scores (as returned by `score`).

        Returns `{rouge_type: {"low", "mid", "high"}}`, each `{"precision", "recall", "fmeasure"}`:
        ``mid`` the mean over the items (`math.fsum`: the same items in any order give the same
        float), ``low`` and ``high`` the 2.5th and 97.5th percentiles of the mean over
        `bootstrap_samples` resamples (with replacement, same size as `items`). Each measure is
        averaged on its own (the aggregate fmeasure is the mean of per-item fmeasures).

        Reproducible: every call draws from a fresh `numpy.random.default_rng(seed)`.

        Raises:
            ValueError: `items` is empty (there is nothing to aggregate; callers that may have
                no scored items should check first), or an item lacks a configured type/measure.
        """
        if len(items) == 0:
            raise ValueError("cannot aggregate ROUGE over zero items")
        matrix = self._score_matrix(items)  # (N, types * measures)
        low, high = self._bootstrap(matrix)  # each (types * measures,)
        mid = [mean(matrix[:, k]) for k in range(matrix.shape[1])]
        result = {}
        for t, rouge_type in enumerate(self.rouge_types):
            cols = slice(t * len(MEASURES), (t + 1) * len(MEASURES))
            result[rouge_type] = {
                name: dict(zip(MEASURES, map(float, values[cols])))
                for name, values in (("low", low), ("mid", mid), ("high", high))
            }
        return result

    def _score_matrix(self, items: Sequence[dict[str, dict[str, float]]]) -> np.ndarray:
        rows = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ValueError(f"item {i} is {type(item).__name__}, expected a dict of ROUGE scores")
            row = []
            for rouge_type in self.rouge_types:
                if rouge_type not in item:
                    raise ValueError(f"item {i} has no {rouge_type!r} score; it has {sorted(item)}")
                missing = [m for m in MEASURES if m not in item[rouge_type]]
                if missing:
                    raise ValueError(f"item {i} {rouge_type!r} lacks {missing}")
                row.extend(float(item[rouge_type][m]) for m in MEASURES)
            rows.append(row)
        return np.asarray(rows, dtype=np.float64)

    def _bootstrap(self, matrix: np.ndarray) -> np.ndarray:
        """Percentiles (low, high) of bootstrap means; returns shape (2, K)."""
        return bootstrap_interval(matrix, self.bootstrap_samples, self.seed)


__all__ = ["BACKENDS", "CONFIDENCE", "DEFAULT_BACKEND", "DEFAULT_ROUGE_TYPES", "INTERVAL_FIELDS", "MEASURES",
           "POINT_ESTIMATE", "SCORE_FIELDS", "RougeScorer", "RougeSettings", "Tokenizer", "UnicodeWordTokenizer",
           "backend_version", "mean", "settings_differences", "split_sentences"]
