"""The evaluation core: one loop, its rules (dedupe, refused and failed rows, failure split, streak), hostile input."""

from __future__ import annotations

import pytest

from bart_opt.pipeline.baselines import lead_3
from bart_opt.pipeline.data import Record
from bart_opt.evaluate import (
    FailureStreak, ListSource, RowBatch, RunControl, SummarizerExecutor, evaluate_records, metrics_from_rows,
    score_baselines,
)
from bart_opt.evaluate.core import Pending, SeenIds, screened
from bart_opt.evaluate.rows import FAILED, MODEL, REFUSED
from bart_opt.engine.options import EngineOptions
from tests.bart_opt.evaluate.poison import MARK, MemorySink, hostile_records, load_poisoned

GEN = {"num_beams": 2, "max_length": 12, "min_length": 3}


@pytest.fixture(scope="module")
def poisoned(demo_checkpoint):
    return load_poisoned(EngineOptions(model=demo_checkpoint, device="cpu", max_batch_size=3, torch_threads=1))


def run(executor, records, **kwargs) -> MemorySink:
    sink = MemorySink(kwargs.pop("done", ()))
    evaluate_records(ListSource(records), sink, executor, executor.generation_spec(GEN), **kwargs)
    return sink


def test_each_id_gets_one_row_refused_and_failed_records_say_why(poisoned):
    records = hostile_records()
    sink = run(SummarizerExecutor(poisoned), records)
    assert sorted(sink.rows) == sorted(["r0", "r1", "r2", "r3", "r4", "r5", "bad", "oom"])
    alone = poisoned.summarize([r.text for r in records[:6]], [r.reference for r in records[:6]], **GEN)
    assert [sink.rows[f"r{i}"]["prediction"] for i in range(6)] == alone.summaries  # the first r0 ran
    assert [sink.rows[f"r{i}"]["rouge"] for i in range(6)] == [item["rouge"] for item in alone.items]
    bad, oom = sink.rows["bad"], sink.rows["oom"]
    assert bad["error"] == "text: character 7 (U+D800) is a lone surrogate, not valid Unicode text; send UTF-8"
    assert (bad["prediction"], bad["input_tokens"], bad["reference"]) == ("", 0, "A reference.")
    assert oom["error"].startswith("out of memory on this input even in a batch of one (CUDA out of memory")
    assert oom["prediction"] == "" and oom["input_tokens"] > 0 and oom["rouge"] is None
    kinds = {batch.kind: [row["id"] for row in batch.rows] for batch in sink.batches if batch.kind != MODEL}
    assert kinds == {REFUSED: ["bad"], FAILED: ["oom"]}
    metrics = metrics_from_rows(sink.rows.values(), model=poisoned, generation={})
    assert (metrics["n_obs"], metrics["n_errors"], metrics["n_scored"]) == (8, 2, 6)
    assert metrics["rouge"] == poisoned.scorer.aggregate([item["rouge"] for item in alone.items])


def test_ids_stored_before_are_not_run_again(poisoned):
    records = hostile_records()
    first = run(SummarizerExecutor(poisoned), records[:3])
    texts = []
    encode = poisoned.encode
    poisoned.encode = lambda batch: texts.extend(batch) or encode(batch)
    try:
        again = run(SummarizerExecutor(poisoned), records, done=first.rows)
    finally:
        del poisoned.encode
    assert sorted(again.rows) == sorted(["r3", "r4", "r5", "bad", "oom"])
    assert texts == [r.text for r in records[3:6]] + [records[8].text]  # the stored, repeated and refused never run


class Twice:
    """An executor that hands on every batch twice, as a Ray batch run again after its replica died."""

    def __init__(self, executor):
        self.executor = executor

    def __getattr__(self, name):
        return getattr(self.executor, name)

    def run(self, source, spec, control, rouge=None):
        for batch in self.executor.run(source, spec, control, rouge):
            yield batch
            yield RowBatch([dict(row) for row in batch.rows], list(batch.positions), batch.kind)


def test_a_row_that_comes_back_is_stored_once(poisoned):
    sink = run(Twice(SummarizerExecutor(poisoned)), hostile_records())
    assert len(sink.rows) == 8 and sum(len(batch.rows) for batch in sink.batches) == 8


def test_failures_in_a_row_stop_the_run_and_what_was_stored_stays(poisoned):
    def fail(positions):
        raise ValueError("the device is on fire")

    poisoned.before_model_call = fail
    try:
        sink = MemorySink()
        records = [Record(f"x{i}", f"Text number {i} is here. It has two sentences.", None) for i in range(9)]
        with pytest.raises(FailureStreak, match=r"^5 examples in a row failed on the model; the last one: the model "
                                                r"failed on this example \(internal error"):
            evaluate_records(ListSource(records), sink, SummarizerExecutor(poisoned), poisoned.generation_spec(GEN))
    finally:
        poisoned.before_model_call = None
    assert len(sink.rows) == 5 and all(batch.kind == FAILED for batch in sink.batches)
    assert all("on fire" not in row["error"] for row in sink.rows.values())  # the log has it, not the row


def test_a_cancelled_run_stores_nothing_more(poisoned):
    control = RunControl()
    sink = MemorySink()

    def cancel_after_first(positions):
        if sink.rows:
            control.cancel()

    poisoned.before_model_call = cancel_after_first
    try:
        report = evaluate_records(ListSource(hostile_records(n=9)[:9]), sink, SummarizerExecutor(poisoned),
                                  poisoned.generation_spec(GEN), control=control)
    finally:
        poisoned.before_model_call = None
    # Batches of 3: the first is stored; the third's call cancels the run (the second was done by then).
    assert len(sink.rows) == report.rows == 3 and all(batch.kind == MODEL for batch in sink.batches)


def test_baselines_are_aggregated_as_the_model_is(poisoned):
    records = [r for r in hostile_records() if r.id != "bad"][:6]
    baseline = score_baselines(["lead-3"], records, poisoned.scorer)["lead-3"]
    rows = [{"id": r.id, "prediction": lead_3(r.text), "reference": r.reference, "error": None, "seconds": 0.0,
             "rouge": poisoned.scorer.score(lead_3(r.text), r.reference)} for r in records]
    model_shaped = metrics_from_rows(rows, model=poisoned, generation={})
    assert baseline["rouge"] == model_shaped["rouge"] and baseline["n_scored"] == model_shaped["n_scored"] == 6
    assert baseline["baseline"] is True and "memory" not in baseline


# ---- hostile input: the source's records and the sink's ids -----------------------------------


@pytest.mark.parametrize(("text", "reference", "reason"), [
    ("fine", "\udfff", "reference: character 0 (U+DFFF) is a lone surrogate"),
    ("\ud800" * 3, None, "text: character 0 (U+D800) is a lone surrogate"),
    ("\ud800", "\udc00", "text: character 0 (U+D800)"),
])
def test_screening_drops_what_is_not_text_and_says_so(text, reference, reason):
    got = screened(Pending(4, Record("id", text, reference)))
    assert got.refused.startswith(reason) and got.position == 4
    assert got.record.text in ("", "fine") and got.record.reference is None
    assert screened(Pending(1, Record("id", "fine", "ok"))) == Pending(1, Record("id", "fine", "ok"))


def test_a_huge_text_is_cut_to_the_model_and_runs(poisoned):
    huge = Record("huge", "The council met again on Monday. " * 8_000, "The council met.")  # 264 kB, 56k tokens
    sink = run(SummarizerExecutor(poisoned), [huge])
    row = sink.rows["huge"]
    assert row["error"] is None and row["truncated"] is True and row["input_tokens"] == poisoned.max_input_tokens


def test_seen_ids_hold_long_and_odd_ids_as_digests():
    seen = SeenIds(["a"])
    assert not seen.add("a") and seen.add("b") and seen.add("x" * 10_000_000) and not seen.add("x" * 10_000_000)
    assert seen.add("\ud800") and not seen.add("\ud800") and seen.add("\ud800\udc00")


def test_marked_text_is_the_only_one_the_poison_touches(poisoned):
    assert MARK not in " ".join(r.text for r in hostile_records()[:6])


class AroundTheWindows:
    """A source read around its windows, as a Ray executor reads a job's records (`everything`), that gives
    the texts of records by id (`texts`), as the jobs database does."""

    def __init__(self, records):
        self.records = records
        self.asked: list[str] = []

    def windows(self):
        raise AssertionError("read around the windows")

    def everything(self):
        return ListSource(self.records).windows()

    def texts(self, ids):
        self.asked += ids
        return {record.id: record.text for record in self.records if record.id in ids}


class ReadsAround:
    """An executor that reads its source through `everything` (an attribute the core forwards)."""

    def __init__(self, executor):
        self.executor = executor

    def __getattr__(self, name):
        return getattr(self.executor, name)

    def run(self, source, spec, control, rouge=None):
        class Windows:
            def windows(self):
                return source.everything()

        return self.executor.run(Windows(), spec, control, rouge)


def test_rows_with_rouge_get_the_other_metrics_scored_against_their_source(poisoned):
    from bart_opt.scoring.base import Example
    from bart_opt.scoring.extractive import ExtractiveMetric
    from bart_opt.scoring.length import LengthMetric

    records = hostile_records()
    metrics = [ExtractiveMetric(), LengthMetric()]
    sink = run(SummarizerExecutor(poisoned), records, metrics=metrics)
    by_id = {record.id: record for record in reversed(records)}  # the first of a repeated id is the one that ran
    for record_id, row in sink.rows.items():
        if row["rouge"] is None:
            assert "scores" not in row  # refused or failed: scored by nothing, as by ROUGE
            continue
        example = Example(row["prediction"], row["reference"], by_id[record_id].text)
        assert row["scores"] == {"extractive": metrics[0].score([example])[0],
                                 "length": metrics[1].score([example])[0]}

    source = AroundTheWindows(records[:3])
    sink_around = MemorySink(())
    evaluate_records(source, sink_around, ReadsAround(SummarizerExecutor(poisoned)),
                     poisoned.generation_spec(GEN), metrics=metrics)
    assert sorted(source.asked) == ["r0", "r1", "r2"]
    assert {k: row["scores"] for k, row in sink_around.rows.items()} == {
        k: sink.rows[k]["scores"] for k in sink_around.rows}
