"""Record ids are kept as given on every path into a job (inline records, JSONL, CSV), and the CLI's.

The rule is `bart_opt.pipeline.data.check_id`'s: a source has ids for every record (each kept exactly,
refused with its row when empty, white-space-padded, ``.`` or ``..``) or for none (then every id
is its row number). A job's examples are then found by the ids the client gave.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bart_opt.cli import main
from tests.app.helpers import FAST, live_server, serving
from tests.app.jobs.helpers import data_dir, make_jobs_app, prediction_rows, wait_for_job, write_jsonl  # noqa: F401


@pytest.fixture(scope="module")
def module_data(tmp_path_factory):
    return tmp_path_factory.mktemp("ids-data")


@pytest.fixture(scope="module")
def client(demo_checkpoint, module_data, tmp_path_factory):
    from app.main import create_app
    from app.settings import Settings

    settings = Settings(model=demo_checkpoint, db=str(tmp_path_factory.mktemp("ids-db") / "jobs.db"),
                        data_dir=str(module_data))
    with serving(create_app(settings)) as test_client:
        yield test_client


def record(record_id=None, text="The council met on Monday and voted.", reference="The council voted."):
    row = {"text": text, "reference": reference}
    return row if record_id is None else {"id": record_id, **row}


def submit(client, records):
    return client.post("/evaluate", json={"dataset": {"records": records}, "generation": FAST})


@pytest.mark.parametrize(("records", "words"), [
    ([record(), record("b"), record("c")], "records row 1 has an id ('id') but row 0 has none"),
    ([record("a"), record("b"), record()], "records row 0 has an id ('id') but row 2 has none"),
    ([record("a"), record(" b")], "row 1: id ' b' has white space at its start or end"),
    ([record("a "), record("b")], "row 0: id 'a ' has white space at its start or end"),
    ([record("a"), record("..")], "row 1: id '..' cannot name an example in a URL path"),
    ([record(".")], "row 0: id '.' cannot name an example in a URL path"),
])  # fmt: skip
def test_records_whose_ids_would_be_changed_are_refused_naming_the_row(client, records, words):
    response = submit(client, records)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_dataset" and error["field"] == "dataset.records"
    assert words in error["message"]


@pytest.mark.parametrize(("name", "content", "words"), [
    ("pad.jsonl", [{"id": "a", "article": "Text one.", "highlights": "One."},
                   {"id": "b ", "article": "Text two.", "highlights": "Two."}], "row 1: id 'b ' has white space"),
    ("late.jsonl", [{"article": "Text one.", "highlights": "One."},
                    {"id": "sample-0-00001", "article": "Text two.", "highlights": "Two."}],
     "row 1 has an id ('id') but row 0 has none"),
    ("pad.csv", "id,article,highlights\n a,Text one.,One.\n", "row 0: id ' a' has white space"),
])  # fmt: skip
def test_files_whose_ids_would_be_changed_are_refused_naming_the_row(client, module_data, name, content, words):
    path = module_data / name
    path.write_text(content if isinstance(content, str) else "".join(json.dumps(row) + "\n" for row in content))
    response = client.post("/evaluate", json={"dataset": {"file": name}, "generation": FAST})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "dataset.file" and words in response.json()["error"]["message"]


def test_a_source_without_ids_is_numbered_and_given_ids_are_kept_exactly(make_jobs_app):
    """Over a real server: Starlette's TestClient decodes a path twice (``%252e`` arrives as ``.``)."""
    odd = ["a b", "a/..", "%2e%2e", "x?y#z", "...", "0007", "é/ü", "a%2Fb"]
    with live_server(make_jobs_app()) as (host, port), httpx.Client(base_url=f"http://{host}:{port}") as client:
        numbered = submit(client, [record(), record()])
        kept = submit(client, [record(record_id) for record_id in odd])
        assert numbered.status_code == kept.status_code == 202, (numbered.text, kept.text)
        for job, ids in ((numbered.json(), ["0", "1"]), (kept.json(), odd)):
            assert wait_for_job(client, job["id"])["status"] == "succeeded"
            assert [row["id"] for row in prediction_rows(client, job["id"])] == ids
            for record_id in ids:  # each example is found by its id sent as one path segment
                example = client.get(f"/evaluate/{job['id']}/examples/{quote(record_id, safe='')}")
                assert example.status_code == 200, (record_id, example.text)
                assert example.json()["id"] == record_id


def refused_rows(ids: list[str]) -> dict[int, str]:
    """The oracle: every rule the service applies to a client's ids (`bart_opt.pipeline.data.check_id`, then the job
    intake's `app.jobs.intake.Intake.check`), as {row: the words of its refusal}. Ids are strings here, so
    the type rules cannot apply; the strategy draws valid Unicode, so the surrogate rule cannot either."""
    refused = {}
    for row, record_id in enumerate(ids):
        if not record_id:
            refused[row] = "is empty"
        elif record_id.strip() != record_id:  # str.strip: Unicode white space, U+0085 and U+3000 included
            refused[row] = "has white space at its start or end"
        elif record_id in (".", ".."):
            refused[row] = "cannot name an example in a URL path"
        elif "\x00" in record_id:  # PostgreSQL's text cannot hold it, so no backend stores it
            refused[row] = "holds a NUL character (U+0000)"
    return refused


@given(st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=8), min_size=1, max_size=3, unique=True))
@example(["a", "a\u2028b"])  # NDJSON leaves U+2028 raw inside strings: a reader must split at "\n" only
@example(["a\x85b", "c\rd", "e\nf", 'g"h', "i\\j"])  # U+0085, and what JSON must escape: all kept as sent
@example(["a", "b\x00"])  # NUL
@example(["\u3000a"])  # Unicode white space at the start
@example(["a", "b\x1f"])  # str.strip strips U+001F (a separator), so the service refuses it
@example(["ok", ".."])
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_any_ids_are_stored_as_sent_or_refused_with_their_row(client, ids):
    """Outcome independent of the hypothesis version: the oracle states every rule; each rule has an example."""
    response = submit(client, [record(record_id) for record_id in ids])
    refused = refused_rows(ids)
    if refused:
        assert response.status_code == 422, response.text
        message = response.json()["error"]["message"]
        assert any(f"row {row}:" in message and words in message for row, words in refused.items()), (message, refused)
        return
    assert response.status_code == 202, response.text
    job = wait_for_job(client, response.json()["id"])
    assert [row["id"] for row in prediction_rows(client, job["id"])] == ids


def test_the_cli_refuses_the_same_ids_with_the_same_words(demo_checkpoint, tmp_path, capsys):
    data = tmp_path / "pad.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in [
        {"id": "a", "article": "Text one.", "highlights": "One."}, {"id": " b", "article": "Text.", "highlights": "T."}]))
    status = main(["evaluate", "--model", demo_checkpoint, "--data", str(data), "--out", str(tmp_path / "run"),
                   "--num-beams", "1", "--max-length", "8", "--min-length", "2", "--no-progress"])
    assert status == 2
    assert "row 1: id ' b' has white space at its start or end" in capsys.readouterr().err
    assert not (tmp_path / "run" / "predictions.jsonl").exists()
