"""The demo's byte-level BPE: lossless, and with split_digits numbers are written digit by digit."""

from __future__ import annotations

from transformers import AutoTokenizer

from bart_opt.demo.corpus import stories
from bart_opt.demo.tokenizer import SPECIAL_TOKENS, train_tokenizer

TEXT = "Wood Foods said its profits rose 31 percent to $64.1 million, and 1,400 bees ‘flew’ 2026 km."


def texts():
    return [s.article for s in stories("train", 200)]


def test_split_digits_learns_no_merge_with_a_digit_and_round_trips(tmp_path):
    tokenizer = train_tokenizer(texts(), tmp_path, vocab_size=800, split_digits=True)
    assert not [token for token in tokenizer.get_vocab() if any(c.isdigit() for c in token) and len(token) > 1]
    pieces = tokenizer.tokenize(TEXT)
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("31" "641" "1400" "2026")
    # The saved folder loads as a BART tokenizer that decodes back to the very text.
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = loaded(TEXT)["input_ids"]
    assert loaded.convert_ids_to_tokens(ids[1:-1]) == pieces
    assert loaded.decode(ids, skip_special_tokens=True) == TEXT
    assert loaded.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3, 4]


def test_without_split_digits_numbers_merge(tmp_path):
    tokenizer = train_tokenizer(texts(), tmp_path, vocab_size=800)
    assert [token for token in tokenizer.get_vocab() if sum(c.isdigit() for c in token) >= 2]
