"""Rows of local JSONL / JSON / CSV / Parquet files, read a bounded piece at a time.

`file_rows(path)` returns the file's column names when the format declares them (CSV
header, Parquet schema; None for JSON, whose rows carry their own keys) and an iterator
over its rows as dicts. Nothing is read whole:

- JSON lines: one line at a time, in binary, at most `max_line_bytes` per line;
- a JSON array: element by element through an incremental decoder, at most
  `max_line_bytes` of text per element;
- CSV: line by line, at most `max_line_bytes` per row (a quoted field may span lines);
- Parquet: in small batches through a buffered reader; a row group whose needed columns
  exceed `max_line_bytes x PARQUET_ROW_GROUP_FACTOR` (uncompressed) is refused from the
  file's metadata, before any data is read (pyarrow holds part of a row group while it
  streams it: a 142 MB row group peaked near 60 MB).

A piece over its budget raises `TooLarge` after reading at most the budget, so a 500 MB file
without a newline costs `max_line_bytes`, not 500 MB. Other problems (invalid JSON or UTF-8,
nesting too deep, a bad CSV row) are `ValueError`s naming the file (as `name`) and the line
or element; OS errors (`OSError`) pass through for the caller to report.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import pyarrow.parquet as pq

FILE_FORMATS = {
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
PARQUET_ROW_GROUP_FACTOR = 16
_PARQUET_BATCH_ROWS = 64
_READ_CHUNK = 1 << 16
_BOM = b"\xef\xbb\xbf"

Rows = Iterator[Mapping[str, Any]]


class TooLarge(ValueError):
    """A line, row, array element or row group larger than the reader's byte budget."""


def file_format(path: Path) -> str:
    """``json``, ``csv`` or ``parquet`` from the extension; ValueError for any other."""
    found = FILE_FORMATS.get(path.suffix.lower())
    if found is None:
        raise ValueError(
            f"unsupported file type {path.suffix or '(no extension)'!r}; expected one of {', '.join(FILE_FORMATS)}"
        )
    return found


def file_rows(
    path: Path, name: str, needed: Sequence[str] | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> tuple[list[str] | None, Rows]:
    """The file's declared columns (None for JSON) and its rows, read lazily.

    `name` is how messages call the file; `needed` limits the Parquet columns read (None: all
    that exist).
    """
    kind = file_format(path)
    if kind == "csv":
        return _csv_rows(path, name, max_line_bytes)
    if kind == "parquet":
        return _parquet_rows(path, name, needed, max_line_bytes)
    with path.open("rb") as handle:
        is_array = handle.read(4096).removeprefix(_BOM).lstrip().startswith(b"[")
    rows = _json_array(path, name, max_line_bytes) if is_array else _json_lines(path, name, max_line_bytes)
    return None, rows


def _size(budget: int) -> str:
    return f"{budget / 1024 / 1024:g} MiB" if budget >= 1024 * 1024 else f"{budget} bytes"


def _loads(text: str | bytes) -> Any:
    """`json.loads` with every failure as ValueError (deep nesting and huge numbers included)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"invalid JSON ({error.msg})") from None
    except RecursionError:
        raise ValueError("invalid JSON (nested too deeply)") from None
    except ValueError as error:  # e.g. an integer with more digits than Python converts
        raise ValueError(f"invalid JSON ({error})") from None


class _Lines:
    """Decoded lines of a binary file, each cut off at the budget: a longer one raises `TooLarge`.

    `unit_bytes` counts the bytes read since `new_unit()`, so a CSV row spread over several
    lines is bounded as a whole. An iterator object rather than a generator, so that nothing
    keeps a line alive once its reader let go of it (a long line costs one copy at a time).
    """

    def __init__(self, handle: BinaryIO, name: str, budget: int):
        self.handle, self.name, self.budget = handle, name, budget
        self.number = 0
        self.unit_bytes = 0

    def new_unit(self) -> None:
        self.unit_bytes = 0

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        raw = self.handle.readline(self.budget + 1)
        if not raw:
            raise StopIteration
        self.number += 1
        if self.number == 1:
            raw = raw.removeprefix(_BOM)
        self.unit_bytes += len(raw)
        if self.unit_bytes > self.budget:
            raise TooLarge(f"{self.name}, line {self.number}: more than {_size(self.budget)} in one record "
                           "(the most read as one piece); refused without reading further")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.name}, line {self.number}: not UTF-8 text") from None


def _json_lines(path: Path, name: str, budget: int) -> Rows:
    """One JSON value per line; blank lines skipped."""
    with path.open("rb") as handle:
        lines = _Lines(handle, name, budget)
        for line in lines:
            lines.new_unit()
            if not line or line.isspace():
                continue
            try:
                row = _loads(line)
            except ValueError as error:
                raise ValueError(f"{name}, line {lines.number}: {error}") from None
            del line  # only the row is kept of a long line
            yield row


def _json_array(path: Path, name: str, budget: int) -> Rows:
    """The elements of a top-level JSON array, decoded one at a time from a sliding text buffer."""
    with path.open(encoding="utf-8-sig") as handle:
        reader = _ArrayReader(handle, name)
        if reader.next_char() != "[":
            raise reader.invalid("expected '['")
        reader.pos += 1
        if reader.next_char() == "]":
            return
        index = 0
        while True:
            yield reader.element(index, budget)
            index += 1
            separator = reader.next_char()
            if separator == "]":
                return
            if separator != ",":
                raise reader.invalid("expected ',' or ']' after an element")
            reader.pos += 1


class _ArrayReader:
    """A text buffer over a file that grows by chunks and drops what was decoded (see `_json_array`)."""

    _decoder = json.JSONDecoder()

    def __init__(self, handle: TextIO, name: str):
        self.handle, self.name = handle, name
        self.buffer, self.pos = "", 0
        self.line = 1  # the line where the buffer starts

    def fill(self) -> bool:
        """Drop the decoded part, read another chunk (at least as much as is buffered); False at the end."""
        self.line += self.buffer.count("\n", 0, self.pos)
        self.buffer, self.pos = self.buffer[self.pos :], 0
        try:
            chunk = self.handle.read(max(_READ_CHUNK, len(self.buffer)))
        except UnicodeDecodeError:
            raise ValueError(f"{self.name}, line {self.line}: not UTF-8 text") from None
        self.buffer += chunk
        return bool(chunk)

    def next_char(self) -> str:
        """The next character that is not white space ('' at the end of the file), not consumed."""
        while True:
            while self.pos < len(self.buffer) and self.buffer[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buffer) or not self.fill():
                return self.buffer[self.pos] if self.pos < len(self.buffer) else ""

    def element(self, index: int, budget: int) -> Any:
        """Decode the value at the cursor, reading more while it is incomplete, up to `budget` characters."""
        self.next_char()
        too_large = TooLarge(f"{self.name}: element {index} of the JSON array is more than {_size(budget)} "
                             "(the most read as one record); refused without reading further")
        while True:
            try:
                value, end = self._decoder.raw_decode(self.buffer, self.pos)
            except json.JSONDecodeError as error:
                if len(self.buffer) - self.pos > budget:
                    raise too_large from None
                if self.fill():
                    continue
                raise self.invalid(error.msg) from None
            except RecursionError:
                raise self.invalid("nested too deeply") from None
            if end - self.pos > budget:
                raise too_large
            self.pos = end
            return value

    def invalid(self, message: str) -> ValueError:
        line = self.line + self.buffer.count("\n", 0, self.pos)
        return ValueError(f"{self.name}, line {line}: invalid JSON ({message})")


def _csv_rows(path: Path, name: str, budget: int) -> tuple[list[str], Rows]:
    """CSV with a header row; every value stays a string (an id such as "007" keeps its zeros)."""
    # A field may be as long as a row; csv's default limit (128 KiB) is below an article's worst case.
    csv.field_size_limit(max(csv.field_size_limit(), budget))
    with path.open("rb") as handle:
        header = next(csv.reader(_Lines(handle, name, budget)), [])

    def rows() -> Rows:
        with path.open("rb") as handle:
            lines = _Lines(handle, name, budget)
            reader = csv.reader(lines)
            next(reader, None)
            try:
                for values in reader:
                    lines.new_unit()
                    if values:  # a blank line is no row; missing trailing values read as None
                        yield dict(zip(header, values + [None] * (len(header) - len(values))))
            except csv.Error as error:
                raise ValueError(f"{name}, line {lines.number}: bad CSV ({error})") from None

    return header, rows()


def _parquet_rows(path: Path, name: str, needed: Sequence[str] | None, budget: int) -> tuple[list[str], Rows]:
    """Parquet, in small batches of only the needed columns, each row group checked against the budget first."""
    parquet = pq.ParquetFile(path, buffer_size=_READ_CHUNK, pre_buffer=False)
    columns = parquet.schema_arrow.names
    wanted = [c for c in (needed if needed is not None else columns) if c in columns]
    metadata = parquet.metadata
    limit = budget * PARQUET_ROW_GROUP_FACTOR
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        size = sum(
            row_group.column(c).total_uncompressed_size
            for c in range(row_group.num_columns)
            if row_group.column(c).path_in_schema.split(".")[0] in wanted
        )
        if size > limit:
            raise TooLarge(f"{name}: row group {group} holds {_size(size)} of the needed columns, more than "
                           f"{_size(limit)}; write the file with smaller row groups")

    def rows() -> Rows:
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=wanted):
            yield from batch.to_pylist()

    return columns, rows()
