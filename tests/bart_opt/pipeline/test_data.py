"""Records from JSONL / JSON / CSV / Parquet files, Python lists and a local `datasets` folder."""

from __future__ import annotations

import csv
import json
import re

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bart_opt.pipeline.data import MissingColumnError, Record, load_records

ROWS = [
    {
        "id": "007",
        "article": 'He said, "Hello, world."\nSecond paragraph, with commas.',
        "highlights": "Greeting .\nMore .",
    },
    {"id": "b2", "article": "Markets rose on Monday.", "highlights": "Markets up ."},
    {"id": "c3", "article": "Rain is expected tomorrow.", "highlights": "Rain ahead ."},
]
EXPECTED = [Record(row["id"], row["article"], row["highlights"]) for row in ROWS]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def write_json_array(path, rows):
    path.write_text(json.dumps(rows, indent=2), encoding="utf-8")


def write_csv(path, rows):
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


WRITERS = {".jsonl": write_jsonl, ".json": write_json_array, ".csv": write_csv, ".parquet": write_parquet}


@pytest.fixture(params=sorted(WRITERS))
def write(request, tmp_path):
    """Write rows in one of the file formats; returns the path."""
    suffix = request.param

    def _write(rows, name="data"):
        path = tmp_path / f"{name}{suffix}"
        WRITERS[suffix](path, rows)
        return path

    return _write


def test_file_formats_read_the_same_records(write):
    assert load_records(file=write(ROWS)) == EXPECTED


def test_file_path_may_be_a_string(tmp_path):
    path = tmp_path / "data.jsonl"
    write_jsonl(path, ROWS)
    assert load_records(file=str(path)) == EXPECTED


def test_python_list_with_column_mapping():
    rows = [
        {"key": 10, "body": "Text one.", "summary": "One ."},
        {"key": 11, "body": "Text two.", "summary": "Two ."},
    ]
    records = load_records(records=rows, text_column="body", summary_column="summary", id_column="key")
    assert records == [Record("10", "Text one.", "One ."), Record("11", "Text two.", "Two .")]


def test_column_mapping_in_files(write):
    rows = [{"doc": r["id"], "text": r["article"], "reference": r["highlights"]} for r in ROWS]
    records = load_records(file=write(rows), text_column="text", summary_column="reference", id_column="doc")
    assert records == EXPECTED


def test_references_are_optional_when_no_summary_column(write):
    rows = [{"id": r["id"], "article": r["article"]} for r in ROWS]
    records = load_records(file=write(rows), summary_column=None)
    assert [r.reference for r in records] == [None, None, None]
    assert [r.text for r in records] == [r["article"] for r in ROWS]


def test_missing_id_column_gives_row_positions(write):
    rows = [{"article": r["article"], "highlights": r["highlights"]} for r in ROWS]
    assert [r.id for r in load_records(file=write(rows))] == ["0", "1", "2"]
    assert [r.id for r in load_records(file=write(ROWS), id_column=None)] == ["0", "1", "2"]


@pytest.mark.parametrize(
    ("kwargs", "column"), [({"text_column": "text"}, "text"), ({"summary_column": "summary"}, "summary")]
)
def test_missing_column_lists_the_available_ones(write, kwargs, column):
    with pytest.raises(MissingColumnError) as info:
        load_records(file=write(ROWS), **kwargs)
    assert isinstance(info.value, ValueError)
    assert info.value.available == ["article", "highlights", "id"]
    assert info.value.column == column
    message = str(info.value)
    assert repr(column) in message and "article, highlights, id" in message


def test_missing_column_in_a_later_list_row():
    rows = [
        {"id": "a", "article": "Text.", "highlights": "Sum."},
        {"id": "b", "body": "Text.", "highlights": "Sum."},
    ]
    with pytest.raises(MissingColumnError, match="row 1") as info:
        load_records(records=rows)
    assert info.value.available == ["body", "highlights", "id"]


def test_limit(write):
    assert load_records(file=write(ROWS), limit=2) == EXPECTED[:2]
    assert load_records(records=ROWS, limit=10) == EXPECTED


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "2"])
def test_bad_limit(limit):
    with pytest.raises(ValueError, match="limit"):
        load_records(records=ROWS, limit=limit)


def test_limit_stops_reading_early(tmp_path):
    path = tmp_path / "data.jsonl"
    write_jsonl(path, ROWS[:2])
    with path.open("a") as handle:
        handle.write("{not json\n")
    assert load_records(file=path, limit=2) == EXPECTED[:2]
    with pytest.raises(ValueError, match="line 3"):
        load_records(file=path)


def test_duplicate_ids_are_refused(write):
    rows = [dict(ROWS[0]), dict(ROWS[1]), dict(ROWS[2], id="007")]
    with pytest.raises(ValueError, match="duplicate id '007' at rows 0 and 2"):
        load_records(file=write(rows))


@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_text_names_the_record(write, text):
    rows = [dict(ROWS[0]), dict(ROWS[1], article=text)]
    with pytest.raises(ValueError, match="record 'b2'.*'article' is empty"):
        load_records(file=write(rows))


def test_non_string_values_are_refused():
    with pytest.raises(ValueError, match="record 'x'.*'article' holds int"):
        load_records(records=[{"id": "x", "article": 5, "highlights": "Sum."}])
    with pytest.raises(ValueError, match="record 'x'.*no value in column 'highlights'"):
        load_records(records=[{"id": "x", "article": "Text.", "highlights": None}])
    with pytest.raises(ValueError, match="id column 'id' holds"):
        load_records(records=[{"id": 1.5, "article": "Text.", "highlights": "Sum."}])
    with pytest.raises(ValueError, match="row 1 is str"):
        load_records(records=[ROWS[0], "not a dict"])


def test_empty_sources_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no records in records"):
        load_records(records=[])
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="no records in file"):
        load_records(file=path)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"records": ROWS, "file": "x.jsonl"},
        {"hub": "abisee/cnn_dailymail", "records": ROWS},
        {"records": {"id": "a"}},
    ],
)
def test_exactly_one_source(kwargs):
    with pytest.raises(ValueError, match="exactly one|list of dicts"):
        load_records(**kwargs)


def test_bad_files(tmp_path):
    with pytest.raises(ValueError, match=r"unsupported file type '\.txt'.*\.jsonl"):
        load_records(file=tmp_path / "data.txt")
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        load_records(file=tmp_path / "missing.csv")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"id": "a", "article": "x", "highlights": "y"},')
    with pytest.raises(ValueError, match="broken.json, line 1: invalid JSON"):
        load_records(file=broken)


def test_hub_loader_on_a_local_dataset_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    folder = tmp_path / "cnn_like"
    folder.mkdir()
    write_jsonl(folder / "test.jsonl", ROWS)
    write_jsonl(folder / "train.jsonl", [dict(ROWS[1], id="t1")])
    assert load_records(hub=str(folder), split="test") == EXPECTED
    assert load_records(hub=str(folder), split="test", limit=1) == EXPECTED[:1]
    train = load_records(hub=str(folder), split="train")
    assert train == [Record("t1", ROWS[1]["article"], ROWS[1]["highlights"])]
    with pytest.raises(MissingColumnError, match="available columns: article, highlights, id"):
        load_records(hub=str(folder), split="test", text_column="document")


# ---- ids are kept as given: one rule for every source (bart_opt.pipeline.data.check_id) ---------------


@pytest.mark.parametrize("bad", [" b2", "b2 ", "\tb2", "b2\n", "\u00a0b2", "b2\u2028"])
def test_an_id_with_white_space_at_either_end_is_refused_naming_its_row(write, bad):
    rows = [dict(ROWS[0]), dict(ROWS[1], id=bad), dict(ROWS[2])]
    with pytest.raises(ValueError, match=r"row 1: id .* has white space at its start or end"):
        load_records(file=write(rows))


@pytest.mark.parametrize("bad", [".", ".."])
def test_dot_ids_that_no_url_can_name_are_refused(write, bad):
    with pytest.raises(ValueError, match=rf"row 2: id '{re.escape(bad)}' cannot name an example in a URL path"):
        load_records(file=write([dict(ROWS[0]), dict(ROWS[1]), dict(ROWS[2], id=bad)]))


def test_inner_white_space_and_any_other_text_is_kept_exactly():
    ids = ["a b", "...", "a/..", "%2e%2e", "é", "x\ty", "0007"]
    rows = [{"id": record_id, "article": "Text.", "highlights": "Sum."} for record_id in ids]
    assert [r.id for r in load_records(records=rows)] == ids
    assert [r.id for r in load_records(records=[{"id": 7, "article": "Text.", "highlights": "Sum."}])] == ["7"]


@pytest.mark.parametrize("first_has_id", [False, True])
def test_ids_for_some_records_only_are_refused_naming_the_rows(tmp_path, first_has_id):
    """Never row numbers for some records and the data's ids for others (nor row numbers for all,
    dropping the ids the later records have)."""
    rows = [dict(row) for row in ROWS]
    without = 0 if not first_has_id else 2
    del rows[without]["id"]
    path = tmp_path / "data.jsonl"
    write_jsonl(path, rows)
    has, lacks = (1, 0) if not first_has_id else (0, 2)
    for source in ({"file": path}, {"records": rows}):
        with pytest.raises(ValueError, match=rf"row {has} has an id \('id'\) but row {lacks} has none"):
            load_records(**source)


def test_a_csv_row_without_its_id_value_names_the_row(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("id,article,highlights\na,Text.,Sum.\n,Text.,Sum.\n")
    with pytest.raises(ValueError, match=r"row 1: id column 'id' is empty"):
        load_records(file=path)
    path.write_text("article,highlights,id\nText.,Sum.,a\nText.,Sum.\n")
    with pytest.raises(ValueError, match=r"row 1: no id \(column 'id' is empty\)"):
        load_records(file=path)


@given(st.text(max_size=12).filter(lambda text: text != "first") | st.integers())
@settings(max_examples=300, deadline=None, derandomize=True, database=None)
def test_an_id_is_stored_as_given_or_refused_naming_its_row(value):
    rows = [{"id": "first", "text": "Text."}, {"id": value, "text": "Text."}]
    try:
        records = load_records(records=rows, text_column="text", summary_column=None)
    except ValueError as error:
        assert "row 1" in str(error)
        text = str(value)
        assert text in ("", ".", "..") or text != text.strip()
    else:
        assert records[1].id == str(value)
