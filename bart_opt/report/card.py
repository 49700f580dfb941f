"""A Hugging Face ``model-index`` block for a model card, built with ``huggingface_hub``'s own classes.

`model_card_data` turns one run's corpus scores (`bart_opt.report.tables.metric_intervals`: ROUGE's
F-measures and every other metric's) into `huggingface_hub.EvalResult` entries of one
`huggingface_hub.ModelCardData`, task ``summarization``, on the run's dataset
(`bart_opt.report.runs.describe_dataset`). Each value is the mean over examples (``mid``), on the scale
the run stores it (ROUGE 0-100). Nothing is pushed or downloaded: `model_index_yaml` is the text to
paste into a model card's front matter.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import EvalResult, ModelCardData

from bart_opt.report.runs import ReportRun, describe_dataset
from bart_opt.report.tables import metric_intervals

TASK = "summarization"
ROUGE_NAMES = {"rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "rougeL": "ROUGE-L", "rougeLsum": "ROUGE-Lsum"}
DIGITS = 4


def model_card_data(run: ReportRun, model_name: str | None = None) -> ModelCardData:
    """The card data of `run`'s model (named `model_name`, default: the run's model name) with an
    `EvalResult` per corpus score; ValueError naming the run when it has none."""
    dataset = describe_dataset(run)
    results = []
    for column, interval in metric_intervals(run.metrics).items():
        metric, _, score = column.rpartition(".")
        if not metric:  # a ROUGE type
            metric, name = "rouge", ROUGE_NAMES.get(score, score)
        else:
            name = f"{metric} {score}"
        results.append(EvalResult(
            task_type=TASK, task_name="Summarization", dataset_type=dataset["type"], dataset_name=dataset["name"],
            dataset_config=dataset["config"], dataset_split=dataset["split"], metric_type=metric,
            metric_name=name, metric_config=score, metric_value=round(interval.mid, DIGITS),
        ))
    if not results:
        raise ValueError(f"{run.path} holds no scores (no references were scored): nothing to put in a model card")
    return ModelCardData(model_name=model_name or card_name(run), eval_results=results, pipeline_tag=TASK, tags=["bart-opt"])


def card_name(run: ReportRun) -> str:
    """The run's model as a card names it: a hub id (``facebook/bart-large-cnn``) or a relative folder as it
    is, an absolute or nested path by its last part."""
    model = str(run.metrics.get("model") or run.name)
    return Path(model).name if Path(model).is_absolute() or model.count("/") > 1 else model


def model_index_yaml(run: ReportRun, model_name: str | None = None) -> str:
    """`model_card_data`'s YAML (``model-index``, ``pipeline_tag``, ``tags``), ending in a newline."""
    return model_card_data(run, model_name).to_yaml().rstrip("\n") + "\n"


def card_run(runs: list[ReportRun]) -> ReportRun:
    """The run a model card describes: the first that is a model's (``bart``), else the first
    another system's (``external``), else the first."""
    for system in ("bart", "external"):
        for run in runs:
            if run.system == system:
                return run
    return runs[0]


__all__ = ["card_name", "card_run", "model_card_data", "model_index_yaml"]
