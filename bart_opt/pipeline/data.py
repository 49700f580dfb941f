"""Evaluation records from a hub dataset, a local JSONL / JSON / CSV / Parquet file, or a Python list.

`iter_records` streams `Record(id, text, reference)`s from one source, checking each as it
is read: nothing is held but the record at hand, so a caller that stores them as they come
(the service's jobs) needs memory for one record, not for the dataset. `load_records` reads
them all into a list and also checks that the ids are unique (the CLI). Columns are named by
the caller (`text_column`, `summary_column`, `id_column`; CNN/DailyMail's `article`,
`highlights`, `id` by default). Problems are `ValueError`s that name the record or the
column at fault, so a service can hand them to its client as they are.

Hub datasets are streamed through `datasets.load_dataset(..., streaming=True)` (network, or a
local dataset folder), so `limit` bounds what is downloaded and no data files are cached.
Local files are read in bounded pieces by `bart_opt.pipeline.readers` (no cache copy is written, CSV
values stay strings, a broken JSON line is reported with its line number, and a line larger
than `max_line_bytes` is refused without reading it whole).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from bart_opt.pipeline.readers import (
    DEFAULT_MAX_LINE_BYTES,
    FILE_FORMATS,
    Rows,
    file_format,
    file_rows,
)

__all__ = ["DEFAULT_MAX_LINE_BYTES", "FILE_FORMATS", "HubUnavailable", "MissingColumnError", "Record",
           "RecordStream", "check_id", "iter_records", "load_records"]


@dataclass(frozen=True, slots=True)
class Record:
    """One input to summarize: a unique id, the text, and the reference summary (or None)."""

    id: str
    text: str
    reference: str | None = None


class HubUnavailable(OSError):
    """A hub dataset that could not be opened or read (no network, no such dataset, config or
    split, a failure mid-stream); the loader's own exception is chained as ``__cause__``."""


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
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> list[Record]:
    """Read every record of exactly one of `hub`, `file` or `records` (see `iter_records`).

    Raises what `iter_records` raises, and ValueError for no records at all or duplicate ids.
    """
    stream = iter_records(hub=hub, config=config, split=split, file=file, records=records,
                          text_column=text_column, summary_column=summary_column, id_column=id_column,
                          limit=limit, max_line_bytes=max_line_bytes)
    result = list(stream)
    if not result:
        raise ValueError(f"no records in {stream.source}")
    _check_unique_ids(result)
    return result


def iter_records(
    hub: str | None = None,
    config: str | None = None,
    split: str = "test",
    file: str | Path | None = None,
    records: Sequence[Mapping[str, Any]] | None = None,
    text_column: str = "article",
    summary_column: str | None = "highlights",
    id_column: str | None = "id",
    limit: int | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    *,
    name: str | None = None,
) -> RecordStream:
    """Open exactly one of `hub`, `file` or `records` and stream its records.

    The source is opened and its columns checked now; records are read and checked as the
    result is iterated. Ids are not checked for uniqueness (that needs every id: `load_records`
    does it, the service's store does it with an index).

    Args:
        hub: a dataset name on the Hugging Face hub (e.g. "abisee/cnn_dailymail") or a local
            dataset folder, streamed with `datasets.load_dataset(hub, config, split=split,
            streaming=True)`.
        config: the dataset configuration (e.g. "3.0.0"); hub only.
        split: the split to read; hub only.
        file: a local file; the format comes from the extension: .jsonl/.ndjson (one JSON object
            per line), .json (a JSON array of objects, or JSON lines), .csv (with a header row),
            .parquet/.pq.
        records: a list of dicts.
        text_column: the column holding the text to summarize.
        summary_column: the column holding the reference summary, or None when there are no
            references (every `Record.reference` is then None).
        id_column: the column holding unique ids, kept exactly as given (see `check_id`). When
            the source has no such column at all (or it is None) every id is its row position as
            a string ("0", "1", ...), stable across reruns. A source that has the column for some
            records and not for others is refused, naming the first row that breaks the pattern:
            ids are never made up for some records and taken from the data for others.
        limit: read at most this many records, from the start.
        max_line_bytes: the most bytes of a file read as one piece (a line, a CSV row, an array
            element; see `bart_opt.pipeline.readers`); a larger one raises `bart_opt.pipeline.readers.TooLarge`.
        name: how messages call `file` (default: the path as given), e.g. a path relative to
            a data folder that should not reveal where that folder is.

    Raises:
        MissingColumnError: the text or summary column is missing (lists those that exist).
        ValueError: no source or several, an unknown file extension, a broken JSON line, a bad
            `limit`, or (while iterating) a record whose text or reference is empty or not a
            string, or whose id breaks `check_id` (the message names the record or its row).
        FileNotFoundError: `file` does not exist.
        OSError: `file` cannot be read.
        HubUnavailable: the hub dataset cannot be opened or (while iterating) read.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    if not isinstance(text_column, str) or not text_column:
        raise ValueError("text_column must be a non-empty string")
    requested = _Columns(text_column, summary_column, id_column)
    sources = {"hub": hub, "file": file, "records": records}
    given = [key for key, value in sources.items() if value is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of hub, file or records (got {', '.join(given) or 'none'})")
    if hub is not None:
        columns, rows = _hub_rows(hub, config, split, requested)
        source = f"dataset {hub!r}"
    elif file is not None:
        name = str(file) if name is None else name
        columns, rows = _file_rows(Path(file), requested, name, max_line_bytes)
        source = f"file {name!r}"
    else:
        if isinstance(records, (str, bytes, Mapping)):
            raise ValueError("records must be a list of dicts")
        columns, rows = _mapping_rows(records, requested, "records")
        source = "records"
    return RecordStream(columns, rows, source, limit)


class RecordStream:
    """The records of one opened source, read and checked as they are iterated (once).

    `source` names the source for messages ("file 'cnn.jsonl'", "dataset 'abisee/cnn_dailymail'").
    `close()` releases the file or connection early when not every record is wanted.
    """

    def __init__(self, columns: _Columns, rows: Rows, source: str, limit: int | None):
        self.columns = columns
        self.source = source
        self._rows = rows
        self._limit = limit

    def __iter__(self) -> Iterator[Record]:
        for index, row in enumerate(islice(self._rows, self._limit)):
            yield self.columns.record(index, row)

    def close(self) -> None:
        close = getattr(self._rows, "close", None)
        if close is not None:
            close()


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
        """The columns asked for (the id column only when given)."""
        return [c for c in (self.id, self.text, self.summary) if c is not None]

    def record(self, index: int, row: Mapping[str, Any]) -> Record:
        record_id = str(index) if self.id is None else check_id(row[self.id], index, self.id)
        text = _as_text(row[self.text], record_id, self.text)
        reference = None if self.summary is None else _as_text(row[self.summary], record_id, self.summary)
        return Record(record_id, text, reference)


def check_id(value: Any, index: int, column: str) -> str:
    """The id of the record at row `index` as stored: `value` itself (an integer as its digits).

    One rule for every source (files, hub datasets, inline records; the CLI and the service):
    an id is a string or an integer; it is not empty, has no white space at either end (it is
    never stripped: " a " and "a" would be two names for one record), and is not ``.`` or
    ``..`` (no URL path can name such an example: clients resolve them away). Anything else
    raises ValueError naming the row.
    """
    if value is None:
        raise ValueError(f"record at row {index}: no id (column {column!r} is empty)")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(
            f"record at row {index}: id column {column!r} holds {_shown(value)}; expected a string or integer"
        )
    record_id = str(value)
    if not record_id:
        raise ValueError(f"record at row {index}: id column {column!r} is empty")
    if record_id != record_id.strip():
        raise ValueError(f"record at row {index}: id {_shown(record_id)} has white space at its start or end; "
                         "ids are kept as given, so remove it from the data")
    if record_id in (".", ".."):
        raise ValueError(f"record at row {index}: id {record_id!r} cannot name an example in a URL path; rename it")
    return record_id


def _shown(value: Any, limit: int = 80) -> str:
    """`value`'s repr for a message, its middle cut out when it is long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 4 :]}"


def _as_text(value: Any, record_id: str, column: str) -> str:
    if value is None:
        raise ValueError(f"record {record_id!r}: no value in column {column!r}")
    if not isinstance(value, str):
        kind = type(value).__name__
        raise ValueError(f"record {record_id!r}: column {column!r} holds {kind}, expected a string")
    if not value or value.isspace():  # no stripped copy of a long text
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

    The first row says whether the source has ids; a later row that says otherwise is refused
    (see `iter_records`). Every row is checked as it is read.
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
            if columns.id is not None and (resolved.id is None) == (columns.id in row):
                has, lacks = (index, 0) if resolved.id is None else (0, index)
                raise ValueError(f"{source} row {has} has an id ({columns.id!r}) but row {lacks} has none: give "
                                 "every record an id, or none (then the ids are the row numbers)")
            yield row

    return resolved, checked()


def _check_mapping(row: Any, index: int, source: str) -> None:
    if not isinstance(row, Mapping):
        kind = type(row).__name__
        raise ValueError(f"{source} row {index} is {kind}, expected an object with named fields")


def _hub_rows(hub: str, config: str | None, split: str, columns: _Columns) -> tuple[_Columns, Rows]:
    """Rows of `datasets.load_dataset(hub, config, split=split, streaming=True)`, as they arrive."""
    import datasets  # heavy import (about a second); only hub sources pay for it

    where = f"dataset {hub!r}" + (f" config {config!r}" if config else "") + f" split {split!r}"
    try:
        rows = iter(datasets.load_dataset(hub, config, split=split, streaming=True))
    except Exception as error:  # noqa: BLE001 - every loader failure is the source's, reported as one kind
        raise HubUnavailable(f"could not open {where}: {error}") from error

    def guarded() -> Rows:
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except Exception as error:  # noqa: BLE001 - as above, mid-stream
                raise HubUnavailable(f"could not read {where}: {error}") from error
            yield row

    return _mapping_rows(guarded(), columns, where)


def _file_rows(path: Path, columns: _Columns, name: str, max_line_bytes: int) -> tuple[_Columns, Rows]:
    try:
        file_format(path)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {name}")
    declared, rows = file_rows(path, name, columns.needed(), max_line_bytes)
    if declared is None:
        return _mapping_rows(rows, columns, name)
    return columns.check(declared, name), rows
