"""The ``length`` metric: a summary's length in tokens and in sentences.

Tokens are the words of ROUGE's ``unicode`` tokenizer (`bart_opt.pipeline.rouge_text`: NFKC-normalized,
lower-cased runs of letters, marks and digits, unstemmed; punctuation is not a token) or, for
texts written without spaces, of its ``script`` tokenizer (each Han, Kana or Thai character a
token). Sentences are rougeLsum's (`bart_opt.pipeline.rouge_text.split_sentences` in the settings'
language). Both are counts per summary; the corpus figure is their mean with the bootstrap
interval every metric shares (`bart_opt.scoring.base.aggregate`). No model, no source, no reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bart_opt.errors import InvalidRequest
from bart_opt.pipeline.rouge_text import check_language, make_tokenizer, split_sentences, splitter_name
from bart_opt.scoring.base import Example

WORD_TOKENIZERS = ("unicode", "script")
VERSION = 1  # of the definitions below: a change that moves a number moves this


def word_tokenizer(name: str = "unicode", lang: str = "en"):
    """The unstemmed word tokenizer `name` (``unicode`` or ``script``) of the cheap metrics;
    `InvalidRequest` naming ``tokenizer`` or ``lang`` for a bad value."""
    if name not in WORD_TOKENIZERS:
        raise InvalidRequest("tokenizer", f"the length and extractive metrics count words with one of "
                             f"{', '.join(WORD_TOKENIZERS)}, got {name!r}")
    try:
        check_language(lang)
    except ValueError as error:
        raise InvalidRequest("lang", str(error)) from None
    return make_tokenizer(name, lang, use_stemmer=False)


class WordMetric:
    """What the cheap metrics share: no model, and the words of `word_tokenizer` in `lang`."""

    needs_model = False

    def __init__(self, tokenizer: str = "unicode", lang: str = "en"):
        self.tokenizer_name = tokenizer
        self.lang = lang
        self._tokenizer = word_tokenizer(tokenizer, lang)


class LengthMetric(WordMetric):
    """Summary length: ``tokens`` (words, see the module docstring) and ``sentences``."""

    name = "length"

    def signature(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer_name, "lang": self.lang, "splitter": splitter_name(self.lang),
                "version": VERSION}

    def score(self, examples: Sequence[Example]) -> list[dict[str, float]]:
        return [{"tokens": float(len(self._tokenizer.tokenize(e.prediction))),
                 "sentences": float(len(split_sentences(e.prediction, self.lang)))} for e in examples]


__all__ = ["VERSION", "WORD_TOKENIZERS", "LengthMetric", "WordMetric", "word_tokenizer"]
