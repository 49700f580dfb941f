"""Bounded file readers: every format streams, and a piece over the byte budget is refused early."""

from __future__ import annotations

import csv
import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bart_opt.pipeline.data import iter_records, load_records
from bart_opt.pipeline.readers import PARQUET_ROW_GROUP_FACTOR, TooLarge, file_rows

MiB = 1024 * 1024


def traced_peak(function) -> tuple[object, int]:
    """`function()`'s result and the peak of Python allocations while it ran (bytes)."""
    tracemalloc.start()
    try:
        result = function()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_json_array_is_decoded_element_by_element_across_chunks(tmp_path):
    rows = [{"id": f"r{i}", "article": ("x] }, {\"y\": [" * (7000 * i + 1)) + " é ☃", "highlights": "s"}
            for i in range(6)]  # elements of 90 KB and more cross the 64 KiB read chunks
    path = tmp_path / "rows.json"
    path.write_text("\ufeff \n" + json.dumps(rows, indent=1), encoding="utf-8")
    columns, read = file_rows(path, "rows.json")
    assert columns is None and list(read) == rows
    (tmp_path / "empty.json").write_text("[ ]")
    assert list(file_rows(tmp_path / "empty.json", "empty.json")[1]) == []


@pytest.mark.parametrize(("text", "words"), [
    ('[{"a": 1},\n{"a": 2} {"a": 3}]', "line 2: invalid JSON (expected ',' or ']'"),
    ('[{"a": 1},\n\n{"a": }]', "line 3: invalid JSON (Expecting value)"),
    ('[{"a": 1}', "line 1: invalid JSON (expected ',' or ']'"),
    ("[" * 100_000, "line 1: invalid JSON (nested too deeply)"),
])  # fmt: skip
def test_broken_json_arrays_name_the_line(tmp_path, text, words):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError) as caught:
        list(file_rows(path, "bad.json")[1])
    assert str(caught.value).startswith(f"bad.json, {words}")


@pytest.mark.parametrize(("line", "words"), [
    (b'{"a": ' + b"[" * 100_000 + b"\n", "line 2: invalid JSON (nested too deeply)"),
    (b'{"a": ' + b"1" * 5000 + b"}\n", "line 2: invalid JSON (Exceeds the limit"),
    (b'{"a": "\xff\xfe"}\n', "line 2: not UTF-8 text"),
])  # fmt: skip
def test_broken_json_lines_name_the_line(tmp_path, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 0}\n' + line)
    rows = file_rows(path, "bad.jsonl")[1]
    assert next(rows) == {"a": 0}  # the byte-order mark is dropped
    with pytest.raises(ValueError) as caught:
        next(rows)
    assert str(caught.value).startswith(f"bad.jsonl, {words}")


def test_a_file_without_newlines_is_refused_after_reading_the_budget_only(tmp_path):
    path = tmp_path / "one-line.jsonl"
    with path.open("wb") as handle:
        handle.write(b'{"id": "1", "article": "')
        for _ in range(20):
            handle.write(b"word " * (MiB // 5))
    tracemalloc.start()
    with pytest.raises(TooLarge, match=r"one-line\.jsonl, line 1: more than 1 MiB in one record") as caught:
        list(iter_records(file=path, name="one-line.jsonl", max_line_bytes=MiB))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3 * MiB, peak  # 20 MiB on disk; reading it whole would allocate at least that much
    assert "refused without reading further" in str(caught.value)


def test_csv_rows_and_json_array_elements_have_the_same_budget(tmp_path):
    big = "w" * 5000
    with (tmp_path / "rows.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "article", "highlights"])
        writer.writerow(["1", "short", "s"])
        writer.writerow(["2", "\n".join([big] * 3), "s"])  # one quoted field over several lines
    (tmp_path / "rows.json").write_text(json.dumps([{"id": "1", "article": "short"}, {"id": "2", "article": big * 3}]))
    for name in ("rows.csv", "rows.json"):
        rows = file_rows(tmp_path / name, name, max_line_bytes=12_000)[1]
        assert next(rows)["article"] == "short"
        with pytest.raises(TooLarge, match="more than 12000 bytes"):
            next(rows)
    rows = list(file_rows(tmp_path / "rows.csv", "rows.csv", max_line_bytes=20_000)[1])
    assert rows[1]["article"] == "\n".join([big] * 3)


def test_a_parquet_row_group_over_the_budget_is_refused_from_the_metadata(tmp_path):
    table = pa.table({"id": [str(i) for i in range(200)], "article": [f"{i} " + "word " * 200 for i in range(200)],
                      "unused": [f"{i}" + "x" * 2000 for i in range(200)]})
    for name, rows in (("one", 200), ("many", 20)):
        pq.write_table(table, tmp_path / f"{name}.parquet", row_group_size=rows, compression="none",
                       use_dictionary=False)
    budget = 300_000 // PARQUET_ROW_GROUP_FACTOR  # one group of 200 articles is 200 KB, of 20 about 20 KB
    with pytest.raises(TooLarge, match=r"one\.parquet: row group 0 holds"):
        file_rows(tmp_path / "one.parquet", "one.parquet", ["id", "article"], max_line_bytes=budget // 2)
    columns, rows = file_rows(tmp_path / "many.parquet", "many.parquet", ["id", "article"], max_line_bytes=budget)
    assert columns == ["id", "article", "unused"]
    assert [row["id"] for row in rows] == [str(i) for i in range(200)]
    assert set(next(file_rows(tmp_path / "many.parquet", "m", ["article"])[1])) == {"article"}


def test_iterating_records_holds_one_record_not_the_file(tmp_path):
    path = tmp_path / "many.jsonl"
    article = "Police said the city council met on Monday to vote on the new budget. " * 3
    with path.open("w") as handle:
        for i in range(30_000):
            handle.write(json.dumps({"id": f"doc-{i}", "article": article, "highlights": "A vote."}) + "\n")
    count, peak = traced_peak(lambda: sum(1 for _ in iter_records(file=path, name="many.jsonl")))
    assert count == 30_000
    assert peak < 512 * 1024, peak  # the file is 7 MB; holding its records would take more than that
    held, held_peak = traced_peak(lambda: load_records(file=path, limit=10_000))
    assert len(held) == 10_000 and held_peak > 4 * 1024 * 1024  # the measure sees records that are held
