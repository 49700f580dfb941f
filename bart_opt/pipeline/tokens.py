"""One tokenizer, used from several threads at once: `TokenizerPool`.

A Hugging Face fast tokenizer is not safe to call from two threads at the same time: a call
that sets truncation borrows its Rust core mutably, and a second thread inside it then fails
("Already borrowed"). The service tokenizes on request threads and on the job runner's thread
while the device thread decodes, so each of them borrows a copy of its own from the pool.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEFAULT_MAX_COPIES = 8


class TokenizerPool:
    """Copies of `tokenizer`, each lent to one thread at a time.

    The first copy is `tokenizer` itself; more are made on demand (deep copies of a pristine
    template that no thread ever uses, so copying never races a call), up to `max_copies`, after
    which a borrower waits for one to come back.
    """

    def __init__(self, tokenizer: Any, max_copies: int = DEFAULT_MAX_COPIES) -> None:
        if max_copies < 1:
            raise ValueError(f"max_copies must be >= 1, got {max_copies}")
        self._template = copy.deepcopy(tokenizer)
        self._idle = [tokenizer]
        self._made = 1
        self._max = max_copies
        self._cond = threading.Condition()

    @contextmanager
    def borrow(self) -> Iterator[Any]:
        """A tokenizer no other thread holds until the block ends."""
        with self._cond:
            self._cond.wait_for(lambda: self._idle or self._made < self._max)
            if self._idle:
                tokenizer = self._idle.pop()
            else:
                tokenizer = copy.deepcopy(self._template)
                self._made += 1
        try:
            yield tokenizer
        finally:
            with self._cond:
                self._idle.append(tokenizer)
                self._cond.notify()

    @property
    def copies(self) -> int:
        """Tokenizers made so far (the one given included)."""
        return self._made


__all__ = ["TokenizerPool"]
