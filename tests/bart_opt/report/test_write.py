"""``bart-opt report RUN... --out DIR`` end to end: the files, their links, the same bytes twice, and bad inputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from huggingface_hub.repocard_data import model_index_to_eval_results

from bart_opt.cli import main
from bart_opt.report.runs import load_report_runs
from bart_opt.report.write import report_systems
from tests.bart_opt.report.test_plots import check_plot

REPO = Path(__file__).resolve().parents[3]


def test_a_report_on_two_runs_writes_its_summary_plots_and_model_index(report_runs, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(report_runs["lead"]), str(report_runs["model"]), "--out", str(out),
                 "--resamples", "200"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == [str(out / "report.md"), str(out / "model-index.yaml")]
    pngs = sorted(path for path in out.iterdir() if path.suffix == ".png")
    assert {path.stem for path in pngs} == {"scores-rouge", "length-rouge", "forest", "batches"}
    for path in pngs:
        check_plot(path)
    text = (out / "report.md").read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert sorted(links) == sorted(path.name for path in pngs)  # every plot shown, by a link relative to report.md
    assert all((out / link).is_file() for link in links)
    assert "| lead " in text and "| model " in text and "| lead-3 " in text
    assert "signature model: `nrefs:1|rouge:1,2,L,Lsum|" in text
    assert "## Paired differences" in text and "| model | lead | rougeLsum |" in re.sub(" +", " ", text)
    name, results = model_index_to_eval_results(yaml.safe_load((out / "model-index.yaml").read_text())["model-index"])
    assert name == Path(load_report_runs([report_runs["model"]])[0].metrics["model"]).name
    assert [r.metric_config for r in results] == ["rouge1", "rouge2", "rougeL", "rougeLsum"]


def test_the_same_runs_give_the_same_bytes(report_runs, tmp_path):
    folders = [str(report_runs["lead"]), str(report_runs["model"])]
    for name in ("a", "b"):
        assert main(["report", *folders, "--out", str(tmp_path / name), "--resamples", "100"]) == 0
    files = sorted(path.name for path in (tmp_path / "a").iterdir())
    assert len(files) == 10
    assert [(tmp_path / "a" / f).read_bytes() for f in files] == [(tmp_path / "b" / f).read_bytes() for f in files]


def test_a_baseline_scored_beside_a_run_and_in_its_own_run_is_shown_once(report_runs):
    runs = load_report_runs([report_runs["model"], report_runs["lead"]])
    assert [name for name, _ in report_systems(runs)] == ["model", "lead"]  # lead's own run: the same lead-3
    runs = load_report_runs([report_runs["model"], report_runs["other"]])
    assert [name for name, _ in report_systems(runs)] == ["model", "other", "lead-3"]  # lead-3 on other records


def test_bad_runs_exit_2_naming_the_run_before_anything_is_written(report_runs, tmp_path, capsys):
    out = tmp_path / "report"
    cases = [
        ([str(tmp_path / "nowhere")], f"{tmp_path / 'nowhere'} is not a folder"),
        ([str(tmp_path)], f"{tmp_path} has no predictions.jsonl"),
        ([str(report_runs["lead"]), str(report_runs["other"])], "lead and other are not on the same dataset"),
    ]
    for runs, message in cases:
        assert main(["report", *runs, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("bart-opt report: error: ") and message in err
        assert "Traceback" not in err and err.count("\n") == 1
        assert not out.exists()


def test_without_matplotlib_the_report_names_the_extra_to_install(report_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ModuleNotFoundError
    assert main(["report", str(report_runs["lead"]), "--out", str(tmp_path / "r")]) == 2
    assert "pip install 'bart-opt[report]'" in capsys.readouterr().err


def test_the_command_line_loads_neither_matplotlib_nor_tabulate_until_a_command_needs_them():
    code = ("import sys; from bart_opt.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('matplotlib', 'tabulate', 'bart_opt.report') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
