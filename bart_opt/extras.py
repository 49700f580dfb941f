"""The parts of bart-opt that come with an extra (pyproject.toml's optional-dependencies), and the one-line
refusal a command gives where its extra is not installed.

``pip install bart-opt`` is the library and the command line; ``[serve]`` adds the HTTP service,
``[bench]`` the benchmarks' plots and peers, ``[fast]`` the kernel's builder (docs/install.md).
`require` looks the modules up without importing them, so a refusal costs no import time.
"""

from __future__ import annotations

import importlib.util

MODULES = {
    "serve": ("fastapi", "uvicorn", "pydantic_settings", "prometheus_client", "fastapi_offline", "sqlalchemy",
              "alembic", "httpx"),
    "bench": ("matplotlib",),
}
"""The modules each extra brings (their import names), as checked by `require`."""


class MissingExtra(Exception):
    """A command needs an extra that is not installed; its message names the modules and the pip command."""

    def __init__(self, what: str, extra: str, modules: list[str]):
        self.extra = extra
        super().__init__(f"{what} needs {', '.join(modules)}, which this installation lacks: "
                         f"pip install 'bart-opt[{extra}]'")


def missing(extra: str) -> list[str]:
    """The modules of `extra` (a key of `MODULES`) that cannot be imported here."""
    return [name for name in MODULES[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, what: str) -> None:
    """Raise `MissingExtra` naming `what` (e.g. ``the service``) where any module of `extra` is missing."""
    if absent := missing(extra):
        raise MissingExtra(what, extra, absent)
