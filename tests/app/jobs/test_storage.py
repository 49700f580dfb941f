"""The jobs database as the evaluation core's source and sink: windows, refused records, writes under the lease."""

from __future__ import annotations

import pytest

from app.jobs.storage import Interrupted, StoreSink, StoreSource
from app.jobs.store import JobStore, NewJob, StoredRecord
from bart_opt.pipeline.data import Record
from bart_opt.evaluate.rows import FAILED, MODEL, REFUSED, RowBatch, refused_row

OWNER = "host:1:a"


def direct(function, *args):
    return function(*args)


@pytest.fixture
def store(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    store.initialize()
    job, _ = store.begin(NewJob(id="j", request_hash="h", model="demo", dataset={"records": 6}, columns={}, limit=None,
                                generation={}), OWNER, 30)
    texts = ["x" * 10, "y" * 3_000_000, "z" * 10, "", "w" * 10, "v" * 10]  # one huge, one refused at submission
    store.add_records("j", OWNER, 30, [StoredRecord(i, Record(f"id-{i}", text or "-", None),
                                                    "too long" if i == 3 else None) for i, text in enumerate(texts)])
    store.seal("j", OWNER, 6)
    yield store
    store.close()


def test_windows_are_bounded_by_records_and_characters_and_carry_refusals(store):
    job = store.claim_next(OWNER, 30)
    windows = list(StoreSource(direct, store, job, window_records=2, window_chars=100).windows())
    assert [[p.record.id for p in window] for window in windows] == [["id-0", "id-1"], ["id-2", "id-3"],
                                                                     ["id-4", "id-5"]]
    assert [p.refused for p in windows[1]] == [None, "too long"]
    assert [len(w) for w in StoreSource(direct, store, job, 100, window_chars=1_000).windows()] == [2, 4]


def test_writes_count_model_batches_only_and_a_refused_write_stops_the_run(store):
    job = store.claim_next(OWNER, 30)
    written = []
    sink = StoreSink(direct, store, job, OWNER, job.runs, on_write=written.append)
    rows = [refused_row(Record(f"id-{i}", "t"), reason) for i, reason in ((0, None), (3, "too long"), (4, "boom"))]
    rows[0]["error"] = None
    sink.write(RowBatch([rows[0]], [0], MODEL, peak_bytes=500, seconds=0.25))
    sink.write(RowBatch([rows[1]], [3], REFUSED))
    sink.write(RowBatch([rows[2]], [4], FAILED))
    assert written == [1, 1, 1] and [b["size"] for b in store.batches("j")] == [1]
    assert store.get("j").done == 3 and store.get("j").failed == 2 and store.get("j").peak_bytes == 500
    store.cancel("j")
    with pytest.raises(Interrupted):
        sink.write(RowBatch([refused_row(Record("id-5", "t"), "late")], [5], FAILED))
    assert store.get("j").done == 3
