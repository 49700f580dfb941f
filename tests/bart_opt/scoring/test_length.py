"""The length metric: words and sentences of a summary, counted by hand."""

from __future__ import annotations

import pytest

from bart_opt.errors import InvalidRequest
from bart_opt.scoring.base import Example
from bart_opt.scoring.length import LengthMetric


def test_words_and_sentences_by_hand():
    examples = [Example("The cat sat. It was happy -- very happy!", "r"), Example("", "r"),
                Example("One line\nand another one", "r")]
    assert LengthMetric().score(examples) == [{"tokens": 8.0, "sentences": 2.0}, {"tokens": 0.0, "sentences": 0.0},
                                              {"tokens": 5.0, "sentences": 2.0}]


def test_script_counts_each_han_character_and_the_language_splits_sentences():
    (scores,) = LengthMetric("script", "zh").score([Example("我们去了。今天很好！", "r")])
    assert scores == {"tokens": 8.0, "sentences": 2.0}
    (words,) = LengthMetric("unicode", "zh").score([Example("我们去了。今天很好！", "r")])
    assert words["tokens"] == 2.0  # runs of letters: one "word" per clause without the script tokenizer


def test_bad_settings_are_refused_by_name():
    with pytest.raises(InvalidRequest) as error:
        LengthMetric("default")
    assert error.value.field == "tokenizer"
    with pytest.raises(InvalidRequest) as error:
        LengthMetric(lang="xx")
    assert error.value.field == "lang"


def test_signature():
    assert LengthMetric().signature() == {"tokenizer": "unicode", "lang": "en", "splitter": "punkt-en", "version": 1}
