"""The library's exception types: a caller's mistake (`InvalidRequest`), a checkpoint that cannot serve (`CheckpointError`)."""

from __future__ import annotations

import os


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


class CheckpointError(ValueError):
    """A checkpoint that is missing files, is damaged, or whose parts do not fit together.

    `problem` says what is wrong in words that name files of the checkpoint but never a path on
    this machine (a service may show it to its clients). ``str(error)`` adds, for logs and the
    command line, `where` (the folder or hub id) before it and `detail` (another library's own
    message, which may hold paths) after it: ``"<where>: <problem> (<detail>)"``.
    """

    def __init__(self, problem: str, where: str | os.PathLike | None = None, detail: str | None = None) -> None:
        text = problem if where is None else f"{where}: {problem}"
        super().__init__(text if detail is None else f"{text} ({detail})")
        self.problem = problem
        self.where = None if where is None else str(where)
