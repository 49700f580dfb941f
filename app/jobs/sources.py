"""The sandbox of hub dataset sources: hub ids only, on the operator's allowlist.

`datasets.load_dataset` reads a local folder when its first argument names one, so a hub value
is accepted only when it cannot be a path: exactly ``owner/name`` in the hub's own alphabet
(letters, digits, ``-``, ``_``, ``.``; no ``..``, no leading or trailing punctuation), which
rules out absolute and relative paths, ``~``, ``file://`` and other URLs, Windows drives and
the builder names (``json``, ``csv``, ...) that read local data files. It must also be on
``BART_OPT_HUB_DATASETS`` (comma-separated ids; ``*`` allows any id; empty disables hub
datasets), and must not name a file or folder that exists relative to the server's working
directory. The config and split are names too (``split[:N]`` slicing is the job's ``limit``).
Every check is on the text alone, before anything is read or downloaded.
"""

from __future__ import annotations

import os
import re

from app.jobs.paths import shown

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"{_PART}/{_PART}")
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9])?")
ANY = "*"


class SourceRefused(ValueError):
    """A dataset source this server does not read; `field` is the request field at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def parse_allowlist(value: str) -> frozenset[str]:
    """The ids of ``BART_OPT_HUB_DATASETS`` (comma-separated, blanks ignored)."""
    return frozenset(part.strip() for part in value.split(",") if part.strip())


def check_hub_source(hub: str, config: str | None, split: str, allowed: frozenset[str]) -> None:
    """Refuse (`SourceRefused`) a hub source that is not a plain, allowed hub id with plain names."""
    if not _HUB_ID.fullmatch(hub) or ".." in hub or "--" in hub:
        raise SourceRefused("dataset.hub", (
            f"{shown(hub)} is not a hub dataset id: give 'owner/name' (letters, digits, '-', '_', '.'); "
            "files on the server are read only through dataset.file, from BART_OPT_DATA_DIR"))
    if not allowed:
        raise SourceRefused("dataset.hub", "hub datasets are disabled on this server (BART_OPT_HUB_DATASETS is empty)")
    if ANY not in allowed and hub not in allowed:
        raise SourceRefused("dataset.hub", (
            f"{shown(hub)} is not among the hub datasets this server reads (BART_OPT_HUB_DATASETS): "
            f"{', '.join(sorted(allowed))}"))
    if os.path.lexists(hub):
        raise SourceRefused("dataset.hub", (
            f"{shown(hub)} also names a file or folder on the server, which the dataset loader would read "
            "instead of the hub; refused"))
    for field, value in (("dataset.config", config), ("dataset.split", split)):
        if value is not None and (not _NAME.fullmatch(value) or ".." in value):
            raise SourceRefused(field, (
                f"{shown(value)} is not a {field.split('.')[1]} name (letters, digits, '-', '_', '.'); "
                "use limit to read part of a split"))
