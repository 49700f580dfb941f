"""The run record: everything that can change a prediction or a score, and what a resume must match.

A run folder's ``run.json`` and a service job's stored spec hold the same record (`run_record`):

- ``system``: ``bart`` (a model), ``baseline`` (lead-3) or ``external`` (another system's
  predictions, scored by ``bart-opt score``); ``model`` and the checkpoint's ``fingerprint``;
- ``engine``: the `bart_opt.engine.options.EngineOptions` as resolved on the loaded model (`ENGINE_FIELDS`:
  dtype, mode, static, el_attention, quantize, device type) and the batch budgets;
- ``generation``: the resolved `bart_opt.engine.spec.GenerationSpec`;
- ``rouge_settings``: `bart_opt.pipeline.rouge.RougeSettings.to_dict`;
- ``metrics``: the metrics beyond ROUGE (`bart_opt.scoring.registry.MetricSettings.record`: their
  names, ROUGE first, the settings and each metric's signature);
- ``versions`` (bart-opt, torch, transformers, the ROUGE backend, Python), ``processor`` (the CPU's
  ISA key, `bart_opt.engine.hardware.probe`, or the GPU's name) and ``started_at`` (UTC);
- ``signature``: the sacrebleu-style line of the ROUGE settings and the engine (`signature`).

`resume_differences` is the one rule for resuming (the CLI's run folders, service jobs): a
difference in the model, the engine fields, the generation settings, the ROUGE fields that change
a score, the list of metrics or a metric's signature (``metrics``, ``metrics.<name>.<key>``) is
refused, every differing field named; a difference in the versions, the processor or
the batch budgets is allowed and returned as a warning (they change no prediction by design: a
budget lowered after running out of memory must be able to resume; a kernel of another torch or
processor can only flip a near-tie, and is recorded so that a reader can see it).
"""

from __future__ import annotations

import importlib.metadata
import platform
import time
from collections.abc import Mapping
from typing import Any

from bart_opt.pipeline.rouge import SCORE_FIELDS, RougeSettings, settings_differences

ENGINE_FIELDS = ("dtype", "mode", "static", "el_attention", "quantize", "device")  # a difference changes predictions
BUDGET_FIELDS = ("max_batch_tokens", "max_batch_size")  # recorded; a difference is a warning
SYSTEMS = ("bart", "baseline", "external")


class ResumeRefused(ValueError):
    """A resume that differs from the run it resumes in something that can change a prediction or a
    score; `fields` names each (``quantize``, ``dtype``, ``num_beams``, ``rouge.tokenizer``, ...)."""

    def __init__(self, message: str, fields: list[str]):
        super().__init__(message)
        self.fields = fields


def engine_record(*, dtype: str, mode: str, static: bool, el_attention: bool, quantize: str | None, device: str,
                  max_batch_tokens: int | None = None, max_batch_size: int | None = None) -> dict:
    """The ``engine`` of a run record (`ENGINE_FIELDS` as resolved, then the budgets)."""
    return {"dtype": dtype, "mode": mode, "static": static, "el_attention": el_attention, "quantize": quantize,
            "device": device, "max_batch_tokens": max_batch_tokens, "max_batch_size": max_batch_size}


def engine_key(engine: Mapping[str, Any] | None) -> str | None:
    """The engine's fields that change a prediction, as one string: what a job's engine and a
    replica's must share (``dtype:float32|mode:default|static:no|el_attention:no|quantize:none|device:cpu``)."""
    if engine is None:
        return None
    return "|".join(f"{name}:{_shown(engine.get(name))}" for name in ENGINE_FIELDS)


def versions(rouge: RougeSettings | None = None) -> dict:
    """The versions of what computes predictions and scores."""
    found = {"bart_opt": _version("bart-opt"), "torch": _version("torch"), "transformers": _version("transformers"),
             "python": platform.python_version()}
    if rouge is not None:
        found["rouge"] = f"{rouge.backend} {rouge.to_dict()['backend_version']}"
    return found


def processor(device: str) -> dict:
    """What ran the model: ``{"cpu": ISA key, "name"}`` (`bart_opt.engine.hardware.probe`) or ``{"gpu": name}``."""
    if device.startswith("cuda"):
        import torch

        return {"gpu": torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else "unknown"}
    if device == "cpu":
        from bart_opt.engine import hardware

        cpu = hardware.probe()
        return {"cpu": cpu.isa, "name": cpu.model}
    return {"device": device}


def run_record(*, system: str, model: str, rouge: RougeSettings, engine: Mapping[str, Any] | None = None,
               fingerprint: str | None = None, generation: Mapping[str, Any] | None = None,
               processor_info: Mapping[str, Any] | None = None, metrics: Mapping[str, Any] | None = None,
               **extra: Any) -> dict:
    """A run record (see the module docstring); `metrics` is `MetricSettings.record` (None: ROUGE only, and
    no ``metrics`` key); `extra` keys are added as they are (a file's fingerprint)."""
    if system not in SYSTEMS:
        raise ValueError(f"system must be one of {SYSTEMS}, got {system!r}")
    if metrics is not None:
        extra = {"metrics": dict(metrics), **extra}
    record = {"system": system, "model": model, "fingerprint": fingerprint,
              "generation": None if generation is None else dict(generation),
              "engine": None if engine is None else dict(engine), "rouge_settings": rouge.to_dict(),
              "versions": versions(rouge), "processor": None if processor_info is None else dict(processor_info),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}
    record["signature"] = signature(record)
    return record


def signature(record: Mapping[str, Any], nrefs: str | int = 1) -> str:
    """The sacrebleu-style signature of a run record: its ROUGE settings' (`RougeSettings.signature`),
    then the system: ``system:bart|model:<fingerprint, 12 hex>|dtype:float32|mode:default|static:no|
    el_attention:no|quantize:none|device:cpu|cpu:AVX2|bart-opt:0.1.0|torch:2.13.0|transformers:5.2.0``. Two numbers are
    comparable when the parts before ``system`` agree."""
    rouge = RougeSettings.from_dict(record.get("rouge_settings") or {})
    parts = [rouge.signature(nrefs), f"system:{record.get('system', 'bart')}"]
    fingerprint = record.get("fingerprint")
    if record.get("system") == "baseline":
        parts.append(f"model:{record.get('model')}")
    elif fingerprint:
        parts.append(f"model:{str(fingerprint).removeprefix('sha256:')[:12]}")
    if record.get("file"):
        parts.append(f"file:{str(record['file'].get('fingerprint', '')).removeprefix('sha256:')[:12]}")
    key = engine_key(record.get("engine"))
    if key:
        parts.append(key)
    place = record.get("processor") or {}
    if place.get("cpu"):
        parts.append(f"cpu:{place['cpu']}")
    elif place.get("gpu"):
        parts.append(f"gpu:{place['gpu'].replace(' ', '_')}")
    known = record.get("versions") or {}
    parts += [f"{label}:{known[name]}" for name, label in (("bart_opt", "bart-opt"), ("torch", "torch"),
                                                             ("transformers", "transformers")) if known.get(name)]
    return "|".join(parts)


def resume_differences(earlier: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """``(refused, warnings)`` of resuming `earlier`'s run as `current`: each refused difference as
    ``"field: earlier -> current"`` (the fields named as their options are), each warning as a phrase."""
    refused = []
    if earlier.get("model") != current.get("model"):
        refused.append(f"model: {earlier.get('model')!r} -> {current.get('model')!r}")
    if current.get("engine") is not None or earlier.get("engine") is not None:
        before, now = earlier.get("engine"), current.get("engine") or {}
        if before is None:
            refused.append("engine: not recorded (a run from before bart-opt recorded its engine)")
        else:
            refused += [f"{name}: {_shown(before.get(name))} -> {_shown(now.get(name))}" for name in ENGINE_FIELDS
                        if before.get(name) != now.get(name)]
    refused += _generation_differences(earlier.get("generation"), current.get("generation"))
    before_rouge = earlier.get("rouge_settings")
    if before_rouge is None:
        before_rouge = RougeSettings().to_dict()  # a run from before the record: scored with the defaults
    refused += [f"rouge.{name}: {_shown(old)} -> {_shown(new)}"
                for name, old, new in settings_differences(before_rouge, current["rouge_settings"], SCORE_FIELDS)]
    refused += _metric_differences(earlier.get("metrics"), current.get("metrics"))
    return refused, _warnings(earlier, current) + _metric_version_warnings(earlier.get("metrics"),
                                                                           current.get("metrics"))


def _metric_differences(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> list[str]:
    """The refused differences of two runs' ``metrics``: the names, then each metric's signature (but its
    ``versions``). A run that records none scored ROUGE only."""
    names_before = list(before["names"]) if before else ["rouge"]
    names_now = list(now["names"]) if now else ["rouge"]
    if names_before != names_now:
        shown_before = _shown(names_before) + ("" if before else " (not recorded: a run from before metrics "
                                                                 "beyond ROUGE)")
        return [f"metrics: {shown_before} -> {_shown(names_now)}"]
    if before is None or now is None:
        return []
    refused = []
    for name in names_now[1:]:
        old, new = before.get("signatures", {}).get(name) or {}, now.get("signatures", {}).get(name) or {}
        refused += [f"metrics.{name}.{key}: {_shown(old.get(key))} -> {_shown(new.get(key))}"
                    for key in sorted(set(old) | set(new)) if key != "versions" and old.get(key) != new.get(key)]
    return refused


def _metric_version_warnings(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> list[str]:
    """A warning per library version that changed under a metric (a signature's ``versions``)."""
    if not before or not now:
        return []
    found = []
    for name, new in (now.get("signatures") or {}).items():
        old_versions = ((before.get("signatures") or {}).get(name) or {}).get("versions") or {}
        new_versions = new.get("versions") or {}
        found += [f"{name} {package} {old_versions.get(package) or 'not recorded'} then, {new_versions.get(package)} "
                  "now" for package in sorted(set(old_versions) | set(new_versions))
                  if old_versions.get(package) != new_versions.get(package)]
    return found


def _generation_differences(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> list[str]:
    if before == now:
        return []
    if before is None or now is None:
        return [f"generation: {_shown(before)} -> {_shown(now)}"]
    return [f"{name}: {_shown(before.get(name))} -> {_shown(now.get(name))}" for name in sorted(set(before) | set(now))
            if before.get(name) != now.get(name)]


def _warnings(earlier: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    found = []
    for key in ("versions", "processor"):
        before, now = earlier.get(key) or {}, current.get(key) or {}
        found += [f"{name} {before.get(name) or 'not recorded'} then, {now.get(name)} now"
                  for name in sorted(set(before) | set(now)) if before.get(name) != now.get(name) and name != "name"]
    before_engine, now_engine = earlier.get("engine") or {}, current.get("engine") or {}
    found += [f"{name} {before_engine.get(name)} then, {now_engine.get(name)} now" for name in BUDGET_FIELDS
              if before_engine and before_engine.get(name) != now_engine.get(name)]
    return found


def check_resume(where: str, earlier: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The warnings of resuming `earlier` as `current` in `where`; `ResumeRefused` naming every refused field."""
    refused, warnings = resume_differences(earlier, current)
    if refused:
        fields = [item.split(":", 1)[0] for item in refused]
        raise ResumeRefused(f"{where} holds a run made with other settings ({'; '.join(refused)}); resuming would mix "
                          "them: rerun with that run's settings, use another output directory, or --overwrite to "
                          "start over", fields)
    return warnings


def _shown(value: Any) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "no"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


__all__ = ["BUDGET_FIELDS", "ENGINE_FIELDS", "SYSTEMS", "ResumeRefused", "check_resume", "engine_key",
           "engine_record", "processor", "resume_differences", "run_record", "signature", "versions"]
