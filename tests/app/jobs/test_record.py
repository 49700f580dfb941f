"""A job's run record on the service: the engine it was submitted to (a replica runs only jobs of its
own engine; the others wait for theirs, then fail naming both), its ROUGE settings (``rouge.tokenizer``,
``rouge.lang``), its signature and warnings, and jobs of another system's predictions."""

from __future__ import annotations

import json

from app.jobs.store import JobStore, NewJob
from bart_opt.cli import main
from bart_opt.pipeline.data import Record
from tests.app.helpers import serving
from tests.app.jobs.helpers import Stepper, cnn_rows, sql, wait_for_job

FAST = {"num_beams": 1, "max_length": 8, "min_length": 2}
WAIT_S = 2.0


def submit(client, **body) -> str:
    response = client.post("/evaluate", json={"dataset": {"file": "cnn.jsonl"}, **body})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_replicas_of_two_engines_on_one_database_run_only_their_own_jobs(make_jobs_app, write_jsonl, backend):
    write_jsonl("cnn.jsonl", cnn_rows(3, seed=36))
    stepper = Stepper()
    common = {"db": backend.url, "job_engine_wait_s": WAIT_S, "job_lease_s": 2, "max_batch_size": 1}
    fp32 = make_jobs_app(load=stepper.loader(), **common)
    int8 = make_jobs_app(quantize="int8", **common)
    with serving(int8) as replica_b:
        assert replica_b.get("/ready").json()["engine"]["quantize"] == "int8"
        with serving(fp32) as replica_a:
            ready = replica_a.get("/ready").json()
            assert ready["engine"]["quantize"] is None and ready["engine"]["dtype"] == "float32"
            first = submit(replica_a, generation=FAST)
            stepper.wait_arrived(1)  # the fp32 replica runs it (the int8 one, idle, did not take it)
            second = submit(replica_b, generation=FAST)
            done = wait_for_job(replica_b, second)
            assert done["status"] == "succeeded" and done["engine"]["quantize"] == "int8"
            assert "quantize:int8" in done["signature"]
            stepper.allow(100)  # the fp32 replica finishes the batch on its device, then stops: the job goes back
        failed = wait_for_job(replica_b, first, timeout=60)
    assert failed["status"] == "failed", failed
    assert "quantize:none" in failed["error"] and "quantize:int8" in failed["error"]
    assert f"within {WAIT_S:g} s" in failed["error"]
    store = JobStore(backend.url)
    [(runs, done_rows)] = sql(store, "SELECT runs, done FROM jobs WHERE id = :job", job=first)
    per_run = dict(sql(store, "SELECT run, COUNT(*) FROM predictions WHERE job_id = :job GROUP BY run", job=first))
    store.close()
    assert runs == 1 and 1 <= done_rows < 3 and per_run == {1: done_rows}  # only fp32 rows, nothing int8 added


def test_a_job_from_before_engine_records_takes_the_engine_of_the_replica_that_starts_it(make_jobs_app, tmp_path,
                                                                                        demo_checkpoint):
    db = str(tmp_path / "jobs.db")
    store = JobStore(db)
    store.initialize()
    generation = {"num_beams": 1, "max_length": 8, "min_length": 2, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
                  "early_stopping": False, "forced_bos_token_id": 0, "forced_eos_token_id": [2],
                  "decoder_start_token_id": 2, "eos_token_id": [2], "pad_token_id": 1}
    old = NewJob(id="old", request_hash="h", model=demo_checkpoint, dataset={"records": 1},
                 columns={"text": "text", "summary": "reference", "id": "id"}, limit=None, generation=generation)
    store.create(old, [Record("a", "A short story about a town.", "A town.")])
    store.close()
    with serving(make_jobs_app(db=db)) as client:
        view = wait_for_job(client, "old")
    assert view["status"] == "succeeded", view["error"]
    assert view["engine"]["dtype"] == "float32" and view["rouge_settings"] is None


def cyrillic(n: int = 2) -> list[dict]:
    return [{"id": f"ru{i}", "text": "Кошка сидит на ковре. Собака спит.", "reference": "Кошка сидит на ковре."}
            for i in range(n)]


def test_rouge_tokenizer_and_lang_are_job_fields_and_the_default_warns(make_jobs_app):
    predictions = {"column": "text", "name": "lead"}
    rouge_only = {"metrics": ["rouge"]}  # the extractive metric warns of predictions without sources: not this test's
    with serving(make_jobs_app()) as client:
        unicode_id = client.post("/evaluate", json={"dataset": {"records": cyrillic()}, "predictions": predictions,
                                                    "rouge": {"tokenizer": "unicode", "lang": "ru"},
                                                    **rouge_only}).json()["id"]
        default_id = client.post("/evaluate", json={"dataset": {"records": cyrillic()},
                                                    "predictions": predictions, **rouge_only}).json()["id"]
        unicode_view, default_view = wait_for_job(client, unicode_id), wait_for_job(client, default_id)
        refused = client.post("/evaluate", json={"dataset": {"records": cyrillic()}, "predictions": predictions,
                                                 "rouge": {"lang": "ru"}})
    assert unicode_view["rouge"]["rouge1"]["mid"]["recall"] == 100.0 and unicode_view["warnings"] == []
    assert unicode_view["rouge_settings"]["stemmer"] == "snowball-russian"
    assert "tok:unicode|lang:ru|stem:snowball-russian" in unicode_view["signature"]
    assert default_view["rouge"]["rouge1"]["mid"]["fmeasure"] == 0.0
    (warning,) = default_view["warnings"]
    assert "2 of 2 predictions and 2 of 2 references" in warning
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "rouge.lang"


def test_a_job_of_another_systems_predictions_scores_as_bart_opt_score(make_jobs_app, tmp_path, capsys):
    rows = [{"id": row["id"], "prediction": row["article"].split(". ")[0], "reference": row["highlights"]}
            for row in cnn_rows(4, seed=37)]
    path = tmp_path / "pegasus.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["score", str(path), "--out", str(tmp_path / "scored")]) == 0
    scored = json.loads(capsys.readouterr().out)
    with serving(make_jobs_app()) as client:
        answer = client.post("/evaluate", json={"dataset": {"records": rows}, "summary_column": "reference",
                                                "predictions": {"name": "pegasus"}})
        assert answer.status_code == 202, answer.text
        view = wait_for_job(client, answer.json()["id"])
        refused = client.post("/evaluate", json={"dataset": {"records": rows}, "predictions": {},
                                                 "generation": {"num_beams": 2}})
    assert view["status"] == "succeeded" and view["system"] == "external" and view["model"] == "pegasus"
    assert view["rouge"] == scored["rouge"] and view["engine"] is None
    assert "system:external" in view["signature"]
    assert refused.status_code == 422 and "do not apply to a job of predictions" in refused.text


def test_metrics_is_a_job_field_checked_once_and_the_view_shows_every_metric(make_jobs_app, write_jsonl):
    write_jsonl("cnn.jsonl", cnn_rows(3, seed=38))
    with serving(make_jobs_app()) as client:
        refused = {tuple(value) if isinstance(value, list) else value: client.post(
            "/evaluate", json={"dataset": {"file": "cnn.jsonl"}, "metrics": value})
            for value in (["rouge", "bleu"], ["length", "length"], [], ["bertscore"], "rouge")}
        job_id = submit(client, generation=FAST, metrics=["length"], baselines=["lead-3"])
        view = wait_for_job(client, job_id)
        default = wait_for_job(client, submit(client, generation=FAST))
    for value, response in refused.items():
        assert response.status_code == 422, value
        assert response.json()["error"]["field"] == "metrics", response.text
    assert "BART_OPT_BERTSCORE_MODEL" in refused[("bertscore",)].json()["error"]["message"]
    assert view["status"] == "succeeded" and view["metrics"] == ["rouge", "length"]
    assert set(view["scores"]) == {"rouge", "length"} and set(view["scores"]["length"]["tokens"]) == {"low", "mid", "high"}
    assert view["scores"]["rouge"]["rouge1"]["mid"] == view["rouge"]["rouge1"]["mid"]["fmeasure"]
    assert view["metric_settings"]["names"] == ["rouge", "length"]
    (lead,) = view["baselines"]
    assert set(lead["scores"]) == {"rouge", "length"}
    assert default["metrics"] == ["rouge", "extractive", "length"]  # BART_OPT_METRICS' default
    assert 0.0 <= default["scores"]["extractive"]["coverage"]["mid"] <= 1.0
