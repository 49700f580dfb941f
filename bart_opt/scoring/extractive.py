"""The ``extractive`` metric: how much of a summary is copied from its source.

Over the words of the summary S and of the source (article) A (`bart_opt.scoring.length.word_tokenizer`:
lower-cased, unstemmed, punctuation left out), per summary:

- ``compression``: |A| / |S|, the compression ratio of Grusky et al. (2018) (|S| counted as 1 for an
  empty summary, so the ratio stays finite);
- ``coverage`` and ``density``: Grusky, Naaman and Artzi (2018), *Newsroom: A Dataset of 1.3 Million
  Summaries with Diverse Extractive Strategies*, NAACL, section 4.1. `fragments` is their greedy
  algorithm: walking the summary from its first word, at each word take the longest run of words that
  also occurs, in order, somewhere in the article (the first such run of that length), and go on after
  it; a word found nowhere is skipped. Then ``coverage = sum(|f|) / |S|`` (the share of summary words
  inside a copied fragment, 0 to 1) and ``density = sum(|f| ** 2) / |S|`` (the mean length of the
  fragment each summary word lies in: a long copied sentence weighs more than scattered words);
- ``novel_1`` .. ``novel_4``: the share of the summary's distinct n-grams that do not occur in the
  source (0 to 1; 0 for a summary shorter than n words);
- ``repeated_trigrams``: the share of the summary's trigrams that repeat an earlier trigram of the same
  summary (0 to 1): the degenerate repetition beam search is known for. It needs no source.

An empty summary scores 0 everywhere but ``compression``. Without the source (another system's
predictions scored by ``bart-opt score``, which reads no article) only ``repeated_trigrams`` is
defined, and only it is returned; the run's aggregation says which scores it left out and why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from bart_opt.scoring.base import Example
from bart_opt.scoring.length import VERSION, WordMetric

NGRAMS = (1, 2, 3, 4)
SOURCE_SCORES = ("compression", "coverage", "density", *(f"novel_{n}" for n in NGRAMS))  # need the source
SCORES = (*SOURCE_SCORES, "repeated_trigrams")


def fragments(summary: Sequence[str], article: Sequence[str]) -> list[tuple[int, int]]:
    """Grusky et al.'s greedy extractive fragments of `summary` in `article` (token sequences), as
    ``(start, length)`` spans of the summary, in order (see the module docstring).

    For each summary position i the candidates are the article positions j holding the same word,
    scanned left to right; a candidate inside the run just matched is skipped (the paper's ``j <- j'``),
    the longest match wins (the first of equals), and i moves past it (by 1 when nothing matched).
    """
    where: dict[str, list[int]] = {}
    for j, word in enumerate(article):
        where.setdefault(word, []).append(j)
    found, i = [], 0
    while i < len(summary):
        best, j_next = 0, 0
        for j in where.get(summary[i], ()):
            if j < j_next:
                continue
            length = 0
            while i + length < len(summary) and j + length < len(article) and summary[i + length] == article[j + length]:
                length += 1
            best = max(best, length)
            j_next = j + length
        if best:
            found.append((i, best))
        i += max(best, 1)
    return found


def coverage_density(summary: Sequence[str], article: Sequence[str]) -> tuple[float, float]:
    """``(coverage, density)`` of `summary` against `article` (0, 0 for an empty summary)."""
    if not summary:
        return 0.0, 0.0
    lengths = [length for _, length in fragments(summary, article)]
    return sum(lengths) / len(summary), sum(length * length for length in lengths) / len(summary)


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The n-grams of `tokens`, in order, with repeats."""
    return [tuple(tokens[k : k + n]) for k in range(len(tokens) - n + 1)]


def novel_share(summary: Sequence[str], source: Sequence[str], n: int) -> float:
    """The share of the summary's distinct n-grams absent from the source (0 when it has none)."""
    mine = set(ngrams(summary, n))
    if not mine:
        return 0.0
    return len(mine - set(ngrams(source, n))) / len(mine)


def repeated_trigrams(summary: Sequence[str]) -> float:
    """The share of the summary's trigrams that repeat an earlier one (0 when it has none)."""
    trigrams = ngrams(summary, 3)
    if not trigrams:
        return 0.0
    return sum(count - 1 for count in Counter(trigrams).values()) / len(trigrams)


class ExtractiveMetric(WordMetric):
    """Compression, Grusky coverage and density, novel n-grams and repeated trigrams (see the module docstring)."""

    name = "extractive"

    def signature(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer_name, "lang": self.lang, "fragments": "grusky2018-greedy",
                "ngrams": list(NGRAMS), "version": VERSION}

    def score(self, examples: Sequence[Example]) -> list[dict[str, float]]:
        return [self._one(example) for example in examples]

    def _one(self, example: Example) -> dict[str, float]:
        summary = self._tokenizer.tokenize(example.prediction)
        scores = {"repeated_trigrams": repeated_trigrams(summary)}
        if example.source is None:
            return scores
        source = self._tokenizer.tokenize(example.source)
        coverage, density = coverage_density(summary, source)
        return {"compression": len(source) / max(len(summary), 1), "coverage": coverage, "density": density,
                **{f"novel_{n}": novel_share(summary, source, n) for n in NGRAMS}, **scores}


__all__ = ["NGRAMS", "SCORES", "SOURCE_SCORES", "ExtractiveMetric", "coverage_density", "fragments", "ngrams",
           "novel_share", "repeated_trigrams"]
