"""ROUGE: parity with direct rouge-score calls, rougeLsum splitting, stemming, seeded bootstrap."""

from __future__ import annotations

import math
import random

import nltk
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rouge_score import rouge_scorer, scoring

from bart_opt.demo import random_sentence
from bart_opt.pipeline.rouge import RougeScorer, UnicodeWordTokenizer, fast_rouge, split_sentences

PAIRS = [
    (  # prose prediction against a CNN/DM-style newline reference
        "The president met Mr. Smith in Washington on Monday. They discussed the budget. "
        "Talks will continue next week.",
        "President meets Smith in Washington .\nThe two discussed budgets and taxes .\n"
        "More talks are planned for next week .",
    ),
    (
        "Scientists found water on the moon! The discovery surprised many researchers.",
        "Water was discovered on the moon by scientists.\nResearchers were surprised.",
    ),
    ("completely unrelated words here", "nothing in common at all"),
    ("", "an empty prediction scores zero"),
]


def direct_scores(prediction: str, reference: str, use_stemmer: bool = True) -> dict:
    """rouge-score called directly: rouge1/2/L on the texts, rougeLsum on split sentences, x100."""
    token_scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=use_stemmer)
    lsum_scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=use_stemmer)
    raw = token_scorer.score(reference, prediction)
    split_reference, split_prediction = ("\n".join(split_sentences(t)) for t in (reference, prediction))
    raw.update(lsum_scorer.score(split_reference, split_prediction))
    return {t: {m: 100 * getattr(s, m) for m in ("precision", "recall", "fmeasure")} for t, s in raw.items()}


@pytest.mark.parametrize("use_stemmer", [True, False])
@pytest.mark.parametrize(("prediction", "reference"), PAIRS)
def test_scores_equal_direct_rouge_score_calls(prediction, reference, use_stemmer):
    ours = RougeScorer(use_stemmer=use_stemmer).score(prediction, reference)
    assert ours == direct_scores(prediction, reference, use_stemmer)
    assert set(ours) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}


def test_token_scores_match_the_reference_scripts_newline_convention():
    # The transformers CNN/DM scripts score every type on sentence-per-line texts; rouge1/2/L
    # must not depend on that choice.
    prediction, reference = PAIRS[0]
    joined = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True).score(
        "\n".join(split_sentences(reference)), "\n".join(split_sentences(prediction))
    )
    ours = RougeScorer().score(prediction, reference)
    for rouge_type, score in joined.items():
        assert ours[rouge_type]["fmeasure"] == pytest.approx(100 * score.fmeasure)


def test_rougelsum_differs_from_rougel_on_multi_sentence_text():
    reference = "the cat sat on the mat.\nthe dog ran in the park."
    prediction = "The dog ran in the park. The cat sat on the mat."
    scores = RougeScorer().score(prediction, reference)
    assert scores["rougeLsum"]["fmeasure"] == pytest.approx(100.0)
    assert scores["rougeL"]["fmeasure"] < 60.0
    # The trap this module avoids: unsplit prose makes rougeLsum collapse to rougeL.
    unsplit_scorer = rouge_scorer.RougeScorer(["rougeL", "rougeLsum"])
    unsplit = unsplit_scorer.score(reference.replace("\n", " "), prediction)
    assert unsplit["rougeLsum"].fmeasure == pytest.approx(unsplit["rougeL"].fmeasure)


def test_stemming_switch_changes_scores():
    prediction, reference = "cats running", "cat runs"
    stemmed = RougeScorer(use_stemmer=True).score(prediction, reference)
    unstemmed = RougeScorer(use_stemmer=False).score(prediction, reference)
    assert stemmed["rouge1"]["fmeasure"] == pytest.approx(100.0)
    assert unstemmed["rouge1"]["fmeasure"] == 0.0


def test_non_latin_text_needs_a_tokenizer():
    prediction, reference = "кошка сидит на ковре", "кошка сидит"
    assert RougeScorer().score(prediction, reference)["rouge1"]["fmeasure"] == 0.0
    scores = RougeScorer(tokenizer=UnicodeWordTokenizer()).score(prediction, reference)
    assert scores["rouge1"]["precision"] == pytest.approx(50.0)
    assert scores["rouge1"]["recall"] == pytest.approx(100.0)


def test_selected_rouge_types_only():
    scores = RougeScorer(rouge_types=("rouge2", "rougeLsum")).score("a b c", "a b d")
    assert set(scores) == {"rouge2", "rougeLsum"}
    assert scores["rouge2"]["precision"] == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rouge_types": ("rouge1", "rougeX")}, "rougeX"),
        ({"rouge_types": ()}, "empty"),
        ({"rouge_types": ("rouge1", "rouge1")}, "duplicates"),
        ({"bootstrap_samples": 0}, "bootstrap_samples"),
    ],
)
def test_bad_settings_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RougeScorer(**kwargs)


def test_score_rejects_non_strings():
    with pytest.raises(TypeError, match="reference"):
        RougeScorer().score("a summary", None)


def _items(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = "the a cat dog sat ran home over market price rose fell sharply city council vote".split()
    scorer = RougeScorer()
    return [
        scorer.score(" ".join(rng.choice(words, 20)), " ".join(rng.choice(words, 25))) for _ in range(n)
    ]


def test_bootstrap_is_reproducible_and_ordered():
    items = _items(60, seed=1)
    first = RougeScorer(seed=0).aggregate(items)
    assert RougeScorer(seed=0).aggregate(items) == first
    scorer = RougeScorer(seed=0)
    assert scorer.aggregate(items) == scorer.aggregate(items) == first
    for rouge_type, interval in first.items():
        for measure in ("precision", "recall", "fmeasure"):
            low, mid, high = (interval[k][measure] for k in ("low", "mid", "high"))
            assert 0.0 <= low <= mid <= high <= 100.0
            assert low < high
            mean = np.mean([item[rouge_type][measure] for item in items])
            assert low <= mean <= high


def test_bootstrap_depends_on_the_seed():
    items = _items(60, seed=1)
    a, b = RougeScorer(seed=0).aggregate(items), RougeScorer(seed=1).aggregate(items)
    assert a != b
    assert a["rouge1"]["mid"]["fmeasure"] == pytest.approx(b["rouge1"]["mid"]["fmeasure"], abs=2.0)


def test_bootstrap_agrees_with_rouge_score_aggregator():
    items = _items(200, seed=2)
    ours = RougeScorer(bootstrap_samples=1000, seed=0).aggregate(items)
    aggregator = scoring.BootstrapAggregator(confidence_interval=0.95, n_samples=1000)
    for item in items:
        aggregator.add_scores({t: scoring.Score(**s) for t, s in item.items()})
    np.random.seed(0)
    theirs = aggregator.aggregate()
    for rouge_type, interval in ours.items():
        width = interval["high"]["fmeasure"] - interval["low"]["fmeasure"]
        for key in ("low", "mid", "high"):
            expected = getattr(theirs[rouge_type], key).fmeasure
            assert interval[key]["fmeasure"] == pytest.approx(expected, abs=0.2 * width)


def test_bootstrap_of_identical_items_is_a_point():
    item = RougeScorer().score("the cat sat", "the cat sat down")
    result = RougeScorer().aggregate([item] * 5)
    for key in ("low", "mid", "high"):
        assert result["rouge1"][key] == pytest.approx(item["rouge1"])


def test_aggregate_errors():
    scorer = RougeScorer()
    with pytest.raises(ValueError, match="zero items"):
        scorer.aggregate([])
    item = scorer.score("a b", "a b")
    del item["rougeLsum"]
    with pytest.raises(ValueError, match="rougeLsum"):
        scorer.aggregate([scorer.score("a", "a"), item])


def test_split_sentences_on_newline_text():
    highlights = (
        "Harry Potter star turns 18 Monday .\n"
        "He says he has no plans to fritter his cash away\n\n  \n"
        "Last line ."
    )
    assert split_sentences(highlights) == [
        "Harry Potter star turns 18 Monday .",
        "He says he has no plans to fritter his cash away",
        "Last line .",
    ]


def test_split_sentences_on_prose():
    prose = "Mr. Smith went to Washington. He met Dr. Jones on Monday! Did the U.S. team win? Yes."
    assert split_sentences(prose) == [
        "Mr. Smith went to Washington.",
        "He met Dr. Jones on Monday!",
        "Did the U.S. team win?",
        "Yes.",
    ]
    assert split_sentences("") == []
    assert split_sentences("no final punctuation") == ["no final punctuation"]


def test_nothing_is_loaded_or_downloaded(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("nltk data was requested")

    monkeypatch.setattr(nltk, "download", refuse)
    monkeypatch.setattr(nltk.data, "load", refuse)
    monkeypatch.setattr(nltk.data, "find", refuse)
    assert len(split_sentences("One. Two. Three.")) == 3
    assert RougeScorer().score(*PAIRS[0])["rougeLsum"]["fmeasure"] > 0


# Backends: rouge-score-rs must give exactly rouge-score's numbers through our settings.
needs_rust_backend = pytest.mark.skipif(fast_rouge is None, reason="rouge-score-rs has no wheel for this platform")
EDGE_CASES = [
    ("", ""), ("", "the cat sat"), ("the cat sat", ""), ("   \n\t", "\n\n"), ("...", "!!! ??? --- —"),
    ("THE CAT SAT.", "the cat sat."), ("Running runners ran", "run running runs"),
    ("ponies caresses generalizations oscillators", "pony caress generalization oscillate"),
    ("dying lying skies agreed", "die lie sky agree"), ("3.14 1,000,000 2nd 42", "3 14 1 000 000 2nd 42"),
    ("$5.00 for 10% off", "5 00 for 10 off"), ("Café naïve résumé façade", "cafe naive resume facade"),
    ("Straße groß ẞ", "strasse gross"), ("İstanbul ıi İI", "istanbul ii"), ("KELVIN K ﬁnance ﬂow", "k finance flow"),
    ("Привет мир", "привет мир"), ("東京は日本の首都です。", "東京は首都"), ("ΣΊΣΥΦΟΣ σίσυφος", "sisyphus"),
    ("emoji 😀 test 👍🏽 ok", "emoji test ok"), ("don't can't won't it's", "do not cannot it is"),
    ("e-mail co-operate re-enter", "email cooperate reenter"), ("the the the the", "the"), ("x" * 300, "x" * 300),
    ("Line one.\nLine two.\n\nLine three.", "Line two.\nLine one."), ("U.S. officials said 3 p.m. Monday.", "Monday."),
    ("a\u00a0b\u2009c\u200bd", "a b c d"), ("①②③ ⅷ ²³ ０１２３ ＡＢＣ", "1 2 3 0123 abc"), ("\ud800 lone surrogate", "lone"),
    ("x1y2z3 abc123 123abc", "x1y2z3 abc 123"), ("'quoted' \"double\" (paren) [b] {c}", "quoted double paren b c"),
    ("hello\r\nworld\rreturn", "hello world return"),
]


def backend_corpus() -> list[tuple[str, str]]:
    """Edge cases plus 200 CNN-like (prediction, reference) pairs of varied overlap."""
    import random

    from bart_opt.demo import random_sentence

    rng = random.Random(0)
    pairs = list(EDGE_CASES)
    for _ in range(200):
        article = [random_sentence(rng) for _ in range(rng.randint(3, 12))]
        reference = "\n".join(rng.sample(article, 3 if len(article) >= 3 else 1))
        words = " ".join(article[: rng.randint(1, len(article))]).split()
        prediction = " ".join(w for w in words if rng.random() > 0.15)
        pairs.append((prediction, reference))
    return pairs


@pytest.mark.parametrize("options", [{}, {"use_stemmer": False}, {"tokenizer": UnicodeWordTokenizer()}],
                         ids=["stemmer", "no-stemmer", "unicode-tokenizer"])
@needs_rust_backend
def test_rust_backend_scores_are_identical_to_rouge_score(options):
    pairs = backend_corpus()
    fast, reference = RougeScorer(backend="rouge-score-rs", **options), RougeScorer(backend="rouge-score", **options)
    fast_items = [fast.score(p, r) for p, r in pairs]
    reference_items = [reference.score(p, r) for p, r in pairs]
    mismatches = [(p, r) for (p, r), a, b in zip(pairs, fast_items, reference_items) if a != b]
    assert mismatches == []
    assert sum(item["rouge2"]["fmeasure"] > 0 for item in reference_items) > 150  # overlap, not only zeros
    assert fast.aggregate(fast_items) == reference.aggregate(reference_items)


@needs_rust_backend
@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80),
       st.text(alphabet=st.sampled_from("abc dEF 12 .\néü-'Ωж"), max_size=80))
def test_rust_backend_matches_on_arbitrary_text(prediction, reference):
    assert RougeScorer(backend="rouge-score-rs").score(prediction, reference) == RougeScorer(
        backend="rouge-score").score(prediction, reference)


@needs_rust_backend
def test_rust_backend_is_the_default_where_installed():
    assert RougeScorer().backend == "rouge-score-rs"
    with pytest.raises(ValueError, match="backend 'rouge'"):
        RougeScorer(backend="rouge")


def test_several_references_score_as_rouge_score_score_multi():
    rng = random.Random(36)
    sentences = [random_sentence(rng) for _ in range(200)]
    corpus = [(" ".join(rng.sample(sentences, 3)), ["\n".join(rng.sample(sentences, 2)) for _ in range(rng.randint(1, 4))])
              for _ in range(80)]
    ours = RougeScorer()
    theirs = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    lsum = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=True)
    for prediction, references in corpus:
        expected = theirs.score_multi(references, prediction)
        expected.update(lsum.score_multi(["\n".join(split_sentences(r)) for r in references],
                                         "\n".join(split_sentences(prediction))))
        got = ours.score_multi(prediction, references)
        assert got == {t: {m: 100.0 * getattr(s, m) for m in ("precision", "recall", "fmeasure")}
                       for t, s in expected.items()}
    assert sum(len(r) > 1 for _, r in corpus) > 40  # most have several references
    assert ours.score_multi(corpus[0][0], corpus[0][1][:1]) == ours.score(corpus[0][0], corpus[0][1][0])


def test_the_point_estimate_is_the_exact_mean_in_any_order():
    items = _items(50, seed=4)
    scorer = RougeScorer()
    aggregate = scorer.aggregate(items)
    assert aggregate["rouge2"]["mid"]["fmeasure"] == math.fsum(i["rouge2"]["fmeasure"] for i in items) / len(items)
    assert scorer.aggregate(items[::-1])["rouge2"]["mid"] == aggregate["rouge2"]["mid"]
    assert RougeScorer(seed=5, bootstrap_samples=10).aggregate(items)["rouge2"]["mid"] == aggregate["rouge2"]["mid"]
