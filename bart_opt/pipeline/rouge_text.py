"""How ROUGE reads a text in any language: tokenizers, stemmers per language, sentence splitting, coverage.

Three tokenizers (`TOKENIZERS`), chosen by name in `bart_opt.pipeline.rouge.RougeSettings`:

- ``default``: rouge-score's own (``rouge_score.tokenize``): lower-cased, every character outside
  ``[a-z0-9]`` a separator, Porter-stemmed words of more than 3 characters. English scores exactly as
  rouge-score gives them; any other script is dropped whole (a Cyrillic text has no tokens at all).
- ``unicode``: NFKC-normalized, lower-cased runs of letters, combining marks and digits (Unicode's
  ``\\p{L}``, ``\\p{M}``, ``\\p{N}``); punctuation, symbols and spaces separate. The marks matter:
  Devanagari's vowel signs are marks, and Python's ``\\w`` splits a Hindi word at each of them. This
  is the normalization of the XL-Sum multilingual ROUGE (Hasan et al., 2021, ``csebuetnlp/xl-sum``:
  remove only what Unicode calls punctuation), without its word segmenters.
- ``script``: ``unicode``, and every character of a script written without spaces (Han, Hiragana,
  Katakana, Thai, Lao, Khmer, Myanmar) a token of its own, with the marks that follow it: the
  character-level ROUGE of Chinese summarization (LCSTS, Hu et al., 2015) and the character split
  of sacrebleu's ``zh`` tokenizer, applied to Japanese and Thai as well (no dictionary, no
  download). A word segmenter (jieba, MeCab) would give other, word-level, figures.

Stemming (`stemmer`) goes by language: rouge-score's Porter stemmer for English, nltk's Snowball
stemmer for the other languages it covers (`LANGUAGES`), none where there is none; as rouge-score
does, only words of more than 3 characters are stemmed. The default tokenizer stems English only.

Sentence splitting for rougeLsum (`sentence_splitter`): lines first, then nltk's Punkt with
untrained parameters; for English with a short list of English abbreviations (the CNN/DailyMail
convention, unchanged), for the other languages without, and also after the sentence marks of
other scripts (``。！？`` and their half-width forms, Devanagari's danda ``।`` ``॥``, Arabic's ``؟``
and Urdu's ``۔``, Ethiopic ``።``, Myanmar ``။``, Khmer ``។``), whether or not a space follows.
It knows no language's abbreviations but English's, and Thai, which marks no sentence end, is
split at lines only.

`coverage(tokenizer, text)` counts the letters and digits of a text and how many the tokenizer
keeps, so that a report can say when most of a text was dropped (the default tokenizer on
Cyrillic keeps none) instead of showing a 0 as a score.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable

import regex

# nltk is imported where a stemmer or a sentence splitter is first asked for, not here: its package
# pulls in seconds of imports, which the command line's parser (`TOKENIZERS`, `LANGUAGES`) does not need.

TOKENIZERS = ("default", "unicode", "script")

# ISO 639-1 code -> (language, nltk Snowball stemmer or None). English uses Porter, as rouge-score does.
LANGUAGES: dict[str, tuple[str, str | None]] = {
    "en": ("English", "porter"), "ar": ("Arabic", "arabic"), "da": ("Danish", "danish"),
    "nl": ("Dutch", "dutch"), "fi": ("Finnish", "finnish"), "fr": ("French", "french"),
    "de": ("German", "german"), "hu": ("Hungarian", "hungarian"), "it": ("Italian", "italian"),
    "no": ("Norwegian", "norwegian"), "nb": ("Norwegian Bokmål", "norwegian"), "pt": ("Portuguese", "portuguese"),
    "ro": ("Romanian", "romanian"), "ru": ("Russian", "russian"), "es": ("Spanish", "spanish"),
    "sv": ("Swedish", "swedish"),
    "zh": ("Chinese", None), "ja": ("Japanese", None), "ko": ("Korean", None), "th": ("Thai", None),
    "hi": ("Hindi", None), "bn": ("Bengali", None), "ur": ("Urdu", None), "fa": ("Persian", None),
    "he": ("Hebrew", None), "el": ("Greek", None), "tr": ("Turkish", None), "uk": ("Ukrainian", None),
    "pl": ("Polish", None), "cs": ("Czech", None), "sk": ("Slovak", None), "bg": ("Bulgarian", None),
    "sr": ("Serbian", None), "hr": ("Croatian", None), "vi": ("Vietnamese", None), "id": ("Indonesian", None),
    "ms": ("Malay", None), "sw": ("Swahili", None), "ta": ("Tamil", None), "te": ("Telugu", None),
    "mr": ("Marathi", None), "gu": ("Gujarati", None), "pa": ("Punjabi", None), "ne": ("Nepali", None),
    "my": ("Burmese", None), "km": ("Khmer", None), "lo": ("Lao", None), "am": ("Amharic", None),
    "ka": ("Georgian", None), "hy": ("Armenian", None), "uz": ("Uzbek", None), "az": ("Azerbaijani", None),
    "mul": ("several languages", None),
}  # fmt: skip

_WORD = regex.compile(r"[\p{L}\p{M}\p{N}]+")
_NO_SPACES = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}"
_SCRIPT_TOKEN = regex.compile(rf"[{_NO_SPACES}]\p{{M}}*|(?:(?![{_NO_SPACES}])[\p{{L}}\p{{M}}\p{{N}}])+")
_LETTER_OR_DIGIT = regex.compile(r"[\p{L}\p{N}]")
_ASCII_WORD_CHAR = regex.compile(r"[a-z0-9]+")
_SENTENCE_MARKS = regex.compile(r"(?<=[。！？｡．।॥؟۔።။។])\s*")
_STEM_CACHE = 1 << 16

# Abbreviations that usually sit inside a sentence. Punkt without trained data would otherwise
# end a sentence at each of them ("Mr." | "Smith said ..."). Ones that often end a sentence
# ("etc.", "inc.", "p.m.") are left out on purpose: a missed split costs less than a wrong one.
ENGLISH_ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sen", "rep", "gov", "gen", "col", "lt", "sgt",
        "capt", "cmdr", "adm", "rev", "st", "jr", "sr", "mt", "ft", "vs", "e.g", "i.e",
        "u.s", "u.k", "u.n", "jan", "feb", "apr", "aug", "sept", "oct", "nov", "dec",
    }
)  # fmt: skip


def check_language(lang: str) -> str:
    """`lang` if it is a code of `LANGUAGES`; ValueError listing a few otherwise."""
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language code {lang!r}; give an ISO 639-1 code such as en, ru, zh, ja, ar, hi "
                         "(or mul for several), as listed in docs/evaluation.md")
    return lang


def stemmer_name(lang: str, use_stemmer: bool = True) -> str:
    """``porter``, ``snowball-<language>`` or ``none``: the stemmer ROUGE applies for `lang`."""
    name = LANGUAGES[check_language(lang)][1]
    if not use_stemmer or name is None:
        return "none"
    return name if name == "porter" else f"snowball-{name}"


@functools.cache
def stemmer(lang: str, use_stemmer: bool = True) -> Callable[[str], str] | None:
    """The stem function for `lang` (cached per word), or None where there is no stemmer."""
    name = stemmer_name(lang, use_stemmer)
    if name == "none":
        return None
    from nltk.stem.porter import PorterStemmer
    from nltk.stem.snowball import SnowballStemmer

    stem = PorterStemmer().stem if name == "porter" else SnowballStemmer(name.removeprefix("snowball-")).stem
    return functools.lru_cache(maxsize=_STEM_CACHE)(stem)


class UnicodeWordTokenizer:
    """The ``unicode`` tokenizer (see the module docstring): lower-cased runs of letters, marks and
    digits, stemmed with `stem` (e.g. ``stemmer("ru")``) when given, words of more than 3 characters only."""

    pattern = _WORD

    def __init__(self, stem: Callable[[str], str] | None = None):
        self.stem = stem

    def tokenize(self, text: str) -> list[str]:
        """The tokens of `text`."""
        tokens = self.pattern.findall(unicodedata.normalize("NFKC", text).lower())
        if self.stem is not None:
            tokens = [self.stem(token) if len(token) > 3 else token for token in tokens]
        return tokens


class ScriptTokenizer(UnicodeWordTokenizer):
    """The ``script`` tokenizer: `UnicodeWordTokenizer`, with each character of a script written
    without spaces (Han, Kana, Thai, Lao, Khmer, Myanmar) a token of its own (see the module docstring)."""

    pattern = _SCRIPT_TOKEN


def make_tokenizer(name: str, lang: str, use_stemmer: bool = True) -> UnicodeWordTokenizer | None:
    """The tokenizer object rouge-score takes for tokenizer `name` (None: rouge-score's own)."""
    if name == "default":
        return None
    kind = {"unicode": UnicodeWordTokenizer, "script": ScriptTokenizer}[name]
    return kind(stemmer(lang, use_stemmer))


def coverage(tokenizer: str, text: str) -> tuple[int, int]:
    """``(kept, total)``: the letters and digits of `text`, and how many of them tokenizer `tokenizer` keeps
    (the default keeps those that lower-case to ``[a-z0-9]``; the others keep every one)."""
    letters = _LETTER_OR_DIGIT.findall(text)
    if tokenizer != "default":
        return len(letters), len(letters)
    return sum(1 for c in letters if _ASCII_WORD_CHAR.fullmatch(c.lower())), len(letters)


@functools.cache
def _punkt(english: bool):
    """Punkt with untrained parameters: with the English abbreviations for English, else with none."""
    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    params = PunktParameters()
    params.abbrev_types = set(ENGLISH_ABBREVIATIONS if english else ())
    return PunktSentenceTokenizer(params)


def splitter_name(lang: str) -> str:
    """``punkt-en`` (English, with its abbreviations) or ``punkt+marks`` (any other language)."""
    return "punkt-en" if check_language(lang) == "en" else "punkt+marks"


def split_sentences(text: str, lang: str = "en") -> list[str]:
    """The sentences of `text` (see the module docstring), offline and deterministic; empty pieces dropped.

    For English: lines, then Punkt with untrained parameters plus the English abbreviations; no model
    data is loaded, so the result does not depend on what `nltk.download` put on the machine (it may
    differ slightly from `nltk.sent_tokenize` with the trained English model). For other languages:
    lines, Punkt without abbreviations, then the sentence marks of other scripts.
    """
    if not isinstance(text, str):
        raise TypeError(f"split_sentences expects a str, got {type(text).__name__}")
    english = check_language(lang) == "en"
    punkt = _punkt(english)
    sentences = []
    for line in text.splitlines():
        for sentence in punkt.tokenize(line):
            sentences.extend(_SENTENCE_MARKS.split(sentence) if not english else [sentence])
    return [s.strip() for s in sentences if s.strip()]


__all__ = ["ENGLISH_ABBREVIATIONS", "LANGUAGES", "TOKENIZERS", "ScriptTokenizer", "UnicodeWordTokenizer",
           "check_language", "coverage", "make_tokenizer", "split_sentences", "splitter_name", "stemmer",
           "stemmer_name"]
