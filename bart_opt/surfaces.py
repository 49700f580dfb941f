"""Dataclass fields that the surfaces derive from: one owner for a component's options.

A component's options (`bart_opt.cluster.ClusterOptions`, the job runner's `RunnerConfig`, the
jobs database's `PoolLimits`, ...) are the fields of one frozen dataclass, each declared with
`surfaced`: its default, its help, its bounds, the service setting it is (``setting``, the name
of the `app.settings.Settings` field, hence ``BART_OPT_<SETTING>``) and the command-line flag it
is (``flag``), where it is either. The settings class (`app.settings.component_settings`) and the
flags (`bart_opt.cluster.add_cli_args`) walk these fields instead of restating them, and
`app.settings.Settings.component` builds the dataclass back from the settings, so a default,
a help text or a bound is written once, here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bart_opt.errors import InvalidRequest

_BOUNDS = {"ge": (lambda value, bound: value >= bound, ">="), "gt": (lambda value, bound: value > bound, ">"),
           "le": (lambda value, bound: value <= bound, "<=")}


def surfaced(default: Any, help: str, *, setting: str | None = None, flag: str | None = None,
             switch: bool = False, finite: bool = False, **bounds: float) -> Any:
    """A dataclass field with the metadata the surfaces read.

    `setting`: the service settings field it is (None: not a setting); `flag`: its command-line flag
    (None: not a flag); `switch`: the field turns its component on, so its setting and flag read None
    (off) when unset and a bare flag means the default; `bounds`: ``ge``, ``gt`` or ``le`` (a None value
    is not checked); `finite`: infinity and NaN are refused too.
    """
    unknown = set(bounds) - set(_BOUNDS)
    if unknown:
        raise TypeError(f"unknown bounds {sorted(unknown)}")
    return dataclasses.field(default=default, metadata={"help": help, "setting": setting, "flag": flag,
                                                        "switch": switch, "finite": finite, "bounds": bounds})


def check_bounds(options: Any) -> None:
    """Raise `InvalidRequest` naming the first field of the dataclass `options` outside its bounds."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value is None or "bounds" not in f.metadata:
            continue
        if f.metadata["finite"] and not math.isfinite(value):
            raise InvalidRequest(f.name, f"must be a finite number, got {value}")
        for kind, bound in f.metadata["bounds"].items():
            holds, sign = _BOUNDS[kind]
            if not holds(value, bound):
                raise InvalidRequest(f.name, f"must be {sign} {bound}, got {value}")


def settings_of(component: type) -> dict[str, dataclasses.Field]:
    """The fields of the dataclass `component` that are service settings, by setting name."""
    return {f.metadata["setting"]: f for f in dataclasses.fields(component) if f.metadata.get("setting")}


__all__ = ["check_bounds", "settings_of", "surfaced"]
