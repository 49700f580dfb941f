"""Evaluation records from a hub dataset, a local JSONL / JSON / CSV / Parquet file, or a Python list.

Every source ends as a list of `Record(id, text, reference)`. Columns are named by the caller
(`text_column`, `summary_column`, `id_column`; CNN/DailyMail's `article`, `highlights`, `id` by
default). Problems are `ValueError`s that name the record or the column at fault, so a service
can hand them to its client as they are.

Hub datasets load through `datasets.load_dataset` (network, or a local dataset folder). Local
files are read directly: no cache copy of the file is written, CSV values stay strings (an id
such as "007" keeps its zeros), and a broken JSON line is reported with its line number.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import pyarrow.parquet as pq

FILE_FORMATS = {
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


@dataclass(frozen=True, slots=True)
class Record:
    """One input to summarize: a unique id, the text, and the reference summary (or None)."""

    id: str
    text: str
    reference: str | None = None


Rows = Iterator[Mapping[str, Any]]


class MissingColumnError(ValueError):
    """A requested column does not exist; `.column` is the one asked for, `.available` those that exist."""

    def __init__(self, column: str, role: str, available: Iterable[str], where: str = ""):
        self.column = column
        self.role = role
        self.available = sorted(str(c) for c in available)
        location = f" in {where}" if where else ""
        super().__init__(
            f"{role} column {column!r} not found{location}; available columns: "
            + (", ".join(self.available) if self.available else "(none)")
        )


def load_records(
    hub: str | None = None,
    config: str | None = None,
    split: str = "test",
    file: str | Path | None = None,
    records: Sequence[Mapping[str, Any]] | None = None,
    text_column: str = "article",
    summary_column: str | None = "highlights",
    id_column: str | None = "id",
    limit: int | None = None,
) -> list[Record]:
    """Read records from exactly one of `hub`, `file` or `records`.

    Args:
        hub: a dataset name on the Hugging Face hub (e.g. "abisee/cnn_dailymail") or a local
            dataset folder, loaded with `datasets.load_dataset(hub, config, split=split)`.
        config: the dataset configuration (e.g. "3.0.0"); hub only.
        split: the split to read; hub only.
        file: a local file; the format comes from the extension: .jsonl/.ndjson (one JSON object
            per line), .json (a JSON array of objects, or JSON lines), .csv (with a header row),
            .parquet/.pq.
        records: a list of dicts.
        text_column: the column holding the text to summarize.
        summary_column: the column holding the reference summary, or None when there are no
            references (every `Record.reference` is then None).
        id_column: the column holding unique ids. When the source has no such column (or it is
            None) ids are the row positions as strings ("0", "1", ...), stable across reruns.
        limit: read at most this many records, from the start.

    Raises:
        MissingColumnError: the text, summary or id column is missing (lists those that exist).
        ValueError: no source or several, an unknown file extension, a broken JSON line, a bad
            `limit`, no records at all, duplicate ids, or a record whose text or reference is
            empty or not a string (the message names the record).
        FileNotFoundError: `file` does not exist.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    if not isinstance(text_column, str) or not text_column:
        raise ValueError("text_column must be a non-empty string")
    requested = _Columns(text_column, summary_column, id_column)
    columns, rows, source = _open_source(hub, config, split, file, records, requested)
    result = [columns.record(i, row) for i, row in enumerate(islice(rows, limit))]
    if not result:
        raise ValueError(f"no records in {source}")
    _check_unique_ids(result)
    return result


def _open_source(
    hub: str | None,
    config: str | None,
    split: str,
    file: str | Path | None,
    records: Sequence[Mapping[str, Any]] | None,
    columns: _Columns,
) -> tuple[_Columns, Rows, str]:
    """Check that exactly one source is given; return its resolved columns, rows and a name for errors."""
    sources = {"hub": hub, "file": file, "records": records}
    given = [name for name, value in sources.items() if value is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of hub, file or records (got {', '.join(given) or 'none'})")
    if hub is not None:
        return *_hub_rows(hub, config, split, columns), f"dataset {hub!r}"
    if file is not None:
        return *_file_rows(Path(file), columns), f"file {str(file)!r}"
    if isinstance(records, (str, bytes, Mapping)):
        raise ValueError("records must be a list of dicts")
    return *_mapping_rows(records, columns, "records"), "records"


@dataclass(frozen=True)
class _Columns:
    """Column names asked for, and the conversion of one row into a Record."""

    text: str
    summary: str | None
    id: str | None

    def check(self, available: Sequence[str], where: str = "") -> _Columns:
        """Raise MissingColumnError for a missing text/summary column; drop an absent id column."""
        if self.text not in available:
            raise MissingColumnError(self.text, "text", available, where)
        if self.summary is not None and self.summary not in available:
            raise MissingColumnError(self.summary, "summary", available, where)
        if self.id is not None and self.id not in available:
            return _Columns(self.text, self.summary, None)
        return self

    def needed(self) -> list[str]:
        return [c for c in (self.id, self.text, self.summary) if c is not None]

    def record(self, index: int, row: Mapping[str, Any]) -> Record:
        record_id = str(index) if self.id is None else _as_id(row[self.id], index, self.id)
        text = _as_text(row[self.text], record_id, self.text)
        reference = None if self.summary is None else _as_text(row[self.summary], record_id, self.summary)
        return Record(record_id, text, reference)


def _as_id(value: Any, index: int, column: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(
            f"record at row {index}: id column {column!r} holds {value!r}; expected a string or integer"
        )
    record_id = str(value).strip()
    if not record_id:
        raise ValueError(f"record at row {index}: id column {column!r} is empty")
    return record_id


def _as_text(value: Any, record_id: str, column: str) -> str:
    if value is None:
        raise ValueError(f"record {record_id!r}: no value in column {column!r}")
    if not isinstance(value, str):
        kind = type(value).__name__
        raise ValueError(f"record {record_id!r}: column {column!r} holds {kind}, expected a string")
    if not value.strip():
        raise ValueError(f"record {record_id!r}: column {column!r} is empty")
    return value


def _check_unique_ids(records: list[Record]) -> None:
    first_row: dict[str, int] = {}
    for row, record in enumerate(records):
        if record.id in first_row:
            rows = f"rows {first_row[record.id]} and {row}"
            raise ValueError(f"duplicate id {record.id!r} at {rows}; ids must be unique")
        first_row[record.id] = row


def _mapping_rows(rows: Iterable[Any], columns: _Columns, source: str) -> tuple[_Columns, Rows]:
    """Rows that are dicts with their own keys (a list, JSON lines).

    The first row decides whether ids come from the id column; every row is checked as it is read.
    """
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return columns, iter(())
    _check_mapping(first, 0, source)
    resolved = columns.check(list(first), f"{source} row 0")

    def checked() -> Rows:
        yield first
        for index, row in enumerate(rows, start=1):
            _check_mapping(row, index, source)
            resolved.check(list(row), f"{source} row {index}")
            if resolved.id is not None and resolved.id not in row:
                raise MissingColumnError(resolved.id, "id", row, f"{source} row {index}")
            yield row

    return resolved, checked()


def _check_mapping(row: Any, index: int, source: str) -> None:
    if not isinstance(row, Mapping):
        kind = type(row).__name__
        raise ValueError(f"{source} row {index} is {kind}, expected an object with named fields")


def _hub_rows(hub: str, config: str | None, split: str, columns: _Columns) -> tuple[_Columns, Rows]:
    """Rows of `datasets.load_dataset(hub, config, split=split)`, only the needed columns."""
    import datasets  # heavy import (about a second); only hub sources pay for it

    dataset = datasets.load_dataset(hub, config, split=split)
    resolved = columns.check(dataset.column_names, f"dataset {hub!r} split {split!r}")
    return resolved, iter(dataset.select_columns(resolved.needed()))


def _file_rows(path: Path, columns: _Columns) -> tuple[_Columns, Rows]:
    file_format = FILE_FORMATS.get(path.suffix.lower())
    if file_format is None:
        raise ValueError(
            f"unsupported file type {path.suffix or '(no extension)'!r} for {path}; "
            f"expected one of {', '.join(FILE_FORMATS)}"
        )
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    readers = {"json": _json_rows, "csv": _csv_rows, "parquet": _parquet_rows}
    return readers[file_format](path, columns)


def _json_rows(path: Path, columns: _Columns) -> tuple[_Columns, Rows]:
    """A JSON array of objects, or JSON lines (one object per line, blank lines skipped)."""
    with path.open(encoding="utf-8-sig") as handle:
        is_array = handle.read(4096).lstrip().startswith("[")
    if is_array:
        try:
            data = json.loads(path.read_text(encoding="utf-8-sig"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {error.lineno}: invalid JSON ({error.msg})") from None
        return _mapping_rows(data, columns, path.name)
    return _mapping_rows(_json_lines(path), columns, path.name)


def _json_lines(path: Path) -> Iterator[Any]:
    with path.open(encoding="utf-8-sig") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {line_number}: invalid JSON ({error.msg})") from None


def _csv_rows(path: Path, columns: _Columns) -> tuple[_Columns, Rows]:
    """CSV with a header row; every value stays a string."""
    # Articles can exceed the csv module's default 128 KiB field limit.
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))
    with path.open(encoding="utf-8-sig", newline="") as handle:
        header = next(csv.reader(handle), [])
    resolved = columns.check(header, path.name)

    def rows() -> Rows:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            try:
                yield from reader
            except csv.Error as error:
                raise ValueError(f"{path}, line {reader.line_num}: bad CSV ({error})") from None

    return resolved, rows()


def _parquet_rows(path: Path, columns: _Columns) -> tuple[_Columns, Rows]:
    """Parquet, read in batches of only the needed columns."""
    parquet = pq.ParquetFile(path)
    resolved = columns.check(parquet.schema_arrow.names, path.name)

    def rows() -> Rows:
        for batch in parquet.iter_batches(batch_size=1024, columns=resolved.needed()):
            yield from batch.to_pylist()

    return resolved, rows()
