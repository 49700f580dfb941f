"""ROUGE in any language: the hand-checked multilingual corpus, the tokenizers, stemmers, sentence
splitting per language, the coverage warning, and `RougeSettings` (its checks and signature)."""

from __future__ import annotations

import random
import re

import pytest

from bart_opt import InvalidRequest
from bart_opt.demo import random_sentence
from bart_opt.evaluate.metrics import RowTotals
from bart_opt.pipeline.rouge import RougeScorer, RougeSettings
from bart_opt.pipeline.rouge_text import ScriptTokenizer, UnicodeWordTokenizer, coverage, split_sentences, stemmer
from tests.bart_opt.multilingual import CORPUS


@pytest.mark.parametrize("case", CORPUS, ids=[case["id"] for case in CORPUS])
def test_the_multilingual_corpus_scores_as_counted_by_hand(case):
    scorer = RougeSettings(tokenizer=case["tokenizer"], lang=case["lang"]).scorer()
    scores = scorer.score(case["prediction"], case["reference"])
    assert {t: s["fmeasure"] for t, s in scores.items()} == pytest.approx(case["expected"], abs=1e-9)


@pytest.mark.parametrize("case", CORPUS, ids=[case["id"] for case in CORPUS])
def test_the_default_tokenizer_scores_them_zero_and_every_report_says_why(case):
    if case["id"] == "mixed-scripts":  # its Latin words survive
        return
    scorer = RougeSettings().scorer()
    row = {"id": case["id"], "prediction": case["prediction"], "reference": case["reference"], "error": None,
           "seconds": 0.0, "rouge": scorer.score(case["prediction"], case["reference"])}
    assert row["rouge"]["rouge1"]["fmeasure"] == 0.0
    metrics = RowTotals(scorer).added([row]).baseline_metrics("x")
    (warning,) = metrics["warnings"]
    letters = sum(1 for c in case["prediction"] + case["reference"] if c.isalnum())
    assert "1 of 1 predictions and 1 of 1 references" in warning and f"kept 0 of {letters}" in warning
    assert "--rouge-tokenizer unicode or script" in warning
    assert metrics["rouge_coverage"]["mostly_dropped"]["references"] == {"texts": 1, "of": 1}


def test_the_cyrillic_verbatim_case_scores_100_with_unicode_and_warns_with_the_default():
    case = next(c for c in CORPUS if c["id"] == "ru-contains")
    unicode_scores = RougeSettings(tokenizer="unicode", lang="ru").scorer().score(case["prediction"], case["reference"])
    assert unicode_scores["rouge1"]["recall"] == 100.0  # the reference is all there
    assert coverage("default", case["reference"]) == (0, 17)
    assert coverage("unicode", case["reference"]) == (17, 17)


def english_pairs(n: int = 60, seed: int = 36) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    sentences = [random_sentence(rng) for _ in range(3 * n)]
    return [(" ".join(rng.sample(sentences, 3)), "\n".join(rng.sample(sentences, 2))) for _ in range(n)]


def test_english_ascii_text_scores_the_same_with_the_unicode_tokenizer():
    default, unicode = RougeSettings().scorer(), RougeSettings(tokenizer="unicode").scorer()
    pairs = english_pairs()
    assert [default.score(p, r) for p, r in pairs] == [unicode.score(p, r) for p, r in pairs]


def test_devanagari_vowel_signs_stay_in_their_words():
    assert UnicodeWordTokenizer().tokenize("नमस्ते दुनिया") == ["नमस्ते", "दुनिया"]
    assert re.findall(r"\w+", "नमस्ते दुनिया") != ["नमस्ते", "दुनिया"]  # what Python's \w would have made of it


def test_the_script_tokenizer_splits_scripts_without_spaces_only():
    assert ScriptTokenizer().tokenize("東京タワーは333メートル、Tokyo Tower。สวัสดี") == [
        "東", "京", "タ", "ワ", "ー", "は", "333", "メ", "ー", "ト", "ル", "tokyo", "tower", "ส", "วั", "ส", "ดี"]


def test_stemmers_by_language():
    assert stemmer("en")("running") == "run" and stemmer("ru")("новостями") == "новост"
    assert stemmer("zh") is None and stemmer("en", use_stemmer=False) is None
    assert RougeSettings(tokenizer="unicode", lang="de").stemmer == "snowball-german"
    assert RougeSettings(tokenizer="script", lang="ja").stemmer == "none"


def test_sentence_splitting_knows_other_scripts_marks():
    assert split_sentences("我爱北京。你爱上海！好吗？", "zh") == ["我爱北京。", "你爱上海！", "好吗？"]
    assert split_sentences("राम घर गया। सीता आई।", "hi") == ["राम घर गया।", "सीता आई।"]
    assert split_sentences("كيف حالك؟ أنا بخير.", "ar") == ["كيف حالك؟", "أنا بخير."]
    assert split_sentences("Mr. Smith went. He came back.", "en") == ["Mr. Smith went.", "He came back."]


@pytest.mark.parametrize(("settings", "field"), [
    ({"tokenizer": "words"}, "tokenizer"), ({"lang": "xx"}, "lang"), ({"lang": "ru"}, "lang"),
    ({"rouge_types": ("rouge0",)}, "rouge_types"), ({"bootstrap_samples": 0}, "bootstrap_samples"),
])
def test_bad_settings_are_refused_naming_the_field(settings, field):
    with pytest.raises(InvalidRequest) as refused:
        RougeSettings(**settings)
    assert refused.value.field == field


def test_settings_round_trip_and_the_signature():
    settings = RougeSettings(tokenizer="script", lang="zh", bootstrap_samples=200, seed=3)
    assert RougeSettings.from_dict(settings.to_dict()) == settings
    assert settings.scorer() is settings.scorer() and settings.scorer().settings == settings
    assert re.fullmatch(r"nrefs:1\|rouge:1,2,L,Lsum\|tok:script\|lang:zh\|stem:none\|split:punkt\+marks\|point:mean\|"
                        r"ci:95%-bootstrap-200-seed3\|backend:rouge-score(-rs)?-[0-9.]+", settings.signature())
    assert RougeScorer(tokenizer=UnicodeWordTokenizer()).settings.tokenizer == "custom"
