"""One run, one ROUGE number: ``bart-opt evaluate``'s output, metrics.json, the job view, ``GET /compare``,
``bart-opt compare`` and the dashboard's job page all show the same ``rouge.<type>.mid.fmeasure`` (the mean
over examples), to the last bit, for the same model, settings and records."""

from __future__ import annotations

import contextlib
import io
import json

from bart_opt.pipeline.baselines import lead_3
from bart_opt.cli import main
from bart_opt.pipeline.data import load_records
from bart_opt.pipeline.rouge import DEFAULT_ROUGE_TYPES
from tests.app.dashboard.live import wait_for_jobs
from tests.app.helpers import FAST

LABELS = {"rouge1": "R1", "rouge2": "R2", "rougeL": "RL", "rougeLsum": "RLsum"}


def cli(*argv: str) -> tuple[str, str]:
    """``bart-opt ARGV``'s stdout and stderr (not capsys: the live server's threads write to stderr too)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(list(argv)) == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


def test_the_same_run_shows_the_same_rouge_on_all_six_surfaces(make_server, page, demo_checkpoint, tmp_path):
    with make_server() as live, live.client() as client:
        data = live.app.state.settings.data_dir + "/cnn.jsonl"
        records = load_records(file=data)
        lead = [{"id": r.id, "prediction": lead_3(r.text), "reference": r.reference} for r in records]
        model_job = client.post("/evaluate", json={"dataset": {"file": "cnn.jsonl"}, "generation": FAST}).json()["id"]
        lead_job = client.post("/evaluate", json={"dataset": {"records": lead}, "predictions": {"name": "lead-3"}}
                               ).json()["id"]
        view, _ = wait_for_jobs(client, [model_job, lead_job])
        compared = client.get("/compare", params={"jobs": f"{model_job},{lead_job}"}).json()
        page.goto(f"{live.url}/#/jobs/{model_job}")
        page.wait_for_selector("#rouge-table [data-value]")
        shown = {t: page.locator(f'#rouge-table [data-type="{t}"][data-field="mid.fmeasure"]') for t in LABELS}
        dashboard = {t: (float(cell.get_attribute("data-value")), cell.inner_text()) for t, cell in shown.items()}
        signature_shown = page.locator("#job-signature").inner_text()
        page.goto(f"{live.url}/#/compare?jobs={model_job},{lead_job}")
        page.wait_for_selector("#significance-0")
        side = {t: float(page.locator(f'#compare-rouge tr:nth-child(1) [data-type="{t}"]').get_attribute("data-value"))
                for t in LABELS}
        compare_signatures = page.locator("#compare-signatures dd").all_inner_texts()

    run, lead_run = tmp_path / "run", tmp_path / "lead"
    flags = ["--num-beams", str(FAST["num_beams"]), "--max-length", str(FAST["max_length"]), "--min-length",
             str(FAST["min_length"]), "--max-batch-size", "2", "--no-progress"]
    stdout, stderr = cli("evaluate", "--model", demo_checkpoint, "--data", data, "--out", str(run), *flags)
    output = json.loads(stdout)
    metrics = json.loads((run / "metrics.json").read_text())
    cli("evaluate", "--model", "lead-3", "--data", data, "--out", str(lead_run))
    cli_compare = json.loads(cli("compare", str(run), str(lead_run), "--json")[0])

    assert view["status"] == "succeeded" and metrics["n_scored"] == view["progress"]["done"] == len(records)
    for rouge_type in DEFAULT_ROUGE_TYPES:
        number = output["rouge"][rouge_type]["mid"]["fmeasure"]  # 1: evaluate's output
        assert f"{LABELS[rouge_type]} {number:5.2f} [" in stderr
        assert metrics["rouge"][rouge_type]["mid"]["fmeasure"] == number  # 2: metrics.json
        assert view["rouge"][rouge_type]["mid"]["fmeasure"] == number  # 3: the job view
        assert compared["runs"][0]["rouge"][rouge_type] == number  # 4: GET /compare
        assert cli_compare["runs"][0]["rouge"][rouge_type] == number  # 5: bart-opt compare
        assert dashboard[rouge_type] == (number, f"{number:.2f}")  # 6: the dashboard (job page, compare page)
        assert side[rouge_type] == number
        assert compared["runs"][1]["rouge"][rouge_type] == cli_compare["runs"][1]["rouge"][rouge_type]  # lead-3 too
    assert compare_signatures == [view["signature"], compared["runs"][1]["signature"]]
    assert "system:external" in compare_signatures[1]  # another system's predictions, beside the model's job
    assert view["signature"] == signature_shown and view["signature"].split("|system:")[0] == \
        metrics["signature"].split("|system:")[0]
