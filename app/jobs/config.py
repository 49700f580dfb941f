"""`JobsConfig`: everything the jobs take from the service's settings, built in one place
(`app.settings.Settings.jobs_config`), so the job service reads no `Settings` and copies no field.

The components' own options are their dataclasses, each field owning its default, help and
bounds and naming its setting (`bart_opt.surfaces`): `PoolLimits`, `RunnerConfig`,
`IntakeLimits` and, with ``BART_OPT_RAY_ADDRESS``, `bart_opt.cluster.ClusterOptions`. The rest are
settings read under their own names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from app.jobs.database import PoolLimits
from app.jobs.intake import IntakeLimits
from app.jobs.runner import RunnerConfig
from bart_opt.cluster import ClusterOptions
from bart_opt.engine.options import EngineOptions
from bart_opt.pipeline.rouge import RougeSettings
from bart_opt.scoring.registry import MetricSettings

COMPONENTS = {"pool": PoolLimits, "runner": RunnerConfig, "intake": IntakeLimits}
"""The components built from the settings' fields that name them (`app.settings.Settings.component`)."""


@dataclass(frozen=True)
class JobsConfig:
    """What the jobs run under (see the module docstring)."""

    pool: PoolLimits
    runner: RunnerConfig
    intake: IntakeLimits
    engine: EngineOptions  # what a Ray replica loads
    cluster: ClusterOptions | None  # None: the jobs run on the engine's device worker
    rouge: RougeSettings  # of jobs that name no tokenizer or language
    metrics: MetricSettings  # of jobs that name none (BART_OPT_METRICS), and the models of the model metrics
    db: str
    data_dir: str
    hub_datasets: str
    dataset_loaders: int
    max_line_bytes: int
    shutdown_timeout: float

    def rouge_settings(self, tokenizer: str | None = None, lang: str | None = None) -> RougeSettings:
        """A job's ROUGE settings: `tokenizer` and `lang` where given, else the defaults' (`InvalidRequest`
        naming ``tokenizer`` or ``lang`` for a bad value)."""
        given = {"tokenizer": tokenizer, "lang": lang}
        return dataclasses.replace(self.rouge, **{name: value for name, value in given.items() if value})

    def metric_settings(self, rouge: RougeSettings, names: Sequence[str] | None = None) -> MetricSettings:
        """A job's metrics: `names` where given, else the defaults', with the words and sentences of `rouge`'s
        language and the server's models (`InvalidRequest` naming ``metrics``, or the model field a chosen
        model metric lacks)."""
        chosen = self.metrics
        return MetricSettings.for_rouge(rouge, chosen.metrics if names is None else names,
                                        bertscore_model=chosen.bertscore_model,
                                        consistency_model=chosen.consistency_model, device=chosen.device)


__all__ = ["COMPONENTS", "JobsConfig"]
