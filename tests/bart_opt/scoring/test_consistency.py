"""ConsistencyMetric: the SummaC-ZS arithmetic by hand on a random NLI model, the SummaC-style
scores of a hand-made corpus (consistent above contradicted), and the refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from bart_opt.errors import InvalidRequest
from bart_opt.pipeline.rouge_text import split_sentences
from bart_opt.scoring.base import Example
from bart_opt.scoring.consistency import ConsistencyMetric, summac_zs
from tests.bart_opt.scoring.tiny import bert_folder

NLI = {0: "entailment", 1: "neutral", 2: "contradiction"}


def fact(subject: str, adjective: str, negated: bool = False) -> str:
    return f"the {subject} was {'not ' if negated else ''}{adjective}."


@pytest.fixture(scope="module")
def random_nli(tmp_path_factory) -> str:
    """A random classifier whose probabilities vary from pair to pair (weights spread 0.5)."""
    return str(bert_folder(tmp_path_factory.mktemp("nli") / "random", labels=NLI, init_std=0.5, seed=1))


def test_summac_zs_reduction_by_hand():
    """Per summary sentence: the best entailment minus the worst contradiction over the source, then the mean."""
    entailment = np.array([[0.9, 0.1], [0.2, 0.3]])  # (source sentence, summary sentence)
    contradiction = np.array([[0.05, 0.6], [0.1, 0.2]])
    image = np.stack([entailment, contradiction], axis=-1)  # (2, 2, 2)
    assert summac_zs(image) == pytest.approx(((0.9 - 0.1) + (0.3 - 0.6)) / 2, abs=1e-15)
    assert summac_zs(np.zeros((0, 2, 2))) == 0.0 and summac_zs(np.zeros((3, 0, 2))) == 0.0


def test_scores_are_the_arithmetic_of_the_pair_probabilities(random_nli):
    """Every pair's probabilities computed here with the model itself, one pair at a time; the metric's
    score is their max/mean reduction (to float rounding: it runs the pairs padded in batches)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_nli)
    model = AutoModelForSequenceClassification.from_pretrained(random_nli).eval()
    examples = [
        Example("the cat was big. the dog ran to the river.", "-", "the cat was big. the sun was red. a man sat."),
        Example("the team won the game.", "-", "the team lost the game today. the mayor said it was new."),
        Example("police found the car. it was old. two men ran.", "-", "the police found a car in the river."),
    ]
    metric = ConsistencyMetric(random_nli, batch_size=4)
    scores = metric.score(examples)
    for example, score in zip(examples, scores):
        sources, summary = split_sentences(example.source), split_sentences(example.prediction)
        per_sentence = []
        for hypothesis in summary:
            probabilities = []
            for premise in sources:
                inputs = tokenizer(premise, hypothesis, truncation=True, max_length=64, return_tensors="pt")
                with torch.no_grad():
                    probabilities.append(torch.softmax(model(**inputs).logits[0], dim=-1).tolist())
            per_sentence.append(max(p[0] for p in probabilities) - max(p[2] for p in probabilities))
        assert score["summac_zs"] == pytest.approx(sum(per_sentence) / len(per_sentence), abs=1e-6)
    assert len({round(s["summac_zs"], 4) for s in scores}) == len(examples)
    assert metric.cost["batches"] == -(-(2 * 3 + 1 * 2 + 3 * 1) // 4)  # 11 pairs, 4 at a time


SOURCES = ((("cat", "big"), ("dog", "red"), ("car", "old")),
           (("house", "blue"), ("river", "small"), ("team", "new")),
           (("city", "old"), ("man", "big"), ("cat", "blue")))


def oracle(premises: list[str], hypotheses: list[str]) -> np.ndarray:
    """An NLI model that is right about the corpus's pairs: a fact entails itself (0.9), its negation
    contradicts it (0.9), anything else is neutral (0.1 entailment, 0.1 contradiction)."""
    def probabilities(premise: str, hypothesis: str) -> tuple[float, float]:
        if hypothesis == premise:
            return 0.9, 0.05
        if hypothesis == premise.replace(" was ", " was not "):
            return 0.05, 0.9
        return 0.1, 0.1

    return np.array([probabilities(p, h) for p, h in zip(premises, hypotheses)])  # (B, 2)


def test_consistent_summaries_score_above_contradicted_ones(random_nli, monkeypatch):
    """A hand-made corpus: for each source, a summary restating two of its facts, one negating one of
    them, and one negating both. With pair probabilities that are right about each pair, the metric's
    splitting, pairing and reduction rank them in that order, at the scores the arithmetic gives."""
    metric = ConsistencyMetric(random_nli)
    seen = []
    monkeypatch.setattr(metric, "pair_probabilities", lambda p, h: seen.extend(zip(p, h)) or oracle(p, h))
    for facts in SOURCES:
        source = " ".join(fact(*f) for f in facts)
        consistent = f"{fact(*facts[0])} {fact(*facts[2])}"
        half = f"{fact(*facts[0])} {fact(*facts[2], negated=True)}"
        contradicted = f"{fact(*facts[0], negated=True)} {fact(*facts[2], negated=True)}"
        scores = [s["summac_zs"] for s in metric.score([Example(summary, "-", source)
                                                        for summary in (consistent, half, contradicted)])]
        # each summary sentence: max entailment - max contradiction over the three source facts
        restated, negated = 0.9 - 0.1, 0.1 - 0.9
        assert scores == pytest.approx([restated, (restated + negated) / 2, negated], abs=1e-12)
    assert len(seen) == len(SOURCES) * 3 * 3 * 2  # every source fact against every summary sentence


def test_signature(random_nli):
    metric = ConsistencyMetric(random_nli)
    signature = metric.signature()
    assert metric.name == "consistency" and metric.needs_model
    assert signature["labels"] == {"entailment": 0, "contradiction": 2}
    assert signature["model"] == random_nli and signature["fingerprint"].startswith("sha256:")
    assert signature["max_source_sentences"] == 100 and signature["max_summary_sentences"] == 20
    assert signature["max_length"] == 64 and signature["transformers"]


def test_refusals(random_nli, tmp_path):
    """A model without NLI labels, a folder without weights, an example without its source."""
    unlabelled = shutil.copytree(random_nli, tmp_path / "unlabelled")
    config = json.loads((unlabelled / "config.json").read_text())
    config["id2label"] = {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    config["label2id"] = {name: int(i) for i, name in config["id2label"].items()}
    (unlabelled / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidRequest, match="has no entailment and no contradiction label") as refused:
        ConsistencyMetric(str(unlabelled))
    assert refused.value.field == "consistency_model"
    no_weights = shutil.copytree(random_nli, tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(InvalidRequest, match="no weights") as refused:
        ConsistencyMetric(str(no_weights))
    assert refused.value.field == "consistency_model"
    with pytest.raises(InvalidRequest) as refused:
        ConsistencyMetric(random_nli).score([Example("the cat was big.", "-", "the cat was big."),
                                             Example("the cat was big.", "-")])
    assert refused.value.field == "examples[1].source"
