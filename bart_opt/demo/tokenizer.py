"""Byte-level BPE tokenizers trained locally and saved as BART tokenizers."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0-4, as in BART's vocabulary
_DIGITS = re.compile(r"[0-9]")


def train_tokenizer(texts: Iterable[str], out_dir: str | Path, vocab_size: int, model_max_length: int = 1024,
                    split_digits: bool = False):
    """Train a byte-level BPE on `texts` and save it in `out_dir` as a `BartTokenizer`.

    Byte-level means every string is encodable (no unknown tokens) and every id sequence
    decodes to the bytes it came from. With `split_digits`, the BPE learns no merge with a
    digit in it, so numbers are written digit by digit: a small model then copies "$64.1
    million" with ten frequent digit tokens instead of hundreds of rare number tokens it never
    learns well. Returns the tokenizer.
    """
    from tokenizers import ByteLevelBPETokenizer
    from transformers import BartTokenizer

    bpe = ByteLevelBPETokenizer()
    if split_digits:
        texts = (_DIGITS.sub("", text) for text in texts)
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=1, special_tokens=SPECIAL_TOKENS)
    vocab = bpe.get_vocab()
    with tempfile.TemporaryDirectory() as tmp:
        bpe.save_model(tmp)
        lines = Path(tmp, "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    # transformers 5: BartTokenizer(vocab=..., merges=...) builds the vocabulary;
    # vocab_file=... would silently give an empty one.
    tokenizer = BartTokenizer(vocab=vocab, merges=merges)
    tokenizer.model_max_length = model_max_length
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer
