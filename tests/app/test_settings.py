"""Settings from the environment, and no model work at import time."""

from __future__ import annotations

import dataclasses
import importlib
import typing

import pytest
from pydantic import ValidationError

from app.jobs.config import COMPONENTS, JobsConfig
from app.settings import Settings, setting_name
from bart_opt.cluster import ClusterOptions
from bart_opt.errors import InvalidRequest
from bart_opt.pipeline.rouge import RougeSettings
from bart_opt.surfaces import settings_of


def test_defaults(monkeypatch):
    for name in ("MODEL", "HOST", "PORT", "API_KEY", "DB", "DATA_DIR", "DEVICE", "DTYPE"):
        monkeypatch.delenv(f"BART_OPT_{name}", raising=False)
    s = Settings()
    assert s.model == "facebook/bart-large-cnn"
    assert (s.host, s.port, s.device, s.dtype) == ("127.0.0.1", 8000, "auto", "auto")
    assert s.api_key is None and s.micro_batch is True
    assert (s.db, s.data_dir) == ("./bart_opt_jobs.db", "./data")


def test_environment_with_prefix(monkeypatch):
    monkeypatch.setenv("BART_OPT_MODEL", "/models/demo")
    monkeypatch.setenv("BART_OPT_MAX_TEXTS", "7")
    monkeypatch.setenv("BART_OPT_MICRO_BATCH", "false")
    monkeypatch.setenv("BART_OPT_API_KEY", "key-4711")
    s = Settings()
    assert (s.model, s.max_texts, s.micro_batch) == ("/models/demo", 7, False)
    assert s.api_key.get_secret_value() == "key-4711"
    assert "key-4711" not in repr(s)


def test_exact_mode_reaches_the_model(monkeypatch, demo_checkpoint):
    from app.device.engine import load_summarizer

    monkeypatch.setenv("BART_OPT_EXACT", "true")
    settings = Settings(model=demo_checkpoint)
    assert settings.exact is True and load_summarizer(settings).model.exact is True
    assert load_summarizer(Settings(model=demo_checkpoint, exact=False)).model.exact is False


def test_fast_mode_reaches_the_model_and_refuses_exact_beside_it(monkeypatch, demo_checkpoint):
    from app.device.engine import load_summarizer

    monkeypatch.setenv("BART_OPT_FAST", "true")
    model = load_summarizer(Settings(model=demo_checkpoint)).model
    assert model.fast is True and model.exact is False
    with pytest.raises(ValueError, match="exclude each other"):
        load_summarizer(Settings(model=demo_checkpoint, exact=True))


def test_empty_api_key_means_none(monkeypatch):
    monkeypatch.setenv("BART_OPT_API_KEY", "")
    assert Settings().api_key is None


@pytest.mark.parametrize(("field", "value"), [("device", "gpu"), ("dtype", "int8"), ("queue_size", 0), ("port", 70000)])
def test_bad_values_are_refused(field, value):
    with pytest.raises(ValidationError, match=field):
        Settings(**{field: value})


def test_importing_the_app_loads_no_model():
    main = importlib.import_module("app.main")
    assert getattr(main.app.state, "engine", None) is None  # the engine and its model come with the lifespan


def test_the_engine_settings_are_the_engine_options_with_the_service_defaults(monkeypatch):
    from bart_opt.engine.options import EngineOptions

    for name in ("MAX_BATCH_TOKENS", "MAX_BATCH_SIZE", "MAX_BEAMS", "TORCH_THREADS", "COUNT_CPU_TENSORS"):
        monkeypatch.delenv(f"BART_OPT_{name}", raising=False)
    s = Settings(model="m", device="cpu")
    assert s.engine_options() == EngineOptions(model="m", device="cpu", max_batch_tokens=16384, max_batch_size=32,
                                               max_beams=16)
    monkeypatch.setenv("BART_OPT_TORCH_THREADS", "3")
    monkeypatch.setenv("BART_OPT_COUNT_CPU_TENSORS", "false")
    s = Settings(model="m")
    assert (s.engine_options().torch_threads, s.engine_options().count_cpu_tensors) == (3, False)


def test_a_new_engine_option_is_a_setting_of_its_own(monkeypatch):
    from app.settings import engine_settings
    from tests.bart_opt.engine.test_options import WithKvDtype

    class KvDtypeSettings(engine_settings(WithKvDtype)):
        model_config = Settings.model_config

    assert KvDtypeSettings().kv_dtype is None
    monkeypatch.setenv("BART_OPT_KV_DTYPE", "int8")
    assert KvDtypeSettings().kv_dtype == "int8"
    monkeypatch.setenv("BART_OPT_KV_DTYPE", "int4")
    with pytest.raises(ValidationError, match="kv_dtype"):
        KvDtypeSettings()


def test_bart_opt_quantize_reaches_the_model(monkeypatch, demo_checkpoint):
    from app.device.engine import load_summarizer

    monkeypatch.setenv("BART_OPT_QUANTIZE", "int8")
    settings = Settings(model=demo_checkpoint, device="cpu")
    assert settings.quantize == "int8" and load_summarizer(settings).model.quantize == "int8"
    monkeypatch.setenv("BART_OPT_QUANTIZE", "int4")
    with pytest.raises(ValidationError, match="quantize"):
        Settings(model=demo_checkpoint)


@pytest.mark.parametrize("mode", ["static", "el_attention"])
def test_bart_opt_static_and_el_attention_reach_the_model(monkeypatch, demo_checkpoint, mode):
    from app.device.engine import load_summarizer

    variable = f"BART_OPT_{mode.upper()}"
    monkeypatch.delenv(variable, raising=False)
    assert getattr(Settings(model=demo_checkpoint, device="cpu"), mode) is False
    monkeypatch.setenv(variable, "true")
    settings = Settings(model=demo_checkpoint, device="cpu")
    assert getattr(settings, mode) is True and getattr(settings.engine_options(), mode) is True
    assert getattr(load_summarizer(settings).model, mode) is True
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(ValidationError, match=mode):
        Settings(model=demo_checkpoint)


@pytest.mark.parametrize("value, says", [
    ("postgresql:/postgres:secret@127.0.0.1:5432/postgres", "without '//' after the scheme"),
    ("postgres:host/db", "without '//' after the scheme"),
    ("mysql://user:secret@host/db", "unknown database 'mysql'"),
    ("sqlite://", "names no file"),
    ("", "BART_OPT_DB is empty"),
])
def test_a_database_url_that_is_not_one_is_refused_at_start_without_its_password(value, says, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValidationError) as refused:
        Settings(db=value)
    assert says in str(refused.value) and "secret" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # no SQLite file named like the URL


@pytest.mark.parametrize("value, backend", [
    ("./jobs.db", "sqlite"), ("sqlite:////var/lib/bart-opt/jobs.db", "sqlite"),
    ("postgresql://u:p@db.internal:5432/jobs", "postgresql"), ("postgres://u@h/jobs", "postgresql"),
    ("postgresql://u@/jobs?host=/var/run/postgresql", "postgresql"),
])
def test_file_paths_and_database_urls_are_taken(value, backend):
    from app.jobs.database import database_url

    assert Settings(db=value).db == value and database_url(value).get_backend_name() == backend


SERVE_CONFLICTS = [
    ({"BART_OPT_EXACT": "true", "BART_OPT_FAST": "true"}, "BART_OPT_EXACT and BART_OPT_FAST exclude each other: "),
    ({"BART_OPT_EXACT": "true", "BART_OPT_STATIC": "true"}, "BART_OPT_EXACT and BART_OPT_STATIC exclude each other: "),
    ({"BART_OPT_EXACT": "true", "BART_OPT_EL_ATTENTION": "true"},
     "BART_OPT_EXACT and BART_OPT_EL_ATTENTION exclude each other: "),
    ({"BART_OPT_EXACT": "true", "BART_OPT_QUANTIZE": "int8"}, "BART_OPT_EXACT and BART_OPT_QUANTIZE exclude each other: "),
    ({"BART_OPT_QUANTIZE": "int8", "BART_OPT_DEVICE": "cuda"},
     "BART_OPT_QUANTIZE and BART_OPT_DEVICE exclude each other: int8 runs on a CPU only"),
]


SERVE_CONFLICTS_BY_NAMES = [  # the whole sentences of the three the issue shows
    (("BART_OPT_EXACT", "BART_OPT_STATIC"), "BART_OPT_EXACT and BART_OPT_STATIC exclude each other: exact mode gives "
     "every kernel transformers' inputs so that its ids equal transformers' bit for bit, and the static search runs "
     "fixed shapes with another attention layout; turn one of them off"),
    (("BART_OPT_EXACT", "BART_OPT_QUANTIZE"), "BART_OPT_EXACT and BART_OPT_QUANTIZE exclude each other: exact mode "
     "gives every kernel transformers' inputs so that its ids equal transformers' bit for bit, and int8 products "
     "round differently from transformers' float ones; turn one of them off"),
    (("BART_OPT_QUANTIZE", "BART_OPT_DEVICE"), "BART_OPT_QUANTIZE and BART_OPT_DEVICE exclude each other: int8 runs on "
     "a CPU only (torch's int8 dynamic-quantized linear is a CPU kernel); on cuda use dtype float16 or bfloat16 "
     "instead, or device cpu"),
]


@pytest.mark.parametrize(("environment", "sentence"), SERVE_CONFLICTS)
def test_conflicting_engine_settings_make_serve_exit_2_with_one_sentence(environment, sentence, monkeypatch, capsys,
                                                                         tmp_path):
    from bart_opt.cli import main

    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=sentence):
        Settings()
    assert main(["serve", "--model", str(tmp_path / "no-such-checkpoint"), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bart-opt serve: error: {sentence}") and "\n" not in err and "validation error" not in err


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_device_the_machine_lacks_makes_serve_exit_2(device, monkeypatch, capsys, tmp_path):
    import torch

    from bart_opt.cli import main

    if (torch.cuda.is_available() if device == "cuda" else torch.backends.mps.is_available()):
        pytest.skip(f"this machine has {device}")
    monkeypatch.setenv("BART_OPT_DEVICE", device)
    assert main(["serve", "--model", str(tmp_path / "no-such-checkpoint"), "--port", "0"]) == 2
    assert capsys.readouterr().err.strip().startswith(f"bart-opt serve: error: BART_OPT_DEVICE: '{device}' asked for, but")


@pytest.mark.parametrize("environment", [{"BART_OPT_EXACT": "true", "BART_OPT_STATIC": "true"},
                                         {"BART_OPT_EXACT": "true", "BART_OPT_QUANTIZE": "int8"},
                                         {"BART_OPT_QUANTIZE": "int8", "BART_OPT_DEVICE": "cuda"}])
def test_bart_opt_serve_refuses_a_combination_before_the_weights_are_read(environment, unreadable_checkpoint,
                                                                           tmp_path):
    import os
    import subprocess
    import sys

    sentence = dict(SERVE_CONFLICTS_BY_NAMES)[tuple(environment)]
    env = {**os.environ, **environment, "BART_OPT_DB": str(tmp_path / "jobs.db")}
    run = subprocess.run([sys.executable, "-m", "bart_opt.cli", "serve", "--model", unreadable_checkpoint, "--port",
                          "0"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [f"bart-opt serve: error: {sentence}"]  # not the damaged model.safetensors
    assert not (tmp_path / "jobs.db").exists()


def test_bart_opt_serve_with_exact_and_fast_exits_2_before_loading_anything(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "BART_OPT_EXACT": "true", "BART_OPT_FAST": "true", "BART_OPT_DB": str(tmp_path / "jobs.db")}
    run = subprocess.run([sys.executable, "-m", "bart_opt.cli", "serve", "--model", str(tmp_path / "none"), "--port",
                          "0"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bart-opt serve: error: BART_OPT_EXACT and BART_OPT_FAST exclude")
    assert not (tmp_path / "jobs.db").exists()  # nothing started: no database, no model


# ---- the settings derived from the components' fields -------------------------------------

_SAMPLE = {int: 3, float: 2.5, str: "auto"}


def _sample(component: type, f) -> object:
    hint = typing.get_type_hints(component)[f.name]
    return next(value for kind, value in _SAMPLE.items() if kind is hint or kind in typing.get_args(hint))


def test_each_ray_option_is_one_field_that_is_its_flag_its_setting_and_its_env_var(monkeypatch):
    from bart_opt import cluster
    from bart_opt.cli import build_parser

    base = ["evaluate", "--model", "m", "--data", "d.jsonl", "--out", "o", "--ray", "auto"]
    parser = build_parser()
    flags, settings = [], []
    for f in dataclasses.fields(ClusterOptions):
        value = _sample(ClusterOptions, f)
        flag, setting = f.metadata["flag"], f.metadata["setting"]
        if flag is not None:
            flags.append(flag)
            args = base + ([] if f.name == "address" else [flag, str(value)])
            assert getattr(cluster.from_cli_args(parser.parse_args(args)), f.name) == value, flag
        if setting is not None:
            settings.append(setting)
            assert Settings.model_fields[setting].default == (None if f.metadata["switch"] else f.default)
            assert Settings.model_fields[setting].description.lower().startswith(f.metadata["help"][:20].lower())
            with monkeypatch.context() as env:
                env.setenv("BART_OPT_RAY_ADDRESS", "auto")
                env.setenv(setting_name(setting), str(value))
                assert getattr(Settings().cluster_options(), f.name) == value, setting
    assert flags == ["--ray", "--replicas", "--gpus-per-replica", "--threads-per-replica"]
    assert settings == ["ray_address", "ray_replicas", "ray_gpus_per_replica", "ray_threads_per_replica",
                        "ray_start_timeout_s", "ray_stall_timeout_s"]
    assert cluster.from_cli_args(parser.parse_args(base[:-2])) is None and Settings().cluster_options() is None
    assert cluster.from_cli_args(parser.parse_args(base[:-1])).address == "local"  # a bare --ray


@pytest.mark.parametrize(("setting", "value", "field"), [("ray_replicas", "0", "replicas"),
                                                        ("ray_gpus_per_replica", "-1", "gpus_per_replica"),
                                                        ("ray_gpus_per_replica", "inf", "gpus_per_replica"),
                                                        ("ray_stall_timeout_s", "0", "stall_timeout_s")])
def test_a_ray_setting_out_of_its_field_bounds_is_refused_as_the_options_refuse_it(monkeypatch, setting, value, field):
    monkeypatch.setenv(setting_name(setting), value)
    with pytest.raises(ValidationError, match=setting):
        Settings(ray_address="auto")
    with pytest.raises(InvalidRequest) as caught:
        ClusterOptions(**{field: float(value)})
    assert caught.value.field == field


def test_the_jobs_components_are_built_from_their_settings_with_the_defaults_they_own(monkeypatch):
    config = Settings().jobs_config()
    for name, component in COMPONENTS.items():
        built = getattr(config, name)
        assert built == component()  # the component's defaults are the settings' defaults
        for setting, f in settings_of(component).items():
            value = _sample(component, f)
            with monkeypatch.context() as env:
                env.setenv(setting_name(setting), str(value))
                assert getattr(getattr(Settings().jobs_config(), name), f.name) == value, setting
    assert {f.name for f in dataclasses.fields(JobsConfig)} - {*COMPONENTS, "engine", "cluster", "rouge"} <= set(
        Settings.model_fields)
    monkeypatch.setenv("BART_OPT_ROUGE_LANG", "de")
    monkeypatch.setenv("BART_OPT_ROUGE_TOKENIZER", "unicode")
    assert Settings().jobs_config().rouge_settings(lang="fr") == RougeSettings(tokenizer="unicode", lang="fr")


@pytest.mark.parametrize("value, expected", [("", None), ("  ", None), ("http://mlflow:5000", "http://mlflow:5000")])
def test_bart_opt_mlflow_uri_is_the_tracking_uri_of_jobs(value, expected, monkeypatch):
    monkeypatch.setenv("BART_OPT_MLFLOW_URI", value)
    assert Settings().mlflow_uri == expected


def test_bart_opt_mlflow_uri_without_mlflow_is_refused_at_start(monkeypatch):
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "mlflow" else found(name, *rest))
    with pytest.raises(ValidationError) as refused:
        Settings(mlflow_uri="http://ops:pw@mlflow:5000")
    assert "BART_OPT_MLFLOW_URI needs MLflow: pip install 'bart-opt[tracking]'" in str(refused.value)
    assert "pw@" not in str(refused.value)


def test_metrics_setting_is_checked_when_read(monkeypatch):
    monkeypatch.setenv("BART_OPT_METRICS", "rouge,length")
    assert Settings().metrics == "rouge,length"
    assert Settings().metric_settings(Settings().rouge_settings()).metrics == ("rouge", "length")
    monkeypatch.setenv("BART_OPT_METRICS", "rouge,bleu")
    with pytest.raises(ValidationError, match="BART_OPT_METRICS: unknown metric 'bleu'"):
        Settings()
    monkeypatch.setenv("BART_OPT_METRICS", "bertscore")
    with pytest.raises(ValidationError, match="BART_OPT_BERTSCORE_MODEL"):
        Settings()
    monkeypatch.delenv("BART_OPT_METRICS")
    assert Settings().metrics == "rouge,extractive,length"
