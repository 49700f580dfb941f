"""The extractive metric: Grusky et al.'s fragments, coverage and density, compression, novel n-grams and
repeated trigrams, each against numbers worked out by hand here."""

from __future__ import annotations

import random

import pytest

from bart_opt.scoring.base import Example
from bart_opt.scoring.extractive import (
    SCORES, SOURCE_SCORES, ExtractiveMetric, coverage_density, fragments, novel_share, repeated_trigrams,
)

# The worked example. Grusky, Naaman and Artzi (2018) illustrate the fragments on a figure whose exact
# text was not at hand here, so this example is built the same way and its fragments derived by hand:
#
#   article A: the(0) quick(1) brown(2) fox(3) jumps(4) over(5) the(6) lazy(7) dog(8) while(9) the(10) cat(11)
#              sleeps(12) on(13) the(14) warm(15) mat(16)
#   summary S: the(0) lazy(1) dog(2) sleeps(3) on(4) the(5) mat(6) near(7) the(8) quick(9) brown(10) fox(11)
#
#   i=0 "the": A has "the" at 0 (then "quick" != "lazy": length 1), 6 ("the lazy dog", then "while" !=
#       "sleeps": length 3), 10 (length 1), 14 (length 1): the longest is "the lazy dog", |f| = 3; i -> 3.
#   i=3 "sleeps": at 12: "sleeps on the" then A "warm" != S "mat": |f| = 3; i -> 6.
#   i=6 "mat": at 16, and the article ends: |f| = 1; i -> 7.
#   i=7 "near": not in A: no fragment; i -> 8.
#   i=8 "the": at 0: "the quick brown fox", the summary ends: |f| = 4; i -> 12, done.
#
#   F = {the lazy dog, sleeps on the, mat, the quick brown fox}: |S| = 12, sum |f| = 3+3+1+4 = 11,
#   sum |f|^2 = 9+9+1+16 = 35: coverage 11/12, density 35/12.
ARTICLE = "The quick brown fox jumps over the lazy dog, while the cat sleeps on the warm mat."
SUMMARY = "The lazy dog sleeps on the mat -- near the quick brown fox."


def words(text):
    return ExtractiveMetric()._tokenizer.tokenize(text)


def test_the_worked_example_fragments_coverage_and_density():
    summary, article = words(SUMMARY), words(ARTICLE)
    assert len(summary) == 12 and len(article) == 17
    spans = fragments(summary, article)
    assert [" ".join(summary[i : i + n]) for i, n in spans] == ["the lazy dog", "sleeps on the", "mat",
                                                                 "the quick brown fox"]
    assert coverage_density(summary, article) == (11 / 12, 35 / 12)
    (scores,) = ExtractiveMetric().score([Example(SUMMARY, "reference", ARTICLE)])
    assert scores["coverage"] == 11 / 12 and scores["density"] == 35 / 12
    assert scores["compression"] == 17 / 12


def test_novel_ngrams_by_hand():
    summary, article = words(SUMMARY), words(ARTICLE)
    # distinct unigrams of S: the lazy dog sleeps on mat near quick brown fox (10); only "near" is new.
    assert novel_share(summary, article, 1) == 1 / 10
    # 11 bigrams, all distinct; not in A: "dog sleeps" (A has "dog while"), "the mat", "mat near", "near the": 4.
    assert novel_share(summary, article, 2) == 4 / 11
    # 10 trigrams; copied: "the lazy dog", "sleeps on the", "the quick brown", "quick brown fox";
    # new: "lazy dog sleeps", "dog sleeps on", "on the mat", "the mat near", "mat near the", "near the quick": 6.
    assert novel_share(summary, article, 3) == 6 / 10
    # 9 four-grams; copied: "the quick brown fox" only.
    assert novel_share(summary, article, 4) == 8 / 9
    assert novel_share(["a", "b"], ["a", "b"], 3) == 0.0  # no trigram at all


def test_repeated_trigrams_by_hand():
    # "a b c a b c a": trigrams abc bca cab abc bca: 5, of which abc and bca repeat once each.
    assert repeated_trigrams("a b c a b c a".split()) == 2 / 5
    assert repeated_trigrams("a b c d".split()) == 0.0
    assert repeated_trigrams(["a", "b"]) == 0.0


def test_a_summary_copied_whole_is_one_fragment_and_an_unrelated_one_none():
    article = words(ARTICLE)
    assert coverage_density(article[2:9], article) == (1.0, 7.0)
    assert coverage_density(["zebra", "yak"], article) == (0.0, 0.0)
    assert coverage_density([], article) == (0.0, 0.0)


def test_without_a_source_only_repeated_trigrams_is_scored():
    metric = ExtractiveMetric()
    with_source, without = metric.score([Example(SUMMARY, "r", ARTICLE), Example(SUMMARY, "r", None)])
    assert set(with_source) == set(SCORES) and set(without) == set(SCORES) - set(SOURCE_SCORES)
    assert without["repeated_trigrams"] == with_source["repeated_trigrams"] == 0.0


def test_an_empty_summary_scores_zero_and_a_finite_compression():
    (scores,) = ExtractiveMetric().score([Example("", "r", ARTICLE)])
    assert scores["compression"] == 17.0
    assert all(scores[name] == 0.0 for name in SCORES if name != "compression")


def paper_fragments(summary, article):
    """Grusky et al.'s pseudo-code as printed, index by index (the reference `fragments` must match)."""
    found, i = [], 0
    while i < len(summary):
        best, j = 0, 0
        while j < len(article):
            if summary[i] == article[j]:
                i2, j2 = i, j
                while i2 < len(summary) and j2 < len(article) and summary[i2] == article[j2]:
                    i2, j2 = i2 + 1, j2 + 1
                best = max(best, i2 - i)
                j = j2
            else:
                j += 1
        if best:
            found.append((i, best))
        i += max(best, 1)
    return found


@pytest.mark.parametrize("seed", range(40))
def test_fragments_match_the_papers_loop_on_random_texts(seed):
    rng = random.Random(seed)
    vocabulary = [f"w{k}" for k in range(rng.randint(2, 8))]
    article = [rng.choice(vocabulary) for _ in range(rng.randint(0, 60))]
    summary = [rng.choice(vocabulary) for _ in range(rng.randint(0, 25))]
    if article and rng.random() < 0.5:  # a copied run, as real summaries have
        start = rng.randrange(len(article))
        summary[rng.randint(0, len(summary)):0] = article[start : start + rng.randint(1, 10)]
    assert fragments(summary, article) == paper_fragments(summary, article)


def test_the_signature_names_what_decides_the_numbers():
    assert ExtractiveMetric("script", "zh").signature() == {
        "tokenizer": "script", "lang": "zh", "fragments": "grusky2018-greedy", "ngrams": [1, 2, 3, 4], "version": 1}
