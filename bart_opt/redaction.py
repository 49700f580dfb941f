"""Passwords hidden in URLs before they reach a message or a log line.

`redacted` is shared by everything that prints a URL a user gave: the jobs database
(``BART_OPT_DB``, `app.jobs.database`) and the experiment tracker (``--mlflow``,
``BART_OPT_MLFLOW_URI``, `bart_opt.tracking`).
"""

from __future__ import annotations

import re

URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")  # two letters at least: not a drive letter
_QUERY_PASSWORD = re.compile(r"(?i)(^|[?&;\s])(password=)[^&\s]*")


def redacted(text: str) -> str:
    """`text` (a URL, or any text holding one) with every password shown as ``***``: the value of each
    ``password=`` parameter, and what follows the user name up to the last ``@`` of a URL's user
    information. Made for values that do not parse too: a lost slash, an unencoded ``@``, ``/``,
    ``:`` or ``%`` in the password. A value without a scheme (a file path) is shown as it is."""
    hidden = _QUERY_PASSWORD.sub(r"\1\2***", text)
    scheme = URL_SCHEME.match(hidden)
    if scheme is None:
        return hidden
    head, rest = hidden[:scheme.end()], hidden[scheme.end():]
    slashes = rest[:len(rest) - len(rest.lstrip("/"))]
    rest = rest[len(slashes):]
    at = rest.split("?", 1)[0].rfind("@")
    if at < 0:
        return hidden
    user, colon, _ = rest[:at].partition(":")
    return f"{head}{slashes}{user}{':***' if colon else ''}{rest[at:]}"
