"""A run folder's files as stored: their schemas, checked before any work, and read and written without
following symbolic links.

A resumed run trusts what an earlier one left: ``predictions.jsonl``'s rows go into the metrics as
they are, ``run.json`` decides what may be resumed. So every row and file is checked against a
pydantic schema first (`PredictionRow`, `RunFile`, `MetricsFile`): fields present and of their
types, ROUGE scores finite numbers from 0 to 100, the other metrics' scores finite numbers, seconds
a finite number, ids unique, the JSON files objects. `check_run_folder` does it all before the model loads (the command line calls it
first); a problem is a `StoredFileError` (a ValueError) naming the file, the line and the field,
for a one-line exit 2.

A run folder's files (`RUN_FILES`) must be plain files: a planted symbolic link (``metrics.json``
pointing at a file elsewhere) would have its target overwritten. `check_out` refuses a folder
holding one, and an ``--out`` that is a file or a dangling link, in one sentence; every open of a
run file here (`open_run_file`, `write_run_file`) passes ``O_NOFOLLOW`` as well, so a link planted
after the check fails the open instead of being followed.
"""

from __future__ import annotations

import errno
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, field_validator

from bart_opt.runlock import LOCK_FILE

PREDICTIONS_FILE = "predictions.jsonl"
METRICS_FILE = "metrics.json"
RUN_FILE = "run.json"
RUN_FILES = (LOCK_FILE, METRICS_FILE, PREDICTIONS_FILE, RUN_FILE)

Score = Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False, strict=False)]
MetricScore = Annotated[float, Field(allow_inf_nan=False, strict=False)]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, strict=True)]


def _text(value: Any) -> str:
    if not isinstance(value, str):  # not pydantic's own str: an id may hold a lone surrogate (stored escaped)
        raise ValueError(f"must be a string, not {type(value).__name__}")
    return value


Text = Annotated[str, PlainValidator(_text)]


class StoredFileError(ValueError):
    """A run file that does not hold what a run writes; the message names the file, the line and the field."""


class Scores(BaseModel):
    """One ROUGE type's scores, 0-100."""

    model_config = ConfigDict(extra="forbid")

    precision: Score
    recall: Score
    fmeasure: Score


class PredictionRow(BaseModel):
    """One line of ``predictions.jsonl`` (`bart_opt.evaluate.rows`): a model's, a baseline's or another
    system's row. The model-only fields are checked when present."""

    model_config = ConfigDict(extra="allow", strict=True)

    id: Text
    prediction: Text
    reference: Text | list[Text] | None
    rouge: dict[str, Scores] | None
    error: Text | None
    seconds: Seconds
    input_tokens: Count | None = None
    output_tokens: Count | None = None
    truncated: bool | None = None
    padding_computed: Count | None = None
    padding_avoided: Count | None = None
    batch_peak_bytes: Count | None = None
    scores: dict[str, dict[str, MetricScore]] | None = None  # the metrics beyond ROUGE (`bart_opt.evaluate.rows`)

    @field_validator("id")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value:
            raise ValueError("must not be empty")
        return value

    @field_validator("seconds", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("must be a number")
        return float(value)


class ComparedRow(PredictionRow):
    """A row as ``bart-opt compare`` reads it: every field it has is checked as in `PredictionRow`; only the
    id is required (a row without ROUGE is left out of the comparison, and counted)."""

    prediction: Text = ""
    reference: Text | list[Text] | None = None
    rouge: dict[str, Scores] | None = None
    error: Text | None = None
    seconds: Seconds = 0.0


class Interval(BaseModel):
    """One ROUGE type's aggregate: the mean (``mid``) and the 95% interval."""

    model_config = ConfigDict(extra="forbid")

    low: Scores
    mid: Scores
    high: Scores


class Dataset(BaseModel):
    """``run.json``'s ``dataset``: where the records came from, how many, and their fingerprint."""

    source: str | None = None
    records: Count
    fingerprint: str


class RunFile(BaseModel):
    """``run.json``: the run record (`bart_opt.evaluate.record`) and the dataset's fingerprint."""

    model_config = ConfigDict(extra="allow")

    model: str
    generation: dict | None = None
    fingerprint: str | None = None
    engine: dict | None = None
    rouge_settings: dict | None = None
    dataset: Dataset | None = None
    history: list[dict] = Field(default_factory=list)


class MetricsFile(BaseModel):
    """``metrics.json``: the counts and the ROUGE of a finished run."""

    model_config = ConfigDict(extra="allow")

    model: str
    n_obs: Count
    n_scored: Count
    rouge: dict[str, Interval] | None
    baselines: dict[str, dict] | None = None


def _problem(error: ValidationError) -> str:
    """The first problem pydantic found, as ``field 'a.b': message``."""
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the value"
    message = first["msg"].removeprefix("Value error, ")
    value = first.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" (got {json.dumps(value) if _jsonable(value) else value!r})"
    return f"field {where!r}: {message}{shown}"


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, bool)) or (isinstance(value, float) and math.isfinite(value))


def parse_row(line: str | bytes, path: str | Path, number: int, schema: type[BaseModel] = PredictionRow) -> dict:
    """The prediction row on line `number` of `path`, checked against `schema`; `StoredFileError`
    naming them and the field otherwise."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise StoredFileError(f"{path}: line {number} is not valid JSON ({error.msg})") from None
    if not isinstance(row, dict) or "id" not in row:
        raise StoredFileError(f"{path}: line {number} is not a prediction row (no 'id')")
    try:
        schema.model_validate(row)
    except ValidationError as error:
        raise StoredFileError(f"{path}: line {number}: {_problem(error)}") from None
    return row


def parse_rows(data: bytes, path: Path, schema: type[BaseModel] = PredictionRow) -> Iterator[tuple[int, dict]]:
    """``(line number, row)`` of each complete line of a predictions file's bytes, checked, ids unique (a
    torn last line, without its newline, is left out)."""
    seen: dict[str, int] = {}
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        row = parse_row(line, path, number, schema)
        if row["id"] in seen:
            raise StoredFileError(f"{path}: line {number}: id {row['id']!r} is already on line {seen[row['id']]}; "
                                  "a run stores one row per example")
        seen[row["id"]] = number
        yield number, row


def read_rows(path: Path, schema: type[BaseModel] = PredictionRow) -> list[dict]:
    """Every row of a predictions file (`parse_rows`), read without following a link."""
    with open_run_file(path, os.O_RDONLY) as f:
        data = f.read()
    return [row for _, row in parse_rows(data, path, schema)]


def read_json_file(path: Path, schema: type[BaseModel]) -> dict:
    """The JSON object in `path`, checked against `schema`; `StoredFileError` naming the file and the field."""
    with open_run_file(path, os.O_RDONLY) as f:
        text = f.read().decode("utf-8", "replace")
    if not text.strip():
        raise StoredFileError(f"{path} is empty; it should hold the run's JSON object (delete it, or --overwrite)")
    try:
        content = json.loads(text)
    except json.JSONDecodeError as error:
        raise StoredFileError(f"{path} is not valid JSON (line {error.lineno}: {error.msg})") from None
    if not isinstance(content, dict):
        raise StoredFileError(f"{path} holds a JSON {type(content).__name__}, not the object a run writes "
                              "(delete it, or --overwrite)")
    try:
        schema.model_validate(content)
    except ValidationError as error:
        raise StoredFileError(f"{path}: {_problem(error)}") from None
    return content


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that is not a folder (a file, a dangling link) or whose run files are links."""
    if out.is_symlink() and not out.exists():
        raise StoredFileError(f"{out} is a symbolic link to {os.readlink(out)!r}, which does not exist: give --out a "
                              "folder (a new one is created)")
    if out.exists() and not out.is_dir():
        raise StoredFileError(f"{out} is a file, not a folder: give --out a folder (a new one is created)")
    for name in RUN_FILES:
        if (out / name).is_symlink():
            raise StoredFileError(f"{out / name} is a symbolic link; a run folder's files must be plain files (the "
                                  "link's target would be overwritten): remove it, or use another output directory")


def check_run_folder(out: str | Path, *, overwrite: bool = False, rows: bool = True) -> None:
    """Everything `check_out` checks, then (unless `overwrite`: the files are deleted) ``run.json`` and
    ``metrics.json`` against their schemas and, with `rows`, every stored row of ``predictions.jsonl``,
    before any work. Predictions without a run.json are refused: nothing says what made them."""
    out = Path(out)
    check_out(out)
    if overwrite or not out.is_dir():
        return
    predictions = out / PREDICTIONS_FILE
    if not (out / RUN_FILE).exists() and predictions.exists() and predictions.stat().st_size > 0:
        raise StoredFileError(f"{out} holds {PREDICTIONS_FILE} but no {RUN_FILE}, so nothing says which model, "
                              "checkpoint or dataset made those predictions and they are not resumed; use another "
                              "output directory, or --overwrite to start over")
    for name, schema in ((RUN_FILE, RunFile), (METRICS_FILE, MetricsFile)):
        if (out / name).exists():
            read_json_file(out / name, schema)
    if rows and predictions.exists():
        read_rows(predictions)


class open_run_file:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC)`` as a binary file object; a link is refused in one sentence."""

    def __init__(self, path: Path, flags: int, mode: int = 0o644):
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise StoredFileError(f"{path} is a symbolic link; a run folder's files must be plain files: remove "
                                      "it, or use another output directory") from None
            raise
        access = flags & os.O_ACCMODE
        kind = "rb" if access == os.O_RDONLY else ("ab" if flags & os.O_APPEND else ("r+b" if access == os.O_RDWR
                                                                                    else "wb"))
        self.file = os.fdopen(fd, kind)

    def __enter__(self):
        return self.file

    def __exit__(self, *exc_info: object) -> None:
        self.file.close()


def write_run_file(path: Path, text: str) -> None:
    """Replace `path`'s contents with `text` (UTF-8), never through a link."""
    with open_run_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) as f:
        f.write(text.encode("utf-8"))


__all__ = ["METRICS_FILE", "PREDICTIONS_FILE", "RUN_FILE", "RUN_FILES", "ComparedRow", "MetricsFile", "PredictionRow",
           "RunFile", "StoredFileError", "check_out", "check_run_folder", "open_run_file", "parse_row", "parse_rows",
           "read_json_file",
           "read_rows", "write_run_file"]
