"""The library's one exception type for a caller's mistake."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """The caller asked for something invalid; `field` names the input at fault.

    `field` is a path such as ``"max_length"``, ``"texts[3]"`` or ``"generation.num_beams"``;
    `message` says what is wrong and, where it helps, what to do instead. ``str(error)`` is
    ``"<field>: <message>"``. The service maps this type, and only this type, to a 422.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def within(self, prefix: str) -> InvalidRequest:
        """The same error with its field nested under `prefix` (``"generation"`` -> ``"generation.max_length"``)."""
        separator = "" if self.field.startswith("[") else "."
        return InvalidRequest(f"{prefix}{separator}{self.field}", self.message)
