"""Operator faults the service can see from its settings alone, named as what they are.

`warnings(settings)` lists them as ``{"code", "message"}`` for ``GET /ready`` (looked at again on
every call, so a fault mended while the service runs leaves the list); `log_warnings` writes
them to the log when the service starts, with full paths. Neither keeps the service from
starting: each fault disables one thing, which the message names.

- ``data_dir_missing``: ``BART_OPT_DATA_DIR`` is not a folder, so every job on a file is refused.

A folder is shown in ``/ready`` (open without the API key) the way the model is
(`app.device.engine.shown_model`: a relative path as given, an absolute one by its last part); the log
has the whole path.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.device.engine import shown_model
from app.settings import Settings

logger = logging.getLogger("app.startup")


def warnings(settings: Settings) -> list[dict]:
    """The operator faults in effect now (see the module docstring)."""
    found = []
    if not Path(settings.data_dir).is_dir():
        found.append({
            "code": "data_dir_missing",
            "message": f"the data directory BART_OPT_DATA_DIR ({shown_model(settings.data_dir)}) does not exist or "
                       "is not a folder: evaluation jobs on files are refused until it is created",
        })  # fmt: skip
    return found


def log_warnings(settings: Settings) -> None:
    """Log each fault of `warnings` once, at start, with the full path."""
    for warning in warnings(settings):
        if warning["code"] == "data_dir_missing":
            logger.warning("%s (BART_OPT_DATA_DIR=%s, resolved %s)", warning["message"], settings.data_dir,
                           Path(settings.data_dir).resolve())
