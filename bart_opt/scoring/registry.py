"""Which metrics a run scores: their names, the one settings value that builds them, and how to read them back.

Names (``--metrics``, the ``metrics`` job field, ``BART_OPT_METRICS``; the contract): ``rouge``,
``extractive`` (`bart_opt.scoring.extractive`), ``length`` (`bart_opt.scoring.length`), ``bertscore``
and ``consistency`` (models: ``--bertscore-model``, ``--consistency-model``). `DEFAULT` is the cheap
ones, which need no model. ROUGE is always scored, first: its place in every file is fixed (a row's
``rouge``, ``metrics.json``'s ``rouge``), so ``--metrics length`` means ``rouge,length``.

`MetricSettings` is the one owner of the choice: parsed and checked once (`InvalidRequest` naming
``metrics``, ``bertscore_model`` or ``consistency_model``), frozen, recorded with the run
(`to_dict`, in run.json's ``metrics``), and `build_metrics` makes the `bart_opt.scoring.base.Metric`
objects from it. The model metrics are imported only when chosen.

What reads a finished run reads its metrics through `metric_names` (the list, in order, from
``metrics.json``), `intervals` (every metric's ``{score: {low, mid, high}}``, ROUGE's as its
F-measures) and `row_scores` (one row's per-example scores the same way).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bart_opt.errors import InvalidRequest
from bart_opt.scoring import extractive
from bart_opt.scoring.base import Metric
from bart_opt.scoring.length import word_tokenizer

if TYPE_CHECKING:  # bart_opt.pipeline.rouge imports rouge-score and nltk: not for the command line's parser
    from bart_opt.pipeline.rouge import RougeSettings

NAMES = ("rouge", "extractive", "length", "bertscore", "consistency")
DEFAULT = ("rouge", "extractive", "length")
MODEL_METRICS = {  # name -> (module, class, the settings field naming its model)
    "bertscore": ("bart_opt.scoring.bertscore", "BertScoreMetric", "bertscore_model"),
    "consistency": ("bart_opt.scoring.consistency", "ConsistencyMetric", "consistency_model"),
}
ROUGE_MEASURE = "fmeasure"  # what `intervals` and `row_scores` show of ROUGE
BOUNDS = ("low", "mid", "high")
# The scores a metric gives only when the example's source is known (a run's aggregation names those it left out).
SOURCE_SCORES = {"extractive": extractive.SOURCE_SCORES}


def parse_metrics(value: str | Iterable[str]) -> tuple[str, ...]:
    """The metric names of a comma list (``"rouge,bertscore"``) or a list of names, ``rouge`` first.

    Raises `InvalidRequest` ``("metrics", ...)`` for an empty list, an unknown or a repeated name.
    """
    given = value.split(",") if isinstance(value, str) else list(value)
    names = [name.strip() if isinstance(name, str) else name for name in given]
    if not names or any(not name for name in names):
        raise InvalidRequest("metrics", f"give a comma list of {', '.join(NAMES)} (got {value!r}: an empty name)")
    unknown = [name for name in names if name not in NAMES]
    if unknown:
        raise InvalidRequest("metrics", f"unknown metric {unknown[0]!r}; the metrics are {', '.join(NAMES)}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidRequest("metrics", f"{', '.join(repeated)} given more than once")
    return ("rouge", *(name for name in names if name != "rouge"))


@dataclass(frozen=True)
class MetricSettings:
    """The metrics of a run and what decides their numbers (see the module docstring).

    metrics: names of `NAMES` (a comma list is parsed: `parse_metrics`), ``rouge`` first.
    tokenizer / lang: the words and sentences of ``length`` and ``extractive`` (``unicode`` or ``script``;
        an ISO 639-1 code): the ROUGE settings' by default (`for_rouge`).
    bertscore_model, bertscore_layer, bertscore_idf, consistency_model: the model metrics' settings
        (a folder or a hub id; the layer and idf as ``bert-score`` documents them).
    device: where the model metrics run.
    """

    metrics: tuple[str, ...] = DEFAULT
    tokenizer: str = "unicode"
    lang: str = "en"
    bertscore_model: str | None = None
    bertscore_layer: int | None = None
    bertscore_idf: bool = False
    consistency_model: str | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", parse_metrics(self.metrics))
        for name, (_, _, field) in MODEL_METRICS.items():
            if name in self.metrics and not getattr(self, field):
                raise InvalidRequest(field, f"the metric {name} needs a model: give --{field.replace('_', '-')} "
                                     "DIR_OR_ID (a checkpoint folder, or a hub id already in the cache)")
        word_tokenizer(self.tokenizer, self.lang)  # InvalidRequest naming tokenizer or lang

    @classmethod
    def for_rouge(cls, rouge: RougeSettings, metrics: str | Iterable[str] = DEFAULT, **fields: Any) -> MetricSettings:
        """Settings whose words and sentences follow `rouge`'s language (the ``script`` tokenizer for a
        ``script`` ROUGE, else ``unicode``)."""
        tokenizer = "script" if rouge.tokenizer == "script" else "unicode"
        return cls(metrics=tuple(parse_metrics(metrics)), tokenizer=tokenizer, lang=rouge.lang, **fields)

    @property
    def models(self) -> bool:
        """Whether a chosen metric runs a model."""
        return any(name in MODEL_METRICS for name in self.metrics)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a run records them (what `from_dict` reads back)."""
        return {"names": list(self.metrics), "tokenizer": self.tokenizer, "lang": self.lang,
                "bertscore_model": self.bertscore_model, "bertscore_layer": self.bertscore_layer,
                "bertscore_idf": self.bertscore_idf, "consistency_model": self.consistency_model,
                "device": self.device}

    def record(self, metrics: Iterable[Metric]) -> dict[str, Any]:
        """What a run records of its metrics (run.json's and metrics.json's ``metrics``/``metric_settings``):
        `to_dict` and each built metric's signature but ROUGE's (recorded as ``rouge_settings``)."""
        return {**self.to_dict(), "signatures": {m.name: m.signature() for m in metrics if m.name != "rouge"}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricSettings:
        """Settings from `to_dict`'s shape (unknown keys ignored)."""
        given = {key: data[key] for key in ("tokenizer", "lang", "bertscore_model", "bertscore_layer",
                                            "bertscore_idf", "consistency_model", "device") if key in data}
        return cls(metrics=tuple(data.get("names", DEFAULT)), **given)


def build_metrics(settings: MetricSettings, rouge: RougeSettings | None = None) -> list[Metric]:
    """The `Metric` objects of `settings`, in order, ROUGE's of `rouge` first.

    Raises `InvalidRequest` ``("metrics", ...)`` when a chosen model metric cannot be imported here
    (its module or the library it runs on is not installed).
    """
    from bart_opt.scoring.extractive import ExtractiveMetric
    from bart_opt.scoring.length import LengthMetric
    from bart_opt.scoring.rouge import RougeMetric

    built: list[Metric] = []
    for name in settings.metrics:
        if name == "rouge":
            built.append(RougeMetric(rouge))
        elif name == "extractive":
            built.append(ExtractiveMetric(settings.tokenizer, settings.lang))
        elif name == "length":
            built.append(LengthMetric(settings.tokenizer, settings.lang))
        elif name == "bertscore":
            built.append(_model_metric(name)(settings.bertscore_model, layer=settings.bertscore_layer,
                                             idf=settings.bertscore_idf, device=settings.device))
        else:
            built.append(_model_metric(name)(settings.consistency_model, device=settings.device))
    return built


def _model_metric(name: str) -> type:
    module, attribute, _ = MODEL_METRICS[name]
    try:
        return getattr(importlib.import_module(module), attribute)
    except ModuleNotFoundError as error:
        raise InvalidRequest("metrics", f"the metric {name} needs {error.name or module}, which is not installed "
                             "here") from None


def metric_names(metrics: Mapping[str, Any]) -> tuple[str, ...]:
    """The metrics a finished run (its ``metrics.json``, or a baseline's part of it) scored, in order;
    ``("rouge",)`` for a run from before metrics beyond ROUGE."""
    return tuple(metrics.get("metrics") or ("rouge",))


def intervals(metrics: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Every metric of a finished run as ``{metric: {score: {"low", "mid", "high"}}}``, in `metric_names`'
    order: ROUGE's scores are its types' F-measures (``rouge1`` ...); a metric with nothing scored is left out."""
    found: dict[str, dict[str, dict[str, float]]] = {}
    for name in metric_names(metrics):
        aggregate = metrics.get(name)
        if not aggregate:
            continue
        if name == "rouge":  # a type without its three F-measures (a partial record) is left out
            found[name] = {t: {bound: value[bound][ROUGE_MEASURE] for bound in BOUNDS}
                           for t, value in aggregate.items()
                           if all(ROUGE_MEASURE in (value.get(bound) or {}) for bound in BOUNDS)}
        else:
            found[name] = {score: dict(value) for score, value in aggregate.items()}
    return found


def row_scores(row: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """One prediction row's per-example scores as ``{metric: {score: value}}``: ROUGE's F-measures (when the
    row has ROUGE) and the row's ``scores`` (none for a row from before metrics beyond ROUGE, or not scored)."""
    found: dict[str, dict[str, float]] = {}
    if row.get("rouge"):
        found["rouge"] = {t: float(value[ROUGE_MEASURE]) for t, value in row["rouge"].items()}
    for name, scores in (row.get("scores") or {}).items():
        found[name] = {score: float(value) for score, value in scores.items()}
    return found


__all__ = ["DEFAULT", "MODEL_METRICS", "NAMES", "SOURCE_SCORES", "MetricSettings", "build_metrics", "intervals", "metric_names",
           "parse_metrics", "row_scores"]
