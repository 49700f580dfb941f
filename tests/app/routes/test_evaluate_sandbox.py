"""The closed sandbox of POST /evaluate: hub ids only, an allowlist, loading apart from /summarize, file OS errors."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import anyio
import pytest

from bart_opt.pipeline.data import iter_records
from tests.app.helpers import FAST, articles, async_serving, serving, until
from tests.app.jobs.helpers import (  # noqa: F401 - fixtures
    cnn_rows,
    data_dir,
    make_jobs_app,
    prediction_rows,
    sql,
    wait_for_job,
)

SECRET = "the secret text of a local folder"


@pytest.fixture
def reads(monkeypatch):
    """Calls that would read a dataset: `datasets.load_dataset` and the job service's `iter_records`."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append((args, kwargs))
        raise AssertionError("nothing may be read")

    monkeypatch.setattr("datasets.load_dataset", refuse)
    monkeypatch.setattr("app.jobs.service.iter_records", refuse)
    return calls


@pytest.fixture
def local_folder(tmp_path, monkeypatch) -> Path:
    """A dataset folder outside the data dir, also reachable relative to the working directory as org/cnn_like."""
    folder = tmp_path / "org" / "cnn_like"
    folder.mkdir(parents=True)
    (folder / "test.jsonl").write_text(json.dumps({"id": "1", "article": SECRET, "highlights": SECRET}) + "\n")
    monkeypatch.chdir(tmp_path)
    return folder


def test_a_hub_value_naming_a_local_folder_is_refused_before_anything_is_read(make_jobs_app, local_folder, reads):
    values = [str(local_folder), "org/cnn_like", "./org/cnn_like", "org/cnn_like/", "cnn_like", "~/org/cnn_like", "~",
              f"file://{local_folder}", "file:org/cnn_like", "../org/cnn_like", "org/../org/cnn_like", "C:\\org\\x",
              "hf://datasets/org/cnn_like", "json", "org/cnn_like/test.jsonl", "org/.."]
    with serving(make_jobs_app(hub_datasets="*")) as client:
        responses = {value: client.post("/evaluate", json={"dataset": {"hub": value}}) for value in values}
        listed = client.get("/evaluate").json()["jobs"]
    for value, response in responses.items():
        assert response.status_code == 422, (value, response.text)
        error = response.json()["error"]
        assert error["code"] == "dataset_not_allowed" and error["field"] == "dataset.hub", value
        assert SECRET not in response.text
    assert "is not a hub dataset id" in responses[str(local_folder)].json()["error"]["message"]
    assert "also names a file or folder on the server" in responses["org/cnn_like"].json()["error"]["message"]
    assert reads == [] and listed == []


def test_the_allowlist_decides_which_hub_datasets_stream(make_jobs_app, monkeypatch):
    pulled = []

    def stream(*args, **kwargs):  # a streamed split: rows arrive as they are read
        pulled.append(kwargs)
        for row in cnn_rows(50, seed=40):
            pulled.append(row["id"])
            yield row

    monkeypatch.setattr("datasets.load_dataset", stream)
    body = {"dataset": {"hub": "abisee/cnn_dailymail", "config": "3.0.0"}, "limit": 3, "generation": FAST}
    with serving(make_jobs_app()) as client:  # default allowlist: abisee/cnn_dailymail
        other = client.post("/evaluate", json={"dataset": {"hub": "someone/else"}})
        sliced = client.post("/evaluate", json={"dataset": {"hub": "abisee/cnn_dailymail", "split": "test[:10]"}})
        allowed = client.post("/evaluate", json=body)
        assert allowed.status_code == 202, allowed.text
        view = wait_for_job(client, allowed.json()["id"])
    with serving(make_jobs_app(hub_datasets="")) as client:
        disabled = client.post("/evaluate", json=body)
    assert other.status_code == 422 and other.json()["error"]["message"] == (
        "dataset.hub: 'someone/else' is not among the hub datasets this server reads (BART_OPT_HUB_DATASETS): "
        "abisee/cnn_dailymail")
    assert sliced.status_code == 422 and sliced.json()["error"]["field"] == "dataset.split"
    assert disabled.status_code == 422 and "hub datasets are disabled" in disabled.json()["error"]["message"]
    assert view["status"] == "succeeded" and view["progress"]["total"] == 3
    assert pulled == [{"split": "test", "streaming": True}, "doc-0", "doc-1", "doc-2"]  # limit bounds the download


def test_slow_hub_loads_fail_cleanly_and_never_delay_summarize(make_jobs_app, monkeypatch):
    """45 slow hub submissions once pushed /summarize from 0.2 s to 31 s: they held the request threads."""
    loading = []
    release = threading.Event()  # the hub loads hang until /summarize has answered

    def unreachable(*args, **kwargs):
        loading.append(threading.current_thread().name)
        release.wait(60)
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr("datasets.load_dataset", unreachable)
    app = make_jobs_app(hub_datasets="*", dataset_loaders=2)
    body = {"texts": articles(1, seed=41), "generation": FAST}

    async def scenario():
        async with async_serving(app) as client:
            await client.post("/summarize", json=body)  # warm up
            # As few request threads as a busy server has free; hub loads must not take them.
            anyio.to_thread.current_default_thread_limiter().total_tokens = 8
            submissions = [asyncio.create_task(client.post("/evaluate", json={"dataset": {"hub": f"org/ds{i}"}}))
                           for i in range(12)]
            await until(lambda: len(loading) >= 2)
            try:  # answered while both loads still hang, or never (until the 30 s bound)
                summarized = await asyncio.wait_for(client.post("/summarize", json=body), 30)
            finally:
                release.set()
            return summarized, await asyncio.gather(*submissions)

    summarized, submitted = asyncio.run(scenario())
    assert summarized.status_code == 200
    codes = sorted(response.status_code for response in submitted)
    assert codes == [429] * 8 + [502] * 4  # 2 loading and 2 waiting; the rest refused at once
    for response in submitted:
        error = response.json()["error"]
        assert "ConnectionError" not in response.text and "unreachable" not in response.text
        if response.status_code == 502:
            assert error["message"].startswith("dataset.hub: could not reach the hub to load 'org/ds")
        else:
            assert error["code"] == "loaders_busy" and response.headers["retry-after"] == "5"
    assert set(loading) <= {"bart-opt-hub_0", "bart-opt-hub_1"}


def test_file_os_errors_are_422_naming_the_file_as_given(app_client_with_data, data_dir, tmp_path, monkeypatch):
    client = app_client_with_data
    (data_dir / "loop.jsonl").symlink_to(data_dir / "loop.jsonl")
    (data_dir / "folder.jsonl").mkdir()
    (data_dir / "locked.jsonl").write_text(json.dumps(cnn_rows(1)[0]) + "\n")
    long_name = "x" * 300 + ".jsonl"
    deep = "a/" * 100_000 + "x.jsonl"
    real_open = Path.open

    def no_permission(self, *args, **kwargs):
        if self.name == "locked.jsonl":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", no_permission)  # root ignores file modes, so the OS error is simulated
    expected = {
        "loop.jsonl": ("dataset_unreadable", "'loop.jsonl' cannot be read: too many levels of symbolic links"),
        long_name: ("dataset_unreadable", "cannot be read: file name too long"),
        deep: ("path_not_allowed", "the file name is longer than 4096 bytes"),
        "folder.jsonl": ("dataset_not_found", "'folder.jsonl' in the data directory is not a regular file"),
        "locked.jsonl": ("dataset_unreadable", "'locked.jsonl' cannot be read: permission denied"),
    }
    for name, (code, words) in expected.items():
        response = client.post("/evaluate", json={"dataset": {"file": name}})
        assert response.status_code == 422, (name[:40], response.text[:300])
        error = response.json()["error"]
        assert error["code"] == code and error["field"] == "dataset.file" and words in error["message"], error
        assert str(tmp_path) not in response.text and "Error" not in error["message"]
        assert len(error["message"]) < 300
    assert client.get("/evaluate").json()["jobs"] == []


@pytest.fixture
def app_client_with_data(make_jobs_app):
    with serving(make_jobs_app()) as client:
        yield client


def test_bad_lines_and_values_name_the_file_relative_and_never_the_server_path(app_client_with_data, data_dir,
                                                                               tmp_path):
    client = app_client_with_data
    good = json.dumps(cnn_rows(1)[0])
    (data_dir / "broken.jsonl").write_text(good + "\n{not json\n")
    (data_dir / "empty.jsonl").write_text("\n")
    with (data_dir / "one-line.jsonl").open("w") as handle:
        handle.write('{"id": "1", "article": "' + "word " * 400_000)  # 2 MB, no newline
    answers = {}
    for name in ("broken.jsonl", "empty.jsonl", "one-line.jsonl"):
        answers[name] = client.post("/evaluate", json={"dataset": {"file": name}})
    assert answers["broken.jsonl"].json()["error"]["message"] == (
        "dataset.file: broken.jsonl, line 2: invalid JSON (Expecting property name enclosed in double quotes)")
    assert answers["empty.jsonl"].json()["error"]["message"] == "dataset.file: no records in file 'empty.jsonl'"
    assert answers["one-line.jsonl"].status_code == 422
    for response in answers.values():
        assert response.status_code == 422 and str(tmp_path) not in response.text


def test_records_that_cannot_run_fail_alone_and_the_job_goes_on(make_jobs_app, data_dir, direct):
    rows = cnn_rows(5, seed=42)
    rows[1]["article"] = "word " * 1000  # 5,000 characters: more than the limit set below
    lines = [json.dumps(row) for row in rows]
    lines[2] = lines[2].replace('"article": "', '"article": "\\ud800 ', 1)  # a lone surrogate
    lines[3] = lines[3].replace('"highlights": "', '"highlights": "\\udfff', 1)
    (data_dir / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    with serving(make_jobs_app(max_record_chars=4000)) as client:
        response = client.post("/evaluate", json={"dataset": {"file": "mixed.jsonl"}, "generation": FAST})
        assert response.status_code == 202, response.text
        view = wait_for_job(client, response.json()["id"])
        failures = [json.loads(line) for line in
                    client.get(f"/evaluate/{view['id']}/predictions", params={"errors": "only"}).text.split("\n")[:-1]]
        succeeded = prediction_rows(client, view["id"])
    assert view["status"] == "succeeded" and view["progress"] == {**view["progress"], "done": 5, "failed": 3}
    assert view["links"]["errors"] == f"/evaluate/{view['id']}/predictions?errors=only"
    assert [(row["id"], row["error"]) for row in failures] == [
        ("doc-1", "the text has 5,000 characters, more than the 4,000 a record may have (BART_OPT_MAX_RECORD_CHARS)"),
        ("doc-2", "text: character 0 (U+D800) is a lone surrogate, not valid Unicode text; send UTF-8"),
        ("doc-3", "reference: character 0 (U+DFFF) is a lone surrogate, not valid Unicode text; send UTF-8"),
    ]
    good = [direct.summarize([rows[i]["article"]], [rows[i]["highlights"]], **FAST) for i in (0, 4)]
    assert [row["prediction"] for row in succeeded if row["error"] is None] == [r.summaries[0] for r in good]
    assert view["rouge"] is not None and view["tokens"]["input"] == sum(r.items[0]["input_tokens"] for r in good)


def test_a_job_whose_every_record_fails_is_failed_with_the_first_reasons(app_client_with_data):
    body = ('{"dataset": {"records": [{"id": "a", "text": "\\ud800"}, {"id": "b", "text": "x \\udc00"}]},'
            ' "summary_column": null}')
    response = app_client_with_data.post("/evaluate", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 202, response.text
    view = wait_for_job(app_client_with_data, response.json()["id"])
    assert view["status"] == "failed" and view["rouge"] is None and view["progress"]["failed"] == 2
    assert view["error"] == ("all 2 examples failed; the first: 'a': text: character 0 (U+D800) is a lone surrogate, "
                             "not valid Unicode text; send UTF-8; 'b': text: character 2 (U+DC00) is a lone "
                             "surrogate, not valid Unicode text; send UTF-8")


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"limit": "5"}, "limit", "valid integer"),
    ({"limit": 5.0}, "limit", "valid integer"),
    ({"limit": True}, "limit", "valid integer"),
    ({"limit": 10**30}, "limit", "at most 1,000,000 records per job (BART_OPT_MAX_JOB_RECORDS)"),
    ({"text_column": 5}, "text_column", "valid string"),
    ({"dataset": {"file": 5}}, "dataset.file", "valid string"),
    ({"dataset": {"hub": ["a/b"]}}, "dataset.hub", "valid string"),
    ({"dataset": {"records": [{"text": "a"}], "split": 1}}, "dataset.split", "valid string"),
])  # fmt: skip
def test_request_types_are_strict_and_limit_is_bounded(app_client_with_data, body, field, words):
    response = app_client_with_data.post("/evaluate", json={"dataset": {"records": [{"text": "a"}]}, **body})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"], error


def test_no_response_names_a_server_path(make_jobs_app, data_dir, tmp_path):
    """The data dir and the database live under tmp_path; nothing the client can provoke shows it."""
    (data_dir / "ok.jsonl").write_text(json.dumps(cnn_rows(1)[0]) + "\n")
    os.symlink(tmp_path, data_dir / "out")
    with serving(make_jobs_app()) as client:
        answers = [client.post("/evaluate", json={"dataset": {"file": name}})
                   for name in ("out/ok.jsonl", "nope.jsonl", "out", ".", "ok.txt", "ok.jsonl\x00")]
        answers.append(client.get("/evaluate/nope"))
    for response in answers:
        assert 400 <= response.status_code < 500 and str(tmp_path) not in response.text, response.text


def test_a_submission_past_its_deadline_stops_loading_and_leaves_no_job(make_jobs_app, data_dir, monkeypatch):
    """The deadline middleware cancels the request; the loading thread sees it and discards the job."""
    (data_dir / "many.jsonl").write_text("".join(json.dumps(row) + "\n" for row in cnn_rows(400, seed=43)))
    read = []

    def slow(file, name, max_line_bytes, **options):
        """The file's rows from a slow disk: 400 records take 4 s."""
        def rows():
            for row in map(json.loads, file.open()):
                read.append(row["id"])
                time.sleep(0.01)
                yield row

        return iter_records(records=rows(), **options)

    monkeypatch.setattr("app.jobs.service.iter_records", slow)
    with serving(make_jobs_app(request_timeout_s=0.5)) as client:
        response = client.post("/evaluate", json={"dataset": {"file": "many.jsonl"}})
        seen, deadline = -1, time.monotonic() + 30
        while time.monotonic() < deadline:  # until reading has stopped and what it wrote is gone
            listed = client.get("/evaluate").json()["jobs"]
            store = client.app.state.jobs.store
            left = [sql(store, f"SELECT COUNT(*) FROM {table}")[0][0] for table in ("jobs", "records")]
            if len(read) == seen and listed == [] and left == [0, 0]:
                break
            seen = len(read)
            time.sleep(0.3)
    assert response.status_code == 504, response.text
    assert len(read) < 400  # it stopped reading long before the end
    assert listed == [] and left == [0, 0]
