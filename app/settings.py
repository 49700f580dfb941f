"""Service settings, read from the environment with the prefix ``BART_OPT_``.

``BART_OPT_MODEL=./demo-model BART_OPT_API_KEY=secret uvicorn app.main:app`` configures
the service without code; ``create_app(Settings(...))`` does the same in tests and in
``app.server.serve``. Routes receive the settings through the :func:`get_settings`
dependency, so a test may also swap them with ``app.dependency_overrides``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import Request
from pydantic import Field, SecretStr, ValidationInfo, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.jobs.config import COMPONENTS, JobsConfig
from bart_opt.cluster import ClusterOptions
from bart_opt.compare import MAX_RESAMPLES
from bart_opt.errors import InvalidRequest
from bart_opt.engine.options import EngineOptions, OptionConflict
from bart_opt.pipeline.readers import DEFAULT_MAX_LINE_BYTES
from bart_opt.pipeline.rouge import RougeSettings
from bart_opt.scoring.registry import DEFAULT as DEFAULT_METRICS
from bart_opt.scoring.registry import NAMES as METRIC_NAMES
from bart_opt.scoring.registry import MetricSettings
from bart_opt.surfaces import settings_of

T = TypeVar("T")


def engine_settings(options: type[EngineOptions] = EngineOptions) -> type[BaseSettings]:
    """A settings class with one field per field of `options`: its type, its help as the
    description and its ``service`` default where the service's differs from the library's.
    The values are checked by `options` itself (see `Settings`)."""
    hints = typing.get_type_hints(options)
    names = [f.name for f in dataclasses.fields(options)]
    definitions: dict[str, Any] = {
        f.name: (hints[f.name], Field(f.metadata.get("service", f.default), description=f.metadata["help"]))
        for f in dataclasses.fields(options)
    }

    def check(cls, value: Any, info: ValidationInfo) -> Any:
        try:
            return options.check(info.field_name, value)
        except InvalidRequest as error:
            raise ValueError(error.message) from None

    validators = {"_check_engine": field_validator(*names)(check)}
    return create_model(f"{options.__name__}Settings", __base__=BaseSettings, __validators__=validators, **definitions)


def component_settings(base: type[BaseSettings], components: tuple[type, ...]) -> type[BaseSettings]:
    """`base` with one field per setting of each dataclass in `components` (the fields declared with a
    ``setting``, `bart_opt.surfaces.surfaced`): its type, default, bounds and help (as the description).

    A component's switch (`ClusterOptions.address`) is None when unset: the component is off."""
    definitions: dict[str, Any] = {}
    for component in components:
        hints = typing.get_type_hints(component)
        for setting, f in settings_of(component).items():
            switch = f.metadata["switch"]
            bounds = dict(f.metadata["bounds"], **({"allow_inf_nan": False} if f.metadata["finite"] else {}))
            description = f.metadata["help"][0].upper() + f.metadata["help"][1:] + "."
            definitions[setting] = (hints[f.name] | None if switch else hints[f.name],
                                    Field(None if switch else f.default, description=description, **bounds))
    return create_model(f"{base.__name__}Components", __base__=base, **definitions)


class Settings(component_settings(engine_settings(), (*COMPONENTS.values(), ClusterOptions))):
    """Everything the service can be told; each field is also ``BART_OPT_<NAME>`` in the environment.

    The engine's fields (model, device, dtype, exact, fast, static, budgets, max_beams, torch_threads,
    count_cpu_tensors) come from `bart_opt.engine.options.EngineOptions`; `engine_options` gives them back
    as that value. The jobs' components (`app.jobs.config.COMPONENTS`: the database pool, the runner,
    the intake limits) and the Ray options (`bart_opt.cluster.ClusterOptions`, ``ray_*``) give theirs
    (`component_settings`); `component`, `cluster_options` and `jobs_config` build them back.
    """

    # hide_input_in_errors: a refused value (the API key, a database URL's password) never appears in the error's text.
    model_config = SettingsConfigDict(env_prefix="BART_OPT_", extra="ignore", protected_namespaces=(),
                                      hide_input_in_errors=True)

    max_texts: int = Field(64, ge=1, description="Most texts in one POST /summarize.")
    max_request_cost: int = Field(
        65_536, ge=1, description="Decoder work one POST /summarize may ask for: texts x num_beams x max_new_tokens."
    )
    max_input_tokens: int = Field(
        65_536, ge=1, description="Input tokens (after truncation, summed over texts) one POST /summarize may send."
    )
    max_request_bytes: int = Field(1_048_576, ge=1, description="Largest accepted request body (413 above).")
    request_timeout_s: float = Field(
        300.0, gt=0, description="Deadline of a request, from arrival to its answer's start (504 past it)."
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="Time a client has to send the whole request body (408 and the connection closed)."
    )
    queue_size: int = Field(64, ge=1, description="Interactive requests that may wait for the device (429 above).")
    micro_batch: bool = Field(True, description="Merge waiting requests with equal generation settings into one call.")
    api_key: SecretStr | None = Field(
        None, description="When set, every route but /health, /ready and the dashboard's page and files needs "
        "'Authorization: Bearer <key>'. Refused at start with white space at either end."
    )
    docs: bool = Field(
        False, description="Serve the API docs: /docs (Swagger UI, from files the package ships, under the "
        "dashboard's CSP) and /openapi.json, behind the API key when one is set. Off: both are 404."
    )
    host: str = Field("127.0.0.1", description="Address to listen on (0.0.0.0: every interface).")
    port: int = Field(8000, ge=0, le=65535)
    allowed_hosts: str | None = Field(
        None, description="Host header values the server answers, comma-separated names or addresses ('*.example.com' "
        "for subdomains, '*' for any; the port is not compared). Unset: without an API key only the server's own "
        "names (localhost, loopback addresses, the address it listens on; any IP address when it listens on every "
        "interface), with one any Host. Others get 400 host_not_allowed (app.hosts: DNS rebinding)."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="Time a client has to send a request's headers, from its connection or its first "
        "byte (the connection is closed past it, with a 408 when some bytes came; app.connections)."
    )
    max_connections: int = Field(
        512, ge=1, description="Most connections open at once; one more closes the oldest connection still waiting "
        "for its headers, or is itself closed when every one is a request (app.connections)."
    )
    recent_logs: int = Field(100, ge=1, description="Requests kept for GET /metrics?format=json.")
    shutdown_timeout: float = Field(30.0, gt=0, description="Seconds SIGTERM waits for requests in flight.")
    db: str = Field(
        "./bart_opt_jobs.db", description="Database of evaluation jobs: a SQLite file path (or sqlite:///PATH), or "
        "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (the postgres extra) for several replicas on several machines."
    )
    fd_unhealthy_fraction: float = Field(
        0.9, gt=0, le=1, description="GET /health answers 503 once the process holds this fraction of its file "
        "descriptor limit (RLIMIT_NOFILE, ulimit -n)."
    )
    data_dir: str = Field("./data", description="The only folder evaluation jobs may read files from.")
    hub_datasets: str = Field(
        "abisee/cnn_dailymail",
        description="Hub datasets evaluation jobs may stream, comma-separated ids; '*' allows any id, '' none.",
    )
    max_compare_examples: int = Field(
        100_000, ge=1, description="Most examples a job may have to be compared by GET /compare (its rows are held "
        "in memory while it runs; bart-opt compare on downloaded predictions has no such cap).",
    )
    max_compare_resamples: int = Field(
        10_000, ge=1, le=MAX_RESAMPLES, description="Most bootstrap resamples and randomization trials one GET "
        "/compare may ask for (bart-opt compare takes up to bart_opt.compare.MAX_RESAMPLES).",
    )
    max_line_bytes: int = Field(
        DEFAULT_MAX_LINE_BYTES, ge=1024,
        description="Most bytes of a dataset file parsed as one piece (JSONL line, CSV row, JSON array element); "
        "a larger one is refused without reading it whole.",
    )
    dataset_loaders: int = Field(
        2, ge=1, description="Threads loading submitted datasets, for hub and for local sources each (429 beyond twice that)."
    )
    rouge_tokenizer: str = Field(
        "default", description="ROUGE tokenizer of jobs that name none: default (rouge-score's, a-z and 0-9 only), "
        "unicode or script (docs/evaluation.md)."
    )
    rouge_lang: str = Field("en", description="ROUGE language of jobs that name none (an ISO 639-1 code: its stemmer "
                            "and rougeLsum sentence splitting).")
    metrics: str = Field(",".join(DEFAULT_METRICS), description="Metrics of jobs that name none: a comma list of "
                         f"{', '.join(METRIC_NAMES)} (ROUGE is always scored; docs/evaluation.md#metrics-beyond-rouge).")
    bertscore_model: str | None = Field(None, description="The checkpoint (folder or cached hub id) of the bertscore "
                                        "metric; jobs may choose bertscore only when it is set.")
    consistency_model: str | None = Field(None, description="The NLI checkpoint (folder or cached hub id) of the "
                                          "consistency metric; jobs may choose consistency only when it is set.")

    def engine_options(self) -> EngineOptions:
        """The engine fields as `EngineOptions`."""
        return EngineOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EngineOptions)})

    def component(self, component: type[T]) -> T:
        """The dataclass `component` (one of `component_settings`' components) from its settings."""
        return component(**{f.name: getattr(self, setting) for setting, f in settings_of(component).items()})

    def cluster_options(self) -> ClusterOptions | None:
        """The Ray options (``BART_OPT_RAY_*``), None without ``BART_OPT_RAY_ADDRESS``: no cluster."""
        return None if self.ray_address is None else self.component(ClusterOptions)

    def jobs_config(self) -> JobsConfig:
        """Everything the jobs run under (`app.jobs.config.JobsConfig`): the components, and the settings of the
        other fields' names."""
        built = {name: self.component(component) for name, component in COMPONENTS.items()}
        built.update(engine=self.engine_options(), cluster=self.cluster_options(), rouge=self.rouge_settings(),
                     metrics=self.metric_settings(self.rouge_settings()))
        rest = {f.name: getattr(self, f.name) for f in dataclasses.fields(JobsConfig) if f.name not in built}
        return JobsConfig(**built, **rest)

    def rouge_settings(self, tokenizer: str | None = None, lang: str | None = None) -> RougeSettings:
        """A job's ROUGE settings: `tokenizer` and `lang` where given, else these settings' (`InvalidRequest`
        naming ``tokenizer`` or ``lang`` for a bad value)."""
        return RougeSettings(tokenizer=tokenizer or self.rouge_tokenizer, lang=lang or self.rouge_lang)

    def metric_settings(self, rouge: RougeSettings, metrics: Sequence[str] | None = None) -> MetricSettings:
        """A job's metrics: `metrics` where given, else ``BART_OPT_METRICS``, with the words and sentences of
        `rouge`'s language and these settings' models (`InvalidRequest` naming ``metrics``, or the model
        setting a chosen model metric lacks)."""
        device = "cpu" if self.device == "auto" else self.device
        return MetricSettings.for_rouge(rouge, self.metrics if metrics is None else metrics,
                                        bertscore_model=self.bertscore_model,
                                        consistency_model=self.consistency_model, device=device)

    @model_validator(mode="after")
    def _check_rouge(self) -> Settings:
        try:
            self.rouge_settings()
        except InvalidRequest as error:
            raise ValueError(f"BART_OPT_ROUGE_{error.field.upper()}: {error.message}") from None
        return self

    @model_validator(mode="after")
    def _check_metrics(self) -> Settings:
        try:
            self.metric_settings(self.rouge_settings())
        except InvalidRequest as error:
            raise ValueError(f"BART_OPT_{error.field.upper()}: {error.message}") from None
        return self

    @model_validator(mode="after")
    def _check_engine_options(self) -> Settings:
        """Engine settings that exclude each other, or a device this machine lacks, are refused when the
        settings are read (`EngineOptions.validate`), so the service never starts on them."""
        try:
            self.engine_options().validate()
        except OptionConflict as error:
            raise ValueError(error.naming(setting_name)) from None
        except InvalidRequest as error:
            raise ValueError(f"{setting_name(error.field)}: {error.message}") from None
        return self

    @field_validator("db")
    @classmethod
    def _check_db(cls, value: str) -> str:
        from app.jobs.database import database_url  # here: app.jobs imports the settings

        database_url(value)  # refused here, at start: an unknown scheme, a URL taken for a file name
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _check_allowed_hosts(cls, value: str | None) -> str | None:
        from app.hosts import parse_hosts

        parse_hosts(value or "")  # refused here, at start: a port or a path in an entry
        return value

    @field_validator("ray_address")
    @classmethod
    def _empty_address_is_none(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("mlflow_uri")
    @classmethod
    def _check_mlflow_uri(cls, value: str | None) -> str | None:
        """An empty URI is none; a URI without MLflow installed is refused at start, not at the first job's end."""
        import importlib.util

        from bart_opt.tracking import INSTALL

        value = value.strip() or None if value is not None else None
        if value is not None and importlib.util.find_spec("mlflow") is None:
            raise ValueError(f"BART_OPT_MLFLOW_URI needs MLflow: {INSTALL}")
        return value

    @field_validator("api_key")
    @classmethod
    def _check_api_key(cls, value: SecretStr | None) -> SecretStr | None:
        """An empty key is no key; one with white space at either end is refused (never stripped, never shown)."""
        if value is None or not value.get_secret_value():
            return None
        key = value.get_secret_value()
        if key != key.strip():
            raise ValueError("BART_OPT_API_KEY has white space at its start or end (a newline from a file or "
                             "`echo`?); it is not stripped, so every request would be refused: set it without")
        return value


def setting_name(field: str) -> str:
    """The environment variable of settings field `field`, as pydantic-settings reads it (the prefix of
    `Settings.model_config`): ``exact`` -> ``BART_OPT_EXACT``. The service's one spelling of an option, in
    every refusal (`bart_opt.engine.options.OptionConflict.naming`)."""
    return f"{Settings.model_config['env_prefix']}{field.upper()}"


def get_settings(request: Request) -> Settings:
    """FastAPI dependency: the settings the app was created with."""
    return request.app.state.settings
