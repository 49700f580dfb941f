"""The cost budget of one ``POST /summarize``, checked before anything is queued.

One request may not hold the single device thread for minutes while everyone behind it waits,
so what it may ask for is bounded by three settings (each refused above with `InvalidRequest` naming the limit):

- ``MAX_TEXTS``: texts in the request;
- ``MAX_REQUEST_COST``: decoder work, ``texts x num_beams x max_new_tokens`` (every text may run
  every beam to the maximum length; the defaults admit 64 texts x 4 beams x 141 new tokens, the
  bart-large-cnn settings, and refuse 64 texts x 16 beams x 1023);
- ``MAX_INPUT_TOKENS``: encoder work, the texts' tokens after truncation, summed.

The generation values come from the request's resolved `bart_opt.GenerationSpec`; nothing here
looks at the raw generation options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.settings import Settings
from bart_opt.errors import InvalidRequest
from bart_opt.engine.spec import GenerationSpec
from bart_opt.pipeline.summarizer import Encoded


@dataclass(frozen=True)
class RequestLimits:
    """The budget of one request; each check raises `InvalidRequest` naming the field and the setting."""

    max_texts: int
    max_request_cost: int
    max_input_tokens: int

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
        return cls(settings.max_texts, settings.max_request_cost, settings.max_input_tokens)

    def check_texts(self, count: int) -> None:
        """At most ``MAX_TEXTS`` texts."""
        if count > self.max_texts:
            raise InvalidRequest("texts", f"{count} texts is more than MAX_TEXTS ({self.max_texts})")

    def check_cost(self, texts: int, spec: GenerationSpec) -> None:
        """``texts x num_beams x max_new_tokens`` within ``MAX_REQUEST_COST``."""
        cost = texts * spec.num_beams * spec.max_new_tokens
        if cost > self.max_request_cost:
            raise InvalidRequest("generation", (
                f"{texts} texts x {spec.num_beams} beams x {spec.max_new_tokens} new tokens = {cost} is more than "
                f"MAX_REQUEST_COST ({self.max_request_cost}); send fewer texts, fewer beams or a lower "
                "max_length / max_new_tokens"))  # fmt: skip

    def check_input(self, encoded: Sequence[Encoded]) -> None:
        """The texts' tokens (after truncation) within ``MAX_INPUT_TOKENS``."""
        tokens = sum(len(e.ids) for e in encoded)
        if tokens > self.max_input_tokens:
            raise InvalidRequest("texts", (
                f"{tokens} input tokens is more than MAX_INPUT_TOKENS ({self.max_input_tokens}); "
                "send fewer or shorter texts"))  # fmt: skip
