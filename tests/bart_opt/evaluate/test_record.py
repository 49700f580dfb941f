"""The run record: run.json holds the engine as resolved, the ROUGE settings, the versions, the processor,
the start and the signature; a resume that differs in anything that can change a prediction or a score
is refused (exit 2) naming each field; versions that changed are recorded and warned of."""

from __future__ import annotations

import json
import random

import pytest

from bart_opt.cli import main
from bart_opt.demo import random_article
from bart_opt.evaluate.record import ResumeRefused, check_resume, engine_key, signature

GEN = ["--max-length", "12", "--min-length", "3", "--num-beams", "1"]


@pytest.fixture
def data(tmp_path):
    rng = random.Random(36)
    path = tmp_path / "cnn.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "article": random_article(rng, 3), "highlights": "A summary."})
                            + "\n" for i in range(4)))
    return path


def evaluate(model, data, out, *extra):
    return main(["evaluate", "--model", str(model), "--data", str(data), "--out", str(out), *GEN, "--no-progress",
                 "--no-memory-count", "--device", "cpu", "--limit", "2", *extra])


@pytest.fixture
def first_run(demo_checkpoint, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("record") / "run"
    assert evaluate(demo_checkpoint, data, out) == 0
    return out


def test_run_json_holds_the_whole_record_and_metrics_the_same_signature(first_run):
    run = json.loads((first_run / "run.json").read_text())
    metrics = json.loads((first_run / "metrics.json").read_text())
    assert run["system"] == "bart"
    assert run["engine"] == {"dtype": "float32", "mode": "default", "static": False, "el_attention": False,
                             "quantize": None, "device": "cpu", "max_batch_tokens": 32768, "max_batch_size": 64}
    assert run["rouge_settings"]["tokenizer"] == "default" and run["rouge_settings"]["stemmer"] == "porter"
    assert run["rouge_settings"]["point"] == "mean" and run["rouge_settings"]["bootstrap_samples"] == 1000
    assert set(run["versions"]) >= {"bart_opt", "torch", "transformers", "rouge"}
    assert run["processor"]["cpu"]  # the ISA key: AVX2, AVX512, ...
    assert run["started_at"].endswith("Z")
    assert run["signature"] == metrics["signature"]  # one reference each: nrefs:1 in both
    assert "tok:default" in run["signature"] and "quantize:none" in run["signature"] and "dtype:float32" in run["signature"]
    assert metrics["rouge_settings"] == run["rouge_settings"]


@pytest.mark.parametrize(("flags", "field"), [
    (["--dtype", "bfloat16"], "dtype"),
    (["--exact"], "mode"),
    (["--static"], "static"),
    (["--el-attention"], "el_attention"),
    (["--quantize", "int8"], "quantize"),
    (["--rouge-tokenizer", "unicode"], "rouge.tokenizer"),
    (["--num-beams", "2"], "num_beams"),
], ids=["dtype", "mode", "static", "el_attention", "quantize", "rouge", "generation"])
def test_a_resume_with_another_engine_or_scoring_is_refused_naming_the_field(first_run, demo_checkpoint, data, flags,
                                                                             field, capsys, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("run.json", "predictions.jsonl", "metrics.json"):
        (out / name).write_bytes((first_run / name).read_bytes())
    before = (out / "predictions.jsonl").read_bytes()
    capsys.readouterr()
    assert evaluate(demo_checkpoint, data, out, "--limit", "3", *flags) == 2  # the later --num-beams wins
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("bart-opt evaluate: error:") and f"{field}: " in err and "--overwrite" in err, err
    assert (out / "predictions.jsonl").read_bytes() == before  # nothing was run


def test_overwrite_is_the_way_out(first_run, demo_checkpoint, data, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("run.json", "predictions.jsonl"):
        (out / name).write_bytes((first_run / name).read_bytes())
    assert evaluate(demo_checkpoint, data, out, "--quantize", "int8", "--overwrite") == 0
    assert json.loads((out / "run.json").read_text())["engine"]["quantize"] == "int8"


def test_versions_that_changed_are_recorded_and_warned(first_run, demo_checkpoint, data, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    run = json.loads((first_run / "run.json").read_text())
    run["versions"]["torch"] = "2.0.0"
    (out / "run.json").write_text(json.dumps(run))
    (out / "predictions.jsonl").write_bytes((first_run / "predictions.jsonl").read_bytes())
    capsys.readouterr()
    assert evaluate(demo_checkpoint, data, out, "--limit", "3") == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert metrics["resumed_from"] == 2
    assert any("torch 2.0.0 then" in warning for warning in metrics["warnings"]), metrics["warnings"]
    assert "warning: " in captured.err and "torch 2.0.0 then" in captured.err
    history = json.loads((out / "run.json").read_text())["history"]
    assert history[-1]["versions"]["torch"] == "2.0.0"


def test_every_differing_field_is_named_in_one_refusal():
    earlier = {"model": "m", "engine": {"dtype": "float32", "mode": "default", "static": False, "el_attention": False,
                                        "quantize": None, "device": "cpu"},
               "generation": {"num_beams": 4}, "rouge_settings": {"tokenizer": "default", "lang": "en"}}
    current = {**earlier, "engine": {**earlier["engine"], "quantize": "int8", "mode": "fast"},
               "rouge_settings": {"tokenizer": "unicode", "lang": "ru"}}
    with pytest.raises(ResumeRefused) as refused:
        check_resume("runs/x", earlier, current)
    assert refused.value.fields == ["mode", "quantize", "rouge.tokenizer", "rouge.lang"]
    assert "\n" not in str(refused.value)


def test_the_signature_names_the_engine_and_the_scoring():
    record = {"system": "bart", "fingerprint": "sha256:" + "ab" * 32, "rouge_settings": {"tokenizer": "script",
              "lang": "zh"}, "engine": {"dtype": "bfloat16", "mode": "fast", "static": True, "el_attention": False,
                                        "quantize": "int8", "device": "cpu"}, "processor": {"cpu": "AVX2"}}
    text = signature(record, nrefs="1-3")
    assert text.startswith("nrefs:1-3|rouge:1,2,L,Lsum|tok:script|lang:zh|stem:none|split:punkt+marks|point:mean|")
    assert ("system:bart|model:abababababab|dtype:bfloat16|mode:fast|static:yes|el_attention:no|quantize:int8|"
            "device:cpu|cpu:AVX2") in text
    assert engine_key(record["engine"]) == "dtype:bfloat16|mode:fast|static:yes|el_attention:no|quantize:int8|device:cpu"
