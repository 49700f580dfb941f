"""ROUGE on Google's `rouge-score`, with the CNN/DailyMail conventions built in.

Three settings decide whether numbers are comparable with published ones:

* **Stemming** (`use_stemmer=True` by default): the Porter stemmer, as the CNN/DM reference
  scripts of the transformers examples use it.
* **rougeLsum sentence splitting**: rouge-score computes rougeLsum over lines, so both the
  prediction and the reference are split one sentence per line by `split_sentences` before
  scoring. Without this rougeLsum collapses to rougeL (about 30 instead of about 41 for
  bart-large-cnn). The splitter works offline: nothing is downloaded at run time.
* **Bootstrap aggregation**: a 95% interval from resampling the per-item scores, as
  rouge-score's `BootstrapAggregator` does, but driven by a seeded numpy `Generator` so the same
  items always give the same interval.

All scores are on a 0-100 scale.

The scoring itself runs on `rouge-score-rs`, a Rust reimplementation of rouge-score, where it is
installed: it gives bit-identical scores (checked on every score type, with and without stemming
and with a custom tokenizer, over a corpus of CNN-like text, prose and edge cases:
`tests/bart_opt/test_rouge.py`) at a fraction of the cost. Without it, rouge-score itself runs.
"""

from __future__ import annotations

import re
from typing import Protocol, Sequence

import numpy as np
from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer
from rouge_score import rouge_scorer as reference_rouge

try:
    from rouge_score_rs import rouge_scorer as fast_rouge
except ImportError:  # no wheel for this platform: rouge-score gives the same scores, slower
    fast_rouge = None

DEFAULT_ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
MEASURES = ("precision", "recall", "fmeasure")
BACKENDS = {"rouge-score-rs": fast_rouge, "rouge-score": reference_rouge}
DEFAULT_BACKEND = "rouge-score-rs" if fast_rouge is not None else "rouge-score"
CONFIDENCE = 0.95

# Abbreviations that usually sit inside a sentence. Punkt without trained data would otherwise
# end a sentence at each of them ("Mr." | "Smith said ..."). Ones that often end a sentence
# ("etc.", "inc.", "p.m.") are left out on purpose: a missed split costs less than a wrong one.
_ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sen", "rep", "gov", "gen", "col", "lt", "sgt",
        "capt", "cmdr", "adm", "rev", "st", "jr", "sr", "mt", "ft", "vs", "e.g", "i.e",
        "u.s", "u.k", "u.n", "jan", "feb", "apr", "aug", "sept", "oct", "nov", "dec",
    }
)  # fmt: skip


def _make_sentence_splitter() -> PunktSentenceTokenizer:
    params = PunktParameters()
    params.abbrev_types = set(_ABBREVIATIONS)
    return PunktSentenceTokenizer(params)


_SPLITTER = _make_sentence_splitter()


def split_sentences(text: str) -> list[str]:
    """Split `text` into sentences, offline and deterministically.

    Lines are split first (CNN/DailyMail highlights are one sentence per line), then each line
    with nltk's Punkt algorithm using default, untrained parameters plus a short list of common
    English abbreviations. No model data is loaded, so the result does not depend on what
    `nltk.download` has put on the machine; it may differ slightly from `nltk.sent_tokenize`
    with the trained English model. Empty and whitespace-only pieces are dropped.
    """
    if not isinstance(text, str):
        raise TypeError(f"split_sentences expects a str, got {type(text).__name__}")
    sentences = []
    for line in text.splitlines():
        sentences.extend(s.strip() for s in _SPLITTER.tokenize(line))
    return [s for s in sentences if s]


class Tokenizer(Protocol):
    """What rouge-score accepts as a tokenizer: `tokenize(text) -> list[str]`."""

    def tokenize(self, text: str) -> list[str]: ...


class UnicodeWordTokenizer:
    """Lower-cased Unicode word tokens, for text that rouge-score's default tokenizer drops.

    rouge-score keeps only `[a-z0-9]` characters, so Cyrillic, Greek, Arabic, CJK, ... text scores
    0. This tokenizer keeps every run of Unicode word characters (`\\w+`) instead. It does not stem.
    Scripts written without spaces (Chinese, Japanese, Thai) need a real word segmenter; pass one
    with the same `tokenize` method as `RougeScorer(tokenizer=...)`.
    """

    _WORD = re.compile(r"\w+")

    def tokenize(self, text: str) -> list[str]:
        """Return the lower-cased word tokens of `text`."""
        return self._WORD.findall(text.lower())


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


class RougeScorer:
    """Per-item ROUGE scores and bootstrap aggregates, on a 0-100 scale.

    Args:
        use_stemmer: apply the Porter stemmer to tokens longer than 3 characters (rouge-score's
            rule). On by default, as in the CNN/DM reference scripts. Ignored when `tokenizer` is
            given: stemming is then the tokenizer's job.
        bootstrap_samples: number of bootstrap resamples for the 95% interval (rouge-score and
            the reference scripts use 1000).
        seed: seed of the numpy Generator used by every `aggregate` call; the same items and
            seed always give the same interval.
        rouge_types: any of rouge1..rouge9, rougeL, rougeLsum.
        tokenizer: an object with `tokenize(text) -> list[str]` passed to rouge-score. The
            default tokenizer keeps only `[a-z0-9]`, so non-Latin text scores 0 with it; use
            `UnicodeWordTokenizer()` or your own for such text.
        backend: "rouge-score-rs" (the default where installed) or "rouge-score": the package
            that computes the scores. Both give identical scores.

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
        tokenizer: Tokenizer | None = None,
        backend: str = DEFAULT_BACKEND,
    ):
        if BACKENDS.get(backend) is None:
            available = [name for name, module in BACKENDS.items() if module is not None]
            raise ValueError(f"unknown or uninstalled ROUGE backend {backend!r}; available: {available}")
        self.backend = backend
        if isinstance(bootstrap_samples, bool) or not isinstance(bootstrap_samples, int):
            raise TypeError(f"bootstrap_samples must be an int, got {bootstrap_samples!r}")
        if bootstrap_samples < 1:
            raise ValueError(f"bootstrap_samples must be >= 1, got {bootstrap_samples}")
        self.rouge_types = _check_rouge_types(rouge_types)
        self.use_stemmer = bool(use_stemmer) and tokenizer is None
        self.bootstrap_samples = bootstrap_samples
        self.seed = seed
        self.tokenizer = tokenizer
        token_types = [t for t in self.rouge_types if t != "rougeLsum"]
        # rougeLsum gets its own scorer: it sees the sentence-per-line texts, the others the
        # texts as given (rouge-score's tokens are the same either way; this keeps it obvious).
        self._token_scorer = self._make_scorer(token_types) if token_types else None
        self._lsum_scorer = self._make_scorer(["rougeLsum"]) if "rougeLsum" in self.rouge_types else None

    def _make_scorer(self, rouge_types: list[str]):
        return BACKENDS[self.backend].RougeScorer(
            rouge_types, use_stemmer=self.use_stemmer, split_summaries=False, tokenizer=self.tokenizer
        )

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
                self._lsum_scorer.score(
                    "\n".join(split_sentences(reference)), "\n".join(split_sentences(prediction))
                )
            )
        return {
            rouge_type: {m: 100.0 * float(getattr(scores[rouge_type], m)) for m in MEASURES}
            for rouge_type in self.rouge_types
        }

    def aggregate(
        self, items: Sequence[dict[str, dict[str, float]]]
    ) -> dict[str, dict[str, dict[str, float]]]:
        """Bootstrap aggregate of per-item scores (as returned by `score`).

        Returns `{rouge_type: {"low", "mid", "high"}}`, each `{"precision", "recall", "fmeasure"}`:
        the 2.5th, 50th and 97.5th percentiles of the mean over `bootstrap_samples` resamples
        (with replacement, same size as `items`), like rouge-score's AggregateScore. Each measure
        is averaged on its own (the aggregate fmeasure is the mean of per-item fmeasures).

        Reproducible: every call draws from a fresh `numpy.random.default_rng(seed)`.

        Raises:
            ValueError: `items` is empty (there is nothing to aggregate; callers that may have
                no scored items should check first), or an item lacks a configured type/measure.
        """
        if len(items) == 0:
            raise ValueError("cannot aggregate ROUGE over zero items")
        matrix = self._score_matrix(items)  # (N, types * measures)
        low, mid, high = self._bootstrap(matrix)  # each (types * measures,)
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
        """Percentiles (low, mid, high) of bootstrap means; returns shape (3, K)."""
        n, k = matrix.shape
        rng = np.random.default_rng(self.seed)
        means = np.empty((self.bootstrap_samples, k))  # (S, K)
        # Resample in chunks so memory stays near a few million floats for any N.
        chunk = max(1, 2_000_000 // (n * k))
        for start in range(0, self.bootstrap_samples, chunk):
            stop = min(start + chunk, self.bootstrap_samples)
            idx = rng.integers(0, n, size=(stop - start, n))  # (s, N)
            means[start:stop] = matrix[idx].mean(axis=1)  # (s, N, K) -> (s, K)
        tail = 100 * (1 - CONFIDENCE) / 2
        return np.percentile(means, [tail, 50.0, 100 - tail], axis=0)  # (3, K)
