"""The bart-opt command line, through `main([...])` and one real subprocess."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import bart_opt
from bart_opt.cli import main
from bart_opt.pipeline.baselines import lead_3
from bart_opt.pipeline.data import load_records
from bart_opt.demo import random_article
from bart_opt.demo.trained import MODEL_FILES, packaged_model_dir
from bart_opt.pipeline.rouge import RougeScorer
from bart_opt.pipeline.summarizer import Summarizer

REPO = Path(__file__).resolve().parents[2]
GEN = ["--max-length", "12", "--min-length", "3", "--num-beams", "2"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rng = random.Random(5)
    return [random_article(rng, n) for n in (2, 7, 1, 4)]


def test_summarize_file_prints_jsonl_in_input_order(demo_checkpoint, texts, tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    assert main(["summarize", "--model", demo_checkpoint, str(path), *GEN]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = Summarizer.from_pretrained(demo_checkpoint, count_cpu_tensors=False).summarize(
        texts, max_length=12, min_length=3, num_beams=2)
    assert [row["id"] for row in out] == ["t0", "t1", "t2", "t3"]
    assert [row["summary"] for row in out] == expected.summaries
    assert [row["input_tokens"] for row in out] == [item["input_tokens"] for item in expected.items]


def test_exact_flag_loads_the_model_in_exact_mode(demo_checkpoint):
    from bart_opt.cli import build_parser, load_summarizer

    for flags, exact in (([], False), (["--exact"], True)):
        args = build_parser().parse_args(["summarize", "--model", demo_checkpoint, "--device", "cpu", *flags])
        assert load_summarizer(args).model.exact is exact


@pytest.mark.parametrize("mode", ["static", "el_attention"])
def test_static_and_el_attention_flags_load_the_model_in_that_mode(demo_checkpoint, texts, tmp_path, capsys, mode):
    from bart_opt.cli import build_parser, load_summarizer

    flag = "--" + mode.replace("_", "-")
    for command in (["summarize"], ["evaluate", "--data", "x.jsonl", "--out", "o"]):
        for flags, on in (([], False), ([flag], True), ([flag, "--fast"], True)):
            args = build_parser().parse_args([*command, "--model", demo_checkpoint, "--device", "cpu", *flags])
            assert getattr(load_summarizer(args).model, mode) is on
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    assert main(["summarize", "--model", demo_checkpoint, "--device", "cpu", flag, str(data), *GEN]) == 0
    out = [json.loads(line)["summary"] for line in capsys.readouterr().out.splitlines()]
    alone = Summarizer.from_pretrained(demo_checkpoint, device="cpu", **{mode: True})
    assert out == alone.summarize(texts, max_length=12, min_length=3, num_beams=2).summaries
    assert main(["summarize", "--model", demo_checkpoint, flag, "--exact", str(data)]) == 2
    assert f"--exact and {flag} exclude each other" in capsys.readouterr().err


def test_fast_flag_loads_the_model_in_fast_mode_and_excludes_exact(demo_checkpoint, capsys):
    from bart_opt.cli import build_parser, load_summarizer

    args = build_parser().parse_args(["evaluate", "--model", demo_checkpoint, "--data", "x.jsonl", "--out", "o", "--fast"])
    model = load_summarizer(args).model
    assert model.fast is True and model.exact is False
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["summarize", "--model", demo_checkpoint, "--fast", "--exact"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_summarize_reads_stdin(demo_checkpoint, texts, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"text": texts[0]}) + "\n\n"))
    assert main(["summarize", "--model", demo_checkpoint, "-", *GEN]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert set(row) == {"summary", "input_tokens", "truncated", "output_tokens"} and row["summary"]


def test_evaluate_writes_metrics_and_resumes(demo_checkpoint, tmp_path, capsys):
    rng = random.Random(6)
    data = tmp_path / "cnn.jsonl"
    data.write_text("".join(
        json.dumps({"id": str(i), "article": random_article(rng, 3), "highlights": random_article(rng, 1)}) + "\n"
        for i in range(5)
    ))
    out = tmp_path / "run"
    args = ["evaluate", "--model", demo_checkpoint, "--data", str(data), "--out", str(out), *GEN, "--no-progress",
            "--no-memory-count", "--device", "cpu"]
    assert main([*args, "--limit", "3"]) == 0
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()
    assert main(args) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert json.loads(capsys.readouterr().out) == metrics
    assert metrics["n_obs"] == 5 and metrics["resumed_from"] == 3
    assert metrics["rouge"]["rouge1"]["mid"]["fmeasure"] >= 0
    assert metrics["generation"]["num_beams"] == 2
    assert metrics["memory"]["peak_source"] == "none"
    ids = [json.loads(line)["id"] for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(ids) == ["0", "1", "2", "3", "4"]


def test_evaluate_refuses_to_resume_on_another_dataset_until_overwrite(demo_checkpoint, tmp_path, capsys):
    """A.jsonl then B.jsonl with the same ids into one --out: refused, A's predictions untouched."""
    rng = random.Random(8)
    for name in ("A", "B"):
        rows = [{"id": str(i), "article": random_article(rng, 2), "highlights": "A summary."} for i in range(2)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "runs" / "x"
    args = ["evaluate", "--model", demo_checkpoint, "--out", str(out), *GEN, "--no-progress", "--no-memory-count"]
    assert main([*args, "--data", str(tmp_path / "A.jsonl")]) == 0
    a_lines = (out / "predictions.jsonl").read_text()
    capsys.readouterr()

    assert main([*args, "--data", str(tmp_path / "B.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "holds a run on another dataset" in err and "A.jsonl, 2 records" in err and "--overwrite" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (out / "predictions.jsonl").read_text() == a_lines

    assert main([*args, "--data", str(tmp_path / "B.jsonl"), "--overwrite"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    b_texts = {row["id"]: row["highlights"] for row in map(json.loads, (tmp_path / "B.jsonl").open())}
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert metrics["resumed_from"] == 0 and {row["id"]: row["reference"] for row in rows} == b_texts
    assert json.loads((out / "run.json").read_text())["dataset"]["source"] == str(tmp_path / "B.jsonl")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["evaluate", "--data", "{missing}", "--out", "{tmp}/o"], "no such file"),
        (["evaluate", "--data", "{data}", "--out", "{tmp}/o", "--text-column", "body"],
         "text column 'body' not found"),
        (["summarize", "{missing}"], "no such file"),
        (["summarize", "{bad_json}"], "line 2: not valid JSON"),
        (["summarize", "{data}"], "no 'text' field (found: article, id)"),
        (["summarize", "{data}", "--text-column", "article", "--early-stopping", "never", "--num-beams", "0"],
         "--num-beams: must be >= 1, got 0"),
        (["summarize", "{data}", "--text-column", "article", "--max-length", "3"],
         "--max-length: min_length 8 is above max_length 3"),
        (["summarize", "{data}", "--text-column", "article", "--dtype", "int8"], "dtype 'int8' is not supported"),
        (["summarize", "{data}", "--text-column", "article", "--device", "cuda:0"]
         if not torch.cuda.is_available() else ["summarize", "{missing}"],
         "CUDA is not available" if not torch.cuda.is_available() else "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, demo_checkpoint, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "article": "Some words here."}) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    paths = {"missing": str(tmp_path / "nope.jsonl"), "tmp": str(tmp_path), "data": str(data), "bad_json": str(bad)}
    argv = [arg.format(**paths) for arg in argv]
    assert main([argv[0], "--model", demo_checkpoint, *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_unknown_model_is_a_clear_error(tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"text": "a b c"}) + "\n")
    assert main(["summarize", "--model", str(tmp_path / "no-such-model"), str(data)]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and err.count("\n") == 1


def test_bench_gets_the_rest_of_the_command_line(monkeypatch):
    seen = []
    fake = types.ModuleType("bart_opt.bench")
    fake.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "bart_opt.bench", fake)
    monkeypatch.setattr(bart_opt, "bench", fake, raising=False)
    assert main(["bench", "--size", "tiny", "--json", "x.json"]) == 0
    assert seen == [["--size", "tiny", "--json", "x.json"]]


def test_serve_hands_its_options_to_the_service(monkeypatch):
    seen = {}
    fake = types.ModuleType("app.server")
    fake.serve = lambda **kwargs: seen.update(kwargs)
    monkeypatch.setitem(sys.modules, "app.server", fake)
    assert main(["serve", "--model", "some/model", "--host", "0.0.0.0", "--port", "9001"]) == 0
    assert seen == {"model": "some/model", "host": "0.0.0.0", "port": 9001}


def test_serve_without_the_serve_extra_names_it_in_one_line(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else real(name, *a))
    monkeypatch.setitem(sys.modules, "app.server", None)  # an import of the service would raise
    assert main(["serve"]) == 2
    assert capsys.readouterr().err == ("bart-opt serve: error: the service needs fastapi, which this installation "
                                       "lacks: pip install 'bart-opt[serve]'\n")


def run_cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -X importtime -m bart_opt.cli ...` offline; -X importtime lists every import on stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "bart_opt.cli", *argv],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_demo_model_copies_the_trained_checkpoint_offline_without_importing_fastapi(tmp_path):
    proc = run_cli("demo-model", str(tmp_path / "demo"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trained demo BART" in proc.stdout and "meaningless" not in proc.stdout
    written = {p.name: p.read_bytes() for p in (tmp_path / "demo").iterdir()}
    packaged = packaged_model_dir()
    assert {name: written[name] for name in MODEL_FILES} == {name: (packaged / name).read_bytes() for name in MODEL_FILES}
    assert set(written) == {*MODEL_FILES, "sample.jsonl"}
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "bart_opt.demo" in imported
    assert not [name for name in imported if name.split(".")[0] in ("fastapi", "app")]


def test_demo_model_random_writes_a_random_checkpoint(tmp_path):
    proc = run_cli("demo-model", str(tmp_path / "demo"), "--random", "--seed", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "random demo BART" in proc.stdout and "meaningless" in proc.stdout
    config = json.loads((tmp_path / "demo" / "config.json").read_text())
    assert config["d_model"] == 32 and config["encoder_layers"] == 2
    assert (tmp_path / "demo" / "model.safetensors").read_bytes() != (packaged_model_dir() / "model.safetensors").read_bytes()
    sample = (tmp_path / "demo" / "sample.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in sample] == [f"sample-3-{i:05d}" for i in range(24)]


def test_ctrl_c_during_evaluate_says_how_to_resume(demo_checkpoint, tmp_path, monkeypatch, capsys):
    import bart_opt.evaluate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bart_opt.evaluate, "run_evaluation", interrupted)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "article": "Some words here.", "highlights": "Words."}) + "\n")
    argv = ["evaluate", "--model", demo_checkpoint, "--data", str(data), "--out", str(tmp_path / "o")]
    assert main(argv) == 130
    assert "interrupted; rerun the same command to resume" in capsys.readouterr().err


def test_readme_main_job_evaluates_the_demo_sample_beside_lead_3(tmp_path, capsys):
    """The README's first command: demo-model, then evaluate its sample records with the lead-3 baseline."""
    demo = tmp_path / "demo-model"
    assert main(["demo-model", str(demo)]) == 0
    out = tmp_path / "runs"
    argv = ["evaluate", "--model", str(demo), "--data", str(demo / "sample.jsonl"), "--out", str(out),
            "--limit", "6", "--no-progress", "--baselines", "lead-3"]
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr()
    metrics = json.loads((out / "metrics.json").read_text())
    assert json.loads(printed.out) == metrics
    assert metrics["n_obs"] == 6 and metrics["rouge"]["rouge1"]["mid"]["fmeasure"] > 30
    summaries = [json.loads(line)["prediction"] for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(set(summaries)) == 6, "the demo model's summaries should depend on the text"
    # The baseline beside the model: same records, same scorer, same bootstrap.
    records = load_records(file=demo / "sample.jsonl", limit=6)
    scorer = RougeScorer()
    by_hand = scorer.aggregate([scorer.score(lead_3(r.text), r.reference) for r in records])
    assert metrics["baselines"]["lead-3"]["rouge"] == by_hand
    lines = printed.err.splitlines()
    (model_line,) = [line for line in lines if line.strip().startswith(str(demo))]
    (lead_line,) = [line for line in lines if line.strip().startswith("lead-3")]
    mid = f"{by_hand['rouge1']['mid']['fmeasure']:5.2f}"
    low, high = (f"{by_hand['rouge1'][k]['fmeasure']:.2f}" for k in ("low", "high"))
    assert f"R1 {mid} [{low}-{high}]" in lead_line and "RLsum" in model_line


def test_evaluate_lead_3_writes_a_run_folder_without_a_checkpoint(tmp_path, capsys, monkeypatch):
    import bart_opt.cli

    monkeypatch.setattr(bart_opt.cli, "load_summarizer", lambda args: pytest.fail("lead-3 needs no model"))
    rng = random.Random(7)
    data = tmp_path / "cnn.jsonl"
    rows = [{"id": str(i), "article": random_article(rng, 5), "highlights": random_article(rng, 2)} for i in range(4)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "lead"
    assert main(["evaluate", "--model", "lead-3", "--data", str(data), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    metrics = json.loads((out / "metrics.json").read_text())
    assert json.loads(printed.out) == metrics
    assert (metrics["model"], metrics["baseline"], metrics["n_obs"], metrics["n_scored"]) == ("lead-3", True, 4, 4)
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["prediction"] for p in predictions] == [lead_3(row["article"]) for row in rows]
    scorer = RougeScorer()
    assert metrics["rouge"] == scorer.aggregate([scorer.score(lead_3(r["article"]), r["highlights"]) for r in rows])
    run = json.loads((out / "run.json").read_text())
    assert (run["model"], run["generation"], run["baseline"]) == ("lead-3", None, True)
    assert (run["dataset"]["source"], run["dataset"]["records"]) == (str(data), 4)
    assert "lead-3  R1" in printed.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "lead-3", "--num-beams", "4"], "lead-3 is a baseline: generation options (--num-beams)"),
        (["--model", "lead-3", "--baselines", "lead-3"], "lead-3 is a baseline itself"),
        (["--model", "{ckpt}", "--baselines", "lead-3,lead-9"], "unknown baseline 'lead-9'; available: lead-3"),
    ],
)
def test_baseline_mistakes_are_one_line_and_exit_2(argv, message, demo_checkpoint, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "article": "Some words here.", "highlights": "Words."}) + "\n")
    argv = [arg.format(ckpt=demo_checkpoint) for arg in argv]
    assert main(["evaluate", *argv, "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_summarize_with_lead_3(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "x", "text": "One. Two. Three. Four."}) + "\n")
    assert main(["summarize", "--model", "lead-3", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"id": "x", "summary": "One.\nTwo.\nThree."}


def test_text_column_is_one_spelling_and_the_old_text_field_is_warned(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "x", "article": "One. Two. Three. Four."}) + "\n")
    assert main(["summarize", "--model", "lead-3", "--text-column", "article", str(path)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["summarize", "--model", "lead-3", "--text-field", "article", str(path)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["summary"] == "One.\nTwo.\nThree."
    assert captured.err == "bart-opt: warning: --text-field is now --text-column; the old spelling still works\n"
    assert main(["summarize", "--model", "lead-3", str(path)]) == 2
    assert "no 'text' field (found: article, id); pick one with --text-column" in capsys.readouterr().err


def test_quantize_flag_loads_the_int8_model_on_summarize_and_evaluate(demo_checkpoint, tmp_path, capsys):
    from bart_opt.cli import build_parser, load_summarizer

    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"text": "A text."}) + "\n")
    for command in (["summarize"], ["evaluate", "--data", "x.jsonl", "--out", "o"]):
        args = build_parser().parse_args([*command, "--model", demo_checkpoint, "--device", "cpu", "--quantize", "int8"])
        assert load_summarizer(args).model.quantize == "int8"
    assert main(["summarize", "--model", demo_checkpoint, "--quantize", "int8", "--exact", str(data)]) == 2
    assert "exclude each other" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "named"), [
    (["--exact", "--static"], "--exact and --static"), (["--exact", "--el-attention"], "--exact and --el-attention"),
    (["--exact", "--quantize", "int8"], "--exact and --quantize"),
    (["--quantize", "int8", "--device", "cuda"], "--quantize and --device"),
    (["--quantize", "int8", "--device", "mps"], "--quantize and --device"),
])
def test_engine_flags_that_exclude_each_other_exit_2_before_any_record_or_weight_is_read(flags, named, tmp_path, capsys):
    missing = str(tmp_path / "no-such-checkpoint")
    for command in (["evaluate", "--data", str(tmp_path / "no-such.jsonl"), "--out", str(tmp_path / "o")],
                    ["summarize", str(tmp_path / "no-such.jsonl")]):
        assert main([*command, "--model", missing, *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"bart-opt {command[0]}: error: {named} exclude each other: ") and "\n" not in err
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("flags", "sentence"), [
    (["--exact", "--quantize", "int8"], "--exact and --quantize exclude each other: exact mode gives every kernel "
     "transformers' inputs so that its ids equal transformers' bit for bit, and int8 products round differently "
     "from transformers' float ones; turn one of them off"),
    (["--quantize", "int8", "--device", "cuda"], "--quantize and --device exclude each other: int8 runs on a CPU only "
     "(torch's int8 dynamic-quantized linear is a CPU kernel); on cuda use dtype float16 or bfloat16 instead, or "
     "device cpu"),
])
def test_a_refused_combination_comes_before_the_weights_are_read(flags, sentence, unreadable_checkpoint, tmp_path,
                                                                  capsys):
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"text": "A text."}) + "\n")
    assert main(["summarize", "--model", unreadable_checkpoint, str(data)]) == 2  # loading it fails on the weights
    assert "model.safetensors is damaged" in capsys.readouterr().err
    for command in (["summarize", str(data)], ["evaluate", "--data", str(data), "--out", str(tmp_path / "o")]):
        assert main([*command, "--model", unreadable_checkpoint, *flags]) == 2
        assert capsys.readouterr().err == f"bart-opt {command[0]}: error: {sentence}\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_device_this_machine_lacks_exits_2_before_any_record_is_read(tmp_path, capsys):
    assert main(["evaluate", "--model", "m", "--device", "cuda", "--data", str(tmp_path / "x.jsonl"),
                 "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == (
        "bart-opt evaluate: error: --device: 'cuda' asked for, but CUDA is not available here; use 'cpu'")


# ---- --format on evaluate, score and compare ------------------------------------------------------


@pytest.fixture(scope="module")
def lead_run(tmp_path_factory) -> Path:
    """A lead-3 run folder (5 random records) and, beside it, its rows as another system's predictions file."""
    rng = random.Random(11)
    root = tmp_path_factory.mktemp("formats")
    rows = [{"id": str(i), "article": random_article(rng, 5), "highlights": random_article(rng, 2)} for i in range(5)]
    (root / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["evaluate", "--model", "lead-3", "--data", str(root / "data.jsonl"), "--out", str(root / "lead")]) == 0
    return root / "lead"


def test_the_formats_match_the_table_module():
    from bart_opt.report.tables import FORMATS

    assert bart_opt.cli.FORMATS == FORMATS


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "csv", "latex"])
def test_evaluate_and_score_print_the_format_asked_on_stdout_only(lead_run, tmp_path, capsys, fmt):
    data = lead_run.parent / "data.jsonl"
    assert main(["evaluate", "--model", "lead-3", "--data", str(data), "--out", str(tmp_path / "e"),
                 "--format", fmt]) == 0
    evaluated = capsys.readouterr()
    # Without the extractive metric: a predictions file has no sources, and CSV prints that warning on stderr.
    assert main(["score", str(lead_run / "predictions.jsonl"), "--out", str(tmp_path / "s"), "--format", fmt,
                 "--metrics", "rouge,length"]) == 0
    scored = capsys.readouterr()
    assert evaluated.err == scored.err == ""  # no ROUGE lines on stderr once a format is asked for
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    mid = f"{metrics['rouge']['rouge1']['mid']['fmeasure']:.2f}"
    if fmt == "json":
        assert json.loads(evaluated.out) == metrics
        assert json.loads(scored.out) == json.loads((tmp_path / "s" / "metrics.json").read_text())
    elif fmt == "csv":
        import csv

        (row,) = csv.DictReader(io.StringIO(evaluated.out))
        assert (row["system"], float(row["rouge1"])) == ("lead-3", metrics["rouge"]["rouge1"]["mid"]["fmeasure"])
        assert row["signature"] == metrics["signature"]
    else:
        assert f"{mid} [" in evaluated.out and f"{mid} [" in scored.out
        assert f"signature lead-3: {'`' if fmt == 'markdown' else ''}{metrics['signature']}" in evaluated.out
        assert ("\\begin{tabular}" in evaluated.out) == (fmt == "latex")
        assert evaluated.out.startswith("| system") == (fmt == "markdown")


def test_compare_prints_its_significance_table_in_each_format(lead_run, tmp_path, capsys):
    assert main(["score", str(lead_run / "predictions.jsonl"), "--out", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    runs = [str(lead_run), str(tmp_path / "again")]
    assert main(["compare", *runs, "--resamples", "50", "--json"]) == 0
    as_json = capsys.readouterr().out
    assert main(["compare", *runs, "--resamples", "50", "--format", "json"]) == 0
    assert capsys.readouterr().out == as_json  # --json is --format json
    for fmt, marker in (("text", "rougeLsum"), ("markdown", "| again | lead "), ("csv", "again,lead,rouge1,"),
                        ("latex", "\\begin{tabular}")):
        assert main(["compare", *runs, "--resamples", "50", "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert marker in out
        assert ("+0.00 [+0.00, +0.00]" in out) == (fmt != "csv")  # the same predictions: no difference
    with pytest.raises(SystemExit) as stopped:  # argparse's own usage error
        main(["compare", *runs, "--json", "--format", "csv"])
    assert stopped.value.code == 2 and "not allowed with argument --json" in capsys.readouterr().err


def test_metrics_flags_choose_the_metrics_and_bad_ones_are_one_line(tmp_path, capsys):
    rng = random.Random(9)
    data = tmp_path / "cnn.jsonl"
    rows = [{"id": str(i), "article": random_article(rng, 5), "highlights": random_article(rng, 2)} for i in range(3)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["evaluate", "--model", "lead-3", "--data", str(data), "--out", str(tmp_path / "a"),
                 "--metrics", "length"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["metrics"] == ["rouge", "length"] and "extractive" not in metrics
    assert metrics["length"]["sentences"]["mid"] == 3.0  # lead-3: three sentences
    for flags, says in ((["--metrics", "rouge,bleu"], "--metrics: unknown metric 'bleu'"),
                        (["--metrics", "length,length"], "--metrics: length given more than once"),
                        (["--metrics", "rouge,bertscore"], "--bertscore-model: the metric bertscore needs a model"),
                        (["--metrics", "consistency"], "--consistency-model: the metric consistency needs a model")):
        assert main(["evaluate", "--model", "lead-3", "--data", str(data), "--out", str(tmp_path / "b"), *flags]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "b").exists()
    predictions = tmp_path / "a" / "predictions.jsonl"
    assert main(["score", str(predictions), "--out", str(tmp_path / "scored"), "--metrics", "rouge,extractive"]) == 0
    printed = capsys.readouterr()
    assert set(json.loads(printed.out)["extractive"]) == {"repeated_trigrams"}
    assert "warning: extractive: compression, coverage" in printed.err  # no source text in a predictions file
