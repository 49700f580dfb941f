"""`TokenizerPool`: one tokenizer used from many threads at once."""

from __future__ import annotations

import threading

import pytest
from transformers import AutoTokenizer

from bart_opt.pipeline.tokens import TokenizerPool


def test_threads_encoding_and_decoding_at_once_get_what_one_thread_gets(demo_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(demo_checkpoint)
    texts = [f"Story number {i} says the council met on Monday. " * (1 + i % 7) for i in range(40)]
    expected = [tokenizer(text, truncation=True, max_length=64 + i % 5)["input_ids"] for i, text in enumerate(texts)]
    pool = TokenizerPool(tokenizer, max_copies=3)
    got: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with pool.borrow() as own:  # truncation settings change per call: a shared one would be "borrowed"
                ids = own(texts[i], truncation=True, max_length=64 + i % 5)["input_ids"]
                assert own.decode(ids, skip_special_tokens=True)
            got[i] = ids
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and [got[i] for i in range(len(texts))] == expected
    assert 1 <= pool.copies <= 3


def test_a_pool_needs_room_for_one():
    with pytest.raises(ValueError, match="max_copies"):
        TokenizerPool(object(), max_copies=0)
