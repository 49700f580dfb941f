"""What the service's domain refuses or cannot do, as typed errors that speak no HTTP.

The jobs (`app.jobs`) and the summarize core (`app.device.engine`, `app.summarize.service`) raise these;
`app.errors` alone maps each kind to a status code and the error body, so changing a code, or
using jobs without HTTP, touches no domain code. Every error carries a stable machine-readable
``code``, a ``message`` for people (no server path, no exception class name), the ``field`` at
fault when one input is, and ``retry_after`` (seconds) when trying again later can help.

The caller's mistakes in one input that the library itself finds are
`bart_opt.errors.InvalidRequest` (mapped with its ``details``); `Refused` is the domain's own
refusal of an input, under a code of its own (``dataset_not_allowed``, ``missing_column``, ...).
"""

from __future__ import annotations


class ServiceError(Exception):
    """A failure the service reports on purpose; raise one of its kinds below, never this class."""

    def __init__(self, code: str, message: str, *, field: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after


class NotFound(ServiceError):
    """The job or example named does not exist (or is not visible yet)."""


class Conflict(ServiceError):
    """The request clashes with the state of what it names: a finished job, a reused Idempotency-Key."""


class Refused(ServiceError):
    """An input refused by the domain: a limit passed, a dataset source not allowed or unreadable."""


class Busy(ServiceError):
    """Too much work of this kind at once (a full queue, every loader taken); retry after `retry_after`."""


class SourceUnavailable(ServiceError):
    """A dataset source outside the service (the hub) could not be read."""


class Unavailable(ServiceError):
    """The service cannot do this now: the model is loading or failed, the jobs database is down,
    the server is stopping. With `retry_after` when waiting can help; without when it needs a restart."""


class DamagedStore(Unavailable):
    """The jobs database is damaged: retrying cannot help until it is repaired and the server restarted."""


class ClientGone(ServiceError):
    """The client went away while its request waited; the answer has nowhere to go."""


__all__ = ["Busy", "ClientGone", "Conflict", "DamagedStore", "NotFound", "Refused", "ServiceError",
           "SourceUnavailable", "Unavailable"]
