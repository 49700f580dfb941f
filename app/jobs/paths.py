"""Safe resolution of ``{"file": ...}`` dataset paths inside ``BART_OPT_DATA_DIR``.

A job may read only files under the data directory. The name a client sends is checked as
text first (relative, no ``..``, no drive or NUL), then resolved with every symlink followed
and checked again against the data directory's own resolved path; only the resolved path is
ever handed to a reader. Nothing is opened before both checks pass. Every OS error on the way
(a symlink loop, a name too long, no permission) is a `DataFileUnreadable` naming the file as
the client gave it (shortened when long); no message ever shows a server path.

Limit: a symlink swapped in *between* this check and the read (by someone who can write to
the data directory) is not caught; the data directory is trusted to be written only by its
operator.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath


class PathRefused(ValueError):
    """A dataset file name that is not allowed (absolute, ``..``, or leading out of the data directory)."""


class DataFileMissing(FileNotFoundError):
    """A dataset file name that is allowed but names no regular file inside the data directory."""


class DataFileUnreadable(ValueError):
    """A dataset file name that the operating system cannot look up or read."""


MAX_NAME_BYTES = 4096


def shown(name: str, limit: int = 100) -> str:
    """`name` quoted for a message, its middle cut out when it is long."""
    if len(name) > limit:
        name = f"{name[: limit * 2 // 3]}...{name[-limit // 3 :]}"
    return repr(name)


def shown_model(model: str) -> str:
    """A model as clients see it: a hub id or relative folder as given, an absolute folder by its
    last component only (server paths stay out of responses)."""
    path = Path(model)
    return path.name if path.is_absolute() else model


def unreadable(name: str, error: BaseException) -> DataFileUnreadable:
    """The error to raise when the OS refuses `name`: the client's name and the OS's reason, no path."""
    errno = getattr(error, "errno", None)
    reason = os.strerror(errno) if errno else "too many levels of symbolic links"  # 3.11 resolve(): RuntimeError
    return DataFileUnreadable(f"{shown(name)} cannot be read: {reason[:1].lower()}{reason[1:]}")


def resolve_data_file(data_dir: str | os.PathLike, name: str) -> Path:
    """The real path of `name` inside `data_dir`, or an error saying why it is refused.

    Raises:
        PathRefused: `name` is empty, too long, absolute, has a drive, a NUL byte or a ``..``
            part, or resolves (through symlinks) to a place outside `data_dir`.
        DataFileMissing: the data directory or the file does not exist, or is not a regular file.
        DataFileUnreadable: an OS error while looking the name up.
    """
    _check_name(name)
    base = Path(data_dir)
    try:
        if not base.is_dir():
            raise DataFileMissing("the data directory (BART_OPT_DATA_DIR) does not exist")
        real_base = base.resolve(strict=True)
        real = (real_base / name).resolve(strict=False)
        if not real.is_relative_to(real_base):
            raise PathRefused(
                f"{shown(name)} leads outside the data directory (through a symlink); only files inside it can be read"
            )
        if not real.exists():
            raise DataFileMissing(f"no file {shown(name)} in the data directory")
        if not real.is_file():
            raise DataFileMissing(f"{shown(name)} in the data directory is not a regular file")
    except (DataFileMissing, PathRefused):
        raise
    except (OSError, RuntimeError) as error:
        raise unreadable(name, error) from None
    return real


def _check_name(name: str) -> None:
    """Refuse names that could point anywhere but below the data directory, before any lookup."""
    if not isinstance(name, str) or not name.strip():
        raise PathRefused("the file name is empty")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise PathRefused("the file name is not valid Unicode text (a lone surrogate)") from None
    if len(encoded) > MAX_NAME_BYTES:
        raise PathRefused(f"the file name is longer than {MAX_NAME_BYTES} bytes")
    if "\x00" in name:
        raise PathRefused("the file name contains a NUL byte")
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or name.startswith(("/", "\\")):
        raise PathRefused(f"{shown(name)} is an absolute path; give a path relative to the data directory")
    if ".." in posix.parts or ".." in windows.parts:
        raise PathRefused(f"{shown(name)} contains '..'; give a path inside the data directory")
