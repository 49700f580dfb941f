"""`bart_opt.extras`: which modules of an extra are missing, and the one sentence naming the extra."""

from __future__ import annotations

import importlib.util

import pytest

from bart_opt import extras


def test_missing_lists_the_absent_modules_without_importing_them(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("uvicorn", "alembic") else real(name, *a))
    assert extras.missing("serve") == ["uvicorn", "alembic"]


def test_require_names_the_extra_and_the_pip_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(extras.MissingExtra) as raised:
        extras.require("bench", "--plot")
    assert raised.value.extra == "bench"
    assert str(raised.value) == "--plot needs matplotlib, which this installation lacks: pip install 'bart-opt[bench]'"
