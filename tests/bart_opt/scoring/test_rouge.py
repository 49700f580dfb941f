"""ROUGE through the metric interface gives RougeScorer's numbers, digit for digit."""

from __future__ import annotations

import random

from bart_opt.demo import random_article, random_sentence
from bart_opt.pipeline.rouge import RougeScorer, RougeSettings
from bart_opt.scoring.base import Example
from bart_opt.scoring.rouge import RougeMetric, flat, nested


def examples(n=30, seed=5):
    rng = random.Random(seed)
    found = []
    for k in range(n):
        reference = " ".join(random_sentence(rng) for _ in range(2))
        references = (reference, random_sentence(rng)) if k % 3 == 0 else reference
        found.append(Example(random_article(rng, rng.randint(1, 3)), references, None))
    return found


def test_rouge_metric_scores_and_aggregates_as_rouge_scorer():
    settings = RougeSettings(bootstrap_samples=200, seed=7)
    scorer = RougeScorer(settings=settings)
    items = examples()
    direct = [scorer.score_any(e.prediction, list(e.reference) if isinstance(e.reference, tuple) else e.reference)
              for e in items]
    metric = RougeMetric(settings)
    per_example = metric.score(items)
    assert per_example == [flat(item) for item in direct]
    assert [nested(scores) for scores in per_example] == direct
    assert metric.aggregate(per_example) == scorer.aggregate(direct)  # the same floats: same matrix, same bootstrap


def test_the_signature_is_the_recorded_settings_and_their_line():
    metric = RougeMetric(RougeSettings(tokenizer="unicode", lang="ru"))
    signature = metric.signature()
    assert signature["tokenizer"] == "unicode" and signature["stemmer"] == "snowball-russian"
    assert signature["signature"] == RougeSettings(tokenizer="unicode", lang="ru").signature()
    assert metric.name == "rouge" and metric.needs_model is False
