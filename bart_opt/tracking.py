"""Experiment tracking in MLflow: one MLflow run per evaluation (the ``tracking`` extra).

``bart-opt evaluate`` and ``bart-opt score`` log to the tracking URI of ``--mlflow URI``, else of
``MLFLOW_TRACKING_URI`` (`tracking_uri`); service jobs to ``BART_OPT_MLFLOW_URI``
(`app.jobs.tracking`). MLflow is imported only here, and only when one of them is set.

`MlflowRun.start` opens the run before the evaluation starts: an MLflow that is not installed, a
server that cannot be reached or a store that refuses is a `TrackingError` then (its message shows
the URI with its password hidden, `bart_opt.redaction.redacted`), not after an hour of work. The
reachability checks (at the start, and again before the final logging), the progress points and
ending a failed run make no retries and wait `CHECK_TIMEOUT_S` at most (MLflow's own default retries a
refused connection for about four minutes); the final logging, once the server answered, keeps MLflow's
retries. The user's ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and
``MLFLOW_HTTP_REQUEST_TIMEOUT`` are kept where set.

While the evaluation runs, `MlflowRun.progress` logs ``progress.records`` (records with a row,
resumed ones included; step: the same count) and ``progress.fraction``, at most every
`PROGRESS_EVERY_S` and at the end. `MlflowRun.finish(folder)` logs the finished run folder
(`folder_params`, `folder_metrics`), and service jobs are logged as such a folder:

- params: the run record (run.json) flattened with dots (``generation.num_beams``, ``engine.dtype``,
  ``dataset.fingerprint``, ``rouge_settings.tokenizer``, ...), and each metric's signature
  (``signature.rouge``, ``signature.<baseline>``, ``signature.<metric>``);
- metrics: each aggregate at its point estimate with its interval bounds (``rouge1``,
  ``rouge1_low``, ``rouge1_high``: ROUGE's F-measure; any other metric of metrics.json as
  ``<name>.<score>``, ``_low``, ``_high``; a baseline's the same under its name: ``lead-3.rouge1``), and the counts and times (``n_scored``,
  ``runtime_s``, ``tokens.input``, ``memory.peak_bytes``, ...);
- artifacts: predictions.jsonl, metrics.json and run.json, and the paths given as `extra_artifacts` (the
  run's plots, which the CLI makes with `bart_opt.report.plots` where matplotlib is installed) under ``plots/``.

Tracking never loses an evaluation: once the run has started, a failure is a warning (`on_warning`
for progress) or a reason returned (`finish`), never an exception, and the run folder is complete
whatever MLflow did.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from numbers import Real
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bart_opt.redaction import redacted

ENV_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "bart-opt"
CHECK_TIMEOUT_S = 10
PROGRESS_EVERY_S = 2.0
ARTIFACTS = ("predictions.jsonl", "metrics.json", "run.json")
PLOTS = "plots"  # the artifact folder of the run's plots (`extra_artifacts`)
INSTALL = "pip install 'bart-opt[tracking]'"

# metrics.json keys that are not aggregates: settings, records, and ROUGE (read on its own, its bounds outermost).
_NOT_AGGREGATES = {"rouge", "rouge_settings", "rouge_coverage", "generation", "baselines", "memory", "padding",
                   "tokens", "warnings"}
_MEASURES = ("memory", "padding", "tokens")  # metrics.json's dicts of counts, logged as ``<dict>.<key>``
_MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param's value (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)

logger = logging.getLogger("bart_opt.tracking")


class TrackingError(Exception):
    """The run could not be started: MLflow is missing, the server cannot be reached or the store
    refuses. The message names the URI with its password hidden."""


def tracking_uri(flag: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Where a command logs: `flag` (``--mlflow``) when given, else ``MLFLOW_TRACKING_URI`` when set,
    else None (no tracking)."""
    if flag is not None:
        return flag
    return environ.get(ENV_URI) or None


class MlflowRun:
    """One MLflow run of one evaluation (see the module docstring); made by `start`."""

    def __init__(self, client: Any, run_id: str, experiment_id: str, uri: str,
                 on_warning: Callable[[str], None]):
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.uri = uri
        self.on_warning = on_warning
        self._progress_failed = False
        self._progress_logged = 0.0  # monotonic time of the last progress point

    @classmethod
    def start(cls, uri: str, *, name: str, tags: Mapping[str, str] | None = None, experiment: str | None = None,
              on_warning: Callable[[str], None] = logger.warning) -> MlflowRun:
        """Open a run named `name` in `experiment` (default: ``MLFLOW_EXPERIMENT_NAME``, else
        ``bart-opt``; made when missing) at `uri`, tagged with `tags`. Raises `TrackingError`."""
        shown = redacted(uri)
        try:
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
        except ModuleNotFoundError as error:
            if error.name is None or error.name.split(".")[0] != "mlflow":
                raise
            raise TrackingError(f"tracking in MLflow ({shown}) needs MLflow: {INSTALL}") from None
        experiment = experiment or os.environ.get(ENV_EXPERIMENT) or DEFAULT_EXPERIMENT
        try:
            client = MlflowClient(tracking_uri=uri)
            with _without_retries():
                found = client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
            run = client.create_run(experiment_id, run_name=name, tags=dict(tags or {}))
        except (MlflowException, OSError, ValueError) as error:
            raise TrackingError(f"MLflow at {shown} cannot be used: {_reason(error, uri)}") from None
        return cls(client, run.info.run_id, experiment_id, uri, on_warning)

    @classmethod
    def for_folder(cls, uri: str, out: str | Path, command: str,
                   on_warning: Callable[[str], None] = logger.warning) -> MlflowRun:
        """`start` the run of `command` (``evaluate``, ``score``) into run folder `out`: named after the
        folder, tagged with the command, the folder's absolute path and bart-opt's version."""
        from bart_opt import __version__

        folder = Path(out).resolve()
        tags = {"bart_opt.command": command, "bart_opt.out": str(folder), "bart_opt.version": __version__}
        return cls.start(uri, name=folder.name, tags=tags, on_warning=on_warning)

    @property
    def shown_uri(self) -> str:
        """The tracking URI with its password hidden."""
        return redacted(self.uri)

    def progress(self, done: int, total: int) -> None:
        """Log that `done` of `total` records have a row (throttled; the last point always goes).
        After a failure, progress is no longer logged (one warning)."""
        now = time.monotonic()
        if self._progress_failed or (done < total and now - self._progress_logged < PROGRESS_EVERY_S):
            return
        self._progress_logged = now
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        points = [Metric("progress.records", done, stamp, done),
                  Metric("progress.fraction", done / total if total else 1.0, stamp, done)]
        try:
            with _without_retries():  # a server gone mid-run costs the evaluation seconds, not minutes
                self.client.log_batch(self.run_id, metrics=points)
        except Exception as error:  # noqa: BLE001 - a tracker that fails never stops the evaluation
            self._progress_failed = True
            self.on_warning(f"MLflow at {self.shown_uri}: progress is no longer logged ({_reason(error, self.uri)}); "
                            "the evaluation goes on")

    def finish(self, folder: str | Path, extra_artifacts: Sequence[str | Path] = ()) -> str | None:
        """Log the finished run folder's params, metrics and artifacts (predictions.jsonl, metrics.json,
        run.json, then `extra_artifacts` under ``plots/``: the run's plots) and end the run. Returns
        None once it all went, else why not (the run is then ended as ``FAILED``): never raises, since
        the folder itself is complete whatever MLflow does."""
        folder = Path(folder)
        try:
            with _without_retries():  # a server gone during the evaluation is told at once, not after minutes
                self.client.get_run(self.run_id)
            run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
            metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
            self.log_folder(folder, run, metrics, extra_artifacts)
            self.client.set_terminated(self.run_id, "FINISHED")
        except Exception as error:  # noqa: BLE001 - the run folder is complete whatever MLflow does
            self.end("FAILED")
            return _reason(error, self.uri)
        return None

    def log_folder(self, folder: Path, run: Mapping[str, Any], metrics: Mapping[str, Any],
                   extra_artifacts: Sequence[str | Path] = ()) -> None:
        """Log `run` (run.json's record) and `metrics` (metrics.json's) as params and metrics, then the
        folder's files and `extra_artifacts` as artifacts. Raises what MLflow raises."""
        from mlflow.entities import Metric, Param

        stamp = int(time.time() * 1000)
        params = [Param(key, value) for key, value in folder_params(run, metrics).items()]
        points = [Metric(key, value, stamp, 0) for key, value in folder_metrics(metrics).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params in one batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        for start in range(0, len(points), 1000):  # and at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=points[start:start + 1000])
        for path in [folder / name for name in ARTIFACTS if (folder / name).is_file()]:
            self.client.log_artifact(self.run_id, str(path))
        for path in extra_artifacts:  # the run's plots
            self.client.log_artifact(self.run_id, str(path), PLOTS)

    def end(self, status: str) -> None:
        """End the run with `status` (``FAILED``, ``KILLED``). A failure to say so leaves the run ``RUNNING`` in
        MLflow and is logged at debug level only: the caller reports what went wrong."""
        try:
            with _without_retries():
                self.client.set_terminated(self.run_id, status)
        except Exception:  # noqa: BLE001 - nothing but the run's status in MLflow is lost
            logger.debug("MLflow at %s: run %s could not be ended as %s", self.shown_uri, self.run_id, status,
                         exc_info=True)

    @contextmanager
    def ended_on_error(self) -> Iterator[MlflowRun]:
        """The run, ended as ``KILLED`` (Ctrl-C) or ``FAILED`` (anything else) when the block raises."""
        try:
            yield self
        except KeyboardInterrupt:
            self.end("KILLED")
            raise
        except BaseException:
            self.end("FAILED")
            raise


def folder_params(run: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, str]:
    """The params of a run: its record `run` (run.json) flattened with dots, without its earlier runs
    (``history``), and the signature of each metric of `metrics` (metrics.json) as ``signature.<name>``:
    ROUGE's as ``signature.rouge``, each baseline's under its name."""
    record = {key: value for key, value in run.items() if key not in ("history", "signature")}
    params = {key: _param(value) for key, value in _flattened(record)}
    signature = metrics.get("signature") or run.get("signature")
    if signature:
        params["signature.rouge"] = _param(signature)
    for name, value in list(metrics.get("baselines", {}).items()) + list(metrics.items()):
        if isinstance(value, Mapping) and isinstance(value.get("signature"), str):
            params[f"signature.{name}"] = _param(value["signature"])
    return params


def folder_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a run from its `metrics` (metrics.json): see the module docstring."""
    found = dict(_aggregates("", metrics))
    for name, baseline in metrics.get("baselines", {}).items():
        found.update(_aggregates(f"{name}.", baseline))
    found.update((key, float(value)) for key, value in metrics.items() if _is_number(value))
    for group in _MEASURES:
        found.update((f"{group}.{key}", float(value)) for key, value in (metrics.get(group) or {}).items()
                     if _is_number(value))
    return found


def _aggregates(prefix: str, system: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """One system's aggregates with their bounds: ROUGE's F-measures (``rouge1``, ``rouge1_low``,
    ``rouge1_high``), then every other metric's scores (``<name>.<score>``, ``_low``, ``_high``)."""
    for kind, interval in (system.get("rouge") or {}).items():
        yield f"{prefix}{kind}", float(interval["mid"]["fmeasure"])
        for bound in ("low", "high"):
            yield f"{prefix}{kind}_{bound}", float(interval[bound]["fmeasure"])
    for name, value in system.items():
        if name in _NOT_AGGREGATES or not isinstance(value, Mapping):
            continue
        for score, interval in value.items():
            if isinstance(interval, Mapping) and _is_number(interval.get("mid")):
                yield f"{prefix}{name}.{score}", float(interval["mid"])
                for bound in ("low", "high"):
                    if _is_number(interval.get(bound)):
                        yield f"{prefix}{name}.{score}_{bound}", float(interval[bound])


def _flattened(value: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, item in value.items():
        if isinstance(item, Mapping) and item:
            yield from _flattened(item, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", item


def _param(value: Any) -> str:
    """A param's text: a string as it is, anything else as JSON (``true``, ``null``, ``[2]``), cut to MLflow's limit."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _MAX_PARAM_LENGTH else text[:_MAX_PARAM_LENGTH - 1] + "…"


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _reason(error: BaseException, uri: str) -> str:
    """`error` in one line, the URI's password hidden wherever the message repeats it."""
    text = " ".join(str(error).split()) or type(error).__name__
    password = urlsplit(uri).password if "@" in uri else None
    if password:
        text = text.replace(password, "***")
    return redacted(text)


@contextmanager
def _without_retries() -> Iterator[None]:
    """MLflow's HTTP requests inside the block make no retries and wait `CHECK_TIMEOUT_S` at most (unless the
    user set MLflow's own variables), so an unreachable server is told at once. MLflow reads them at each
    request; they are set for the block only."""
    limits = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(CHECK_TIMEOUT_S)}
    added = [name for name in limits if name not in os.environ]
    os.environ.update({name: limits[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


__all__ = ["ARTIFACTS", "DEFAULT_EXPERIMENT", "ENV_URI", "MlflowRun", "TrackingError", "folder_metrics",
           "folder_params", "tracking_uri"]
