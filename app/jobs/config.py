"""`JobsConfig`: everything the jobs take from the service's settings, built in one place
(`app.settings.Settings.jobs_config`), so the job service reads no `Settings` and copies no field.

The components' own options are their dataclasses, each field owning its default, help and
bounds and naming its setting (`bart_opt.surfaces`): `PoolLimits`, `RunnerConfig`,
`IntakeLimits` and, with ``BART_OPT_RAY_ADDRESS``, `bart_opt.cluster.ClusterOptions`. The rest are
settings read under their own names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from app.jobs.database import PoolLimits
from app.jobs.intake import IntakeLimits
from app.jobs.runner import RunnerConfig
from bart_opt.cluster import ClusterOptions
from bart_opt.options import EngineOptions
from bart_opt.rouge import RougeSettings

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


__all__ = ["COMPONENTS", "JobsConfig"]
