"""The resumable evaluate runner, end to end on the demo checkpoint."""

from __future__ import annotations

import csv
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bart_opt import InvalidRequest
from bart_opt.pipeline.data import Record, load_records
from bart_opt.demo import random_article, random_sentence
from bart_opt.evaluate import (
    JsonlPredictionStore,
    compute_metrics,
    dataset_fingerprint,
    iter_predictions,
    metrics_from_rows,
    run_evaluation,
)
from bart_opt.evaluate.rows import refused_row
from bart_opt.pipeline.summarizer import Summarizer

GEN = {"max_length": 14, "min_length": 3}


class Stop(Exception):
    """Injected into the runner to stop it halfway, like a crash."""


@pytest.fixture(scope="module")
def summarizer(demo_checkpoint) -> Summarizer:
    return Summarizer.from_pretrained(demo_checkpoint, device="cpu", max_batch_size=3)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    rng = random.Random(3)
    return [
        {"id": f"doc-{i}", "article": random_article(rng, rng.randint(1, 10)),
         "highlights": "\n".join(random_sentence(rng) for _ in range(2))}
        for i in range(8)
    ]


@pytest.fixture(scope="module")
def records(rows):
    return load_records(records=rows)


@pytest.fixture(scope="module")
def full_run(summarizer, records, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    metrics = run_evaluation(summarizer, records, out, GEN, progress=False)
    return out, metrics


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_evaluate_writes_predictions_and_metrics(full_run, records, summarizer):
    out, metrics = full_run
    lines = read_lines(out / "predictions.jsonl")
    assert sorted(row["id"] for row in lines) == sorted(r.id for r in records)
    by_id = {row["id"]: row for row in lines}
    direct = summarizer.summarize([r.text for r in records], [r.reference for r in records], **GEN)
    for record, summary, item in zip(records, direct.summaries, direct.items):
        row = by_id[record.id]
        assert row["prediction"] == summary and row["reference"] == record.reference
        assert row["rouge"] == item["rouge"] and row["error"] is None
        assert row["padding_avoided"] == item["padding_avoided"] > 0
    assert metrics == json.loads((out / "metrics.json").read_text())
    assert metrics["n_obs"] == len(records) and metrics["n_errors"] == 0
    assert metrics["rouge"] == direct.rouge
    assert set(metrics["rouge"]["rougeLsum"]) == {"low", "mid", "high"}
    assert metrics["runtime_s"] > 0
    assert metrics["seconds_per_sample"] == pytest.approx(metrics["runtime_s"] / len(records))
    assert metrics["memory"]["peak_bytes"] > 0 and metrics["memory"]["peak_source"] == "live_tensors"
    assert metrics["padding"]["avoided"] == sum(row["padding_avoided"] for row in lines)
    assert metrics["generation"]["max_length"] == 14 and metrics["generation"]["num_beams"] == 4
    assert metrics["model"] == summarizer.name and metrics["resumed_from"] == 0


def test_resume_after_a_stop_equals_an_uninterrupted_run(full_run, summarizer, records, tmp_path):
    seen = []

    def stop_after_first_batch(batch_rows):
        seen.append(len(batch_rows))
        raise Stop

    with pytest.raises(Stop):
        run_evaluation(summarizer, records, tmp_path, GEN, progress=False, on_batch=stop_after_first_batch)
    first = read_lines(tmp_path / "predictions.jsonl")
    assert len(first) == seen[0] == 3
    assert not (tmp_path / "metrics.json").exists()
    # A run killed while writing leaves a torn line behind; the rerun must drop it.
    with (tmp_path / "predictions.jsonl").open("a") as f:
        f.write('{"id": "doc-7", "predic')

    metrics = run_evaluation(summarizer, records, tmp_path, GEN, progress=False)
    lines = read_lines(tmp_path / "predictions.jsonl")
    assert sorted(row["id"] for row in lines) == sorted(r.id for r in records)  # each id exactly once
    assert lines[:3] == first  # finished work was not redone
    full_out, full_metrics = full_run
    full_by_id = {row["id"]: row["prediction"] for row in read_lines(full_out / "predictions.jsonl")}
    assert {row["id"]: row["prediction"] for row in lines} == full_by_id
    assert metrics["resumed_from"] == 3
    assert metrics["rouge"] == full_metrics["rouge"]
    for key in ("n_obs", "n_errors", "padding", "tokens", "generation", "model"):
        assert metrics[key] == full_metrics[key], key


def test_rerun_of_a_finished_run_generates_nothing(full_run, summarizer, records):
    out, metrics = full_run
    calls = []
    summarizer.before_model_call = calls.append
    try:
        again = run_evaluation(summarizer, records, out, GEN, progress=False)
    finally:
        summarizer.before_model_call = None
    assert calls == []
    assert again["rouge"] == metrics["rouge"] and again["resumed_from"] == len(records)


def test_other_settings_in_the_same_directory_are_refused(full_run, summarizer, records):
    out, _ = full_run
    with pytest.raises(ValueError, match="other settings"):
        run_evaluation(summarizer, records, out, {"max_length": 10}, progress=False)


def test_a_run_on_other_records_is_refused_and_overwrite_starts_over(summarizer, records, tmp_path):
    run_evaluation(summarizer, records[:3], tmp_path, GEN, progress=False, source="a.jsonl")
    before = (tmp_path / "predictions.jsonl").read_text()
    other_text = [Record(r.id, r.text + " More.", r.reference) for r in records[:3]]
    other_reference = [Record(r.id, r.text, "Another summary.") for r in records[:3]]
    for changed in (other_text, other_reference, records[1:4], records[:2]):
        with pytest.raises(ValueError, match=r"another dataset \(a.jsonl, 3 records, sha256:"):
            run_evaluation(summarizer, changed, tmp_path, GEN, progress=False, source="b.jsonl")
    assert (tmp_path / "predictions.jsonl").read_text() == before
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["dataset"]["fingerprint"] == dataset_fingerprint(records[:3])[0]

    grown = run_evaluation(summarizer, records[:5], tmp_path, GEN, progress=False, source="a.jsonl")
    assert grown["resumed_from"] == 3 and grown["n_obs"] == 5  # a larger --limit extends the run

    fresh = run_evaluation(summarizer, other_text, tmp_path, GEN, progress=False, overwrite=True)
    assert fresh["resumed_from"] == 0 and fresh["n_obs"] == 3
    rows = read_lines(tmp_path / "predictions.jsonl")  # longest first, as batched
    assert sorted(row["id"] for row in rows) == [r.id for r in other_text]


def test_a_run_directory_without_a_dataset_fingerprint_is_refused(summarizer, records, tmp_path):
    run_evaluation(summarizer, records[:2], tmp_path, GEN, progress=False)
    run = json.loads((tmp_path / "run.json").read_text())
    del run["dataset"]
    (tmp_path / "run.json").write_text(json.dumps(run))
    with pytest.raises(ValueError, match="does not record its dataset"):
        run_evaluation(summarizer, records[:2], tmp_path, GEN, progress=False)


def test_fingerprint_streams_and_marks_the_prefix(records):
    fingerprint, count, prefix = dataset_fingerprint(iter(records), prefix=3)
    assert count == len(records) and prefix == dataset_fingerprint(records[:3])[0] != fingerprint
    assert dataset_fingerprint(records[:2], prefix=3)[2] is None


def test_metrics_from_rows_streams_in_record_order(full_run, summarizer, records):
    out, metrics = full_run
    by_id = {row["id"]: row for row in read_lines(out / "predictions.jsonl")}
    streamed = metrics_from_rows((by_id[r.id] for r in records), model=summarizer,
                                 generation=metrics["generation"], record=json.loads((out / "run.json").read_text()))
    assert streamed == {k: v for k, v in metrics.items() if k not in ("wall_s_last_run", "model_s_last_run", "resumed_from")}


def test_iter_predictions_skips_done_ids_and_is_a_plain_generator(summarizer, records):
    skip = {r.id for r in records[2:]}
    spec = summarizer.generation_spec(GEN)
    batches = list(iter_predictions(summarizer, records, spec, skip_ids=skip))
    assert sorted(row["id"] for b in batches for row in b.rows) == [records[0].id, records[1].id]
    assert all(b.model_call and b.peak_bytes > 0 for b in batches)  # each with its batch's memory peak
    assert list(iter_predictions(summarizer, records, spec, skip_ids={r.id for r in records})) == []


def test_bad_generation_options_are_refused_before_anything_is_written(summarizer, records, tmp_path):
    with pytest.raises(InvalidRequest) as caught:
        run_evaluation(summarizer, records, tmp_path / "out", {"top_k": 5}, progress=False)
    assert caught.value.field == "top_k"
    assert not (tmp_path / "out").exists()


def test_compute_metrics_needs_every_record(summarizer, records):
    with pytest.raises(ValueError, match="no prediction"):
        compute_metrics({}, records, model=summarizer, generation={})


def valid(example_id: str) -> str:
    """A stored row of a record refused before the model, as one JSON line."""
    return json.dumps(refused_row(Record(example_id, "text"), "too long"))


def test_store_reports_a_broken_line_with_its_number(tmp_path):
    path = tmp_path / "predictions.jsonl"
    path.write_text(f'{valid("a")}\nnot json\n{valid("b")}\n')
    with pytest.raises(ValueError, match="line 2"):
        JsonlPredictionStore(path).load()


def test_jsonl_csv_and_parquet_inputs_give_the_same_records(rows, records, tmp_path):
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with (tmp_path / "data.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data.parquet")
    for name in ("data.jsonl", "data.csv", "data.parquet"):
        assert load_records(file=tmp_path / name) == records, name


# ---- hostile input: the run folder's sink and the records' source --------------------------------


def test_an_id_that_is_not_valid_text_is_stored_escaped_and_read_back(tmp_path):
    store = JsonlPredictionStore(tmp_path / "predictions.jsonl")
    rows = [{**json.loads(valid("bad")), "id": "bad\ud800id", "prediction": "x\udfff"},
            {**json.loads(valid("plain")), "prediction": "é"}]
    store.append(rows)
    assert store.load() == {row["id"]: row for row in rows}
    assert (tmp_path / "predictions.jsonl").read_text(encoding="utf-8").count("\n") == 2


def test_a_huge_torn_line_is_dropped_and_a_line_that_is_no_row_is_named(tmp_path):
    path = tmp_path / "predictions.jsonl"
    path.write_text(valid("a") + '\n{"id": "b", "prediction": "' + "x" * 5_000_000)  # killed mid-write
    assert list(JsonlPredictionStore(path).load()) == ["a"] and path.read_text() == valid("a") + "\n"
    for line in ("[1, 2]", '"just a string"', '{"prediction": "no id"}'):
        path.write_text(valid("a") + "\n" + line + "\n")
        with pytest.raises(ValueError, match="line 2 is not a prediction row"):
            JsonlPredictionStore(path).load()


def test_repeated_ids_and_texts_that_are_not_valid_text_get_one_row_each(summarizer, records, tmp_path):
    hostile = [*records[:3], Record(records[0].id, "Another text under the same id.", None),
               Record("bad", "half \ud800 a text", "fine")]
    metrics = run_evaluation(summarizer, hostile, tmp_path, GEN, progress=False)
    rows = {row["id"]: row for row in read_lines(tmp_path / "predictions.jsonl")}
    assert sorted(rows) == sorted([*(r.id for r in records[:3]), "bad"])
    assert rows["bad"]["error"].startswith("text: character 5 (U+D800) is a lone surrogate")
    assert rows[records[0].id]["prediction"] == summarizer.summarize([records[0].text], **GEN).summaries[0]
    assert (metrics["n_obs"], metrics["n_errors"]) == (4, 1)
