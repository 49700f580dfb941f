"""Property: no JSON body, however hostile, gets a 5xx from POST /summarize or POST /evaluate.

Every answer is a success of the documented shape or the uniform error shape without server
details, and the service answers a valid request right after each one. Bodies come from three
strategies: any JSON value; objects shaped like each request (its field names and option names,
with any JSON values, huge numbers, NaN and lone surrogates); raw bytes with various
content types. Examples are derandomized, so CI runs the same ones every time.

Hub datasets are left out of the /evaluate bodies: without a network their loader answers 502
(an upstream failure, by design) and they are covered by the jobs tests. Lone surrogates are in:
a record whose text or reference has one fails alone while its job goes on, an id or a file name
with one is a 422.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import ErrorBody
from app.jobs.bodies import JobView
from app.schemas import GenerationOptions, SummarizeResponse
from tests.app.helpers import serving

EXAMPLES = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def json_values(text: st.SearchStrategy[str]) -> st.SearchStrategy:
    """Any JSON value whose strings come from `text` (NaN and huge integers included)."""
    numbers = st.integers() | st.integers(min_value=-(10**40), max_value=10**40) | st.floats()
    scalars = st.none() | st.booleans() | numbers | text
    return st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4), max_leaves=12
    )


def request_like(required: dict, optional: dict, text: st.SearchStrategy[str]) -> st.SearchStrategy[dict]:
    """Objects with the `required` fields, some `optional` ones and, now and then, an unknown one."""
    return st.fixed_dictionaries(required, optional={**optional, "unknown_field": json_values(text)})


def generation(text: st.SearchStrategy[str]) -> st.SearchStrategy:
    """Generation options by their names (and two unsupported ones) with often-plausible values."""
    plausible = st.integers(0, 50) | st.sampled_from([1024, 1025, 10**30, -1, 0.5, 200.0, "4", True, "never"])
    names = st.sampled_from([*GenerationOptions.model_fields, "top_k", "do_sample"])
    return st.dictionaries(names, plausible | json_values(text), max_size=4) | json_values(text)


# Text with every code point, lone surrogates included (json.dumps escapes them as \udXXX).
any_text = st.text(st.characters(codec=None, categories=None), max_size=30)
# Values that are often right, so that bodies get past the first check and reach the deeper ones.
plausible = st.sampled_from(["a short text", "word " * 60, " ", ""])

texts = st.lists(plausible | any_text, min_size=1, max_size=4) | json_values(any_text)
summarize_bodies = json_values(any_text) | request_like(
    {"texts": texts}, {"references": texts, "generation": generation(any_text)}, any_text
)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | any_text
records = st.lists(
    request_like({"text": plausible | any_text}, {"id": scalars, "reference": plausible | scalars}, any_text),
    min_size=1, max_size=3,
) | json_values(any_text)
file_names = any_text | st.sampled_from(["cnn.jsonl", "../x", "/etc/passwd", "nested/../cnn.jsonl", ".", "\\x"])
dataset = (
    request_like({"records": records}, {"config": scalars}, any_text)
    | request_like({"file": file_names}, {"split": scalars}, any_text)
    | json_values(any_text)
)
column = st.sampled_from(["article", "highlights", "id", "text", "reference", ""]) | scalars
evaluate_bodies = json_values(any_text) | request_like({"dataset": dataset}, {
    "text_column": column, "summary_column": column, "id_column": column,
    "limit": st.sampled_from([0, 1, 2, -5]) | scalars, "generation": generation(any_text),
}, any_text)  # fmt: skip
raw_bodies = st.tuples(st.binary(max_size=64), st.sampled_from(["application/json", "text/plain", None]))

VALID = {"texts": ["a text that must still be summarized"], "generation": {"num_beams": 1, "min_length": 1, "max_length": 4}}
CLASS_NAME = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception)\b|Traceback|<class ")


@pytest.fixture(scope="module")
def hostile(demo_checkpoint, tmp_path_factory):
    """One app for all examples; a small cost budget keeps any valid request quick on the demo model."""
    from app.main import create_app
    from app.settings import Settings

    folder = tmp_path_factory.mktemp("hostile")
    data = folder / "data"
    data.mkdir()
    (data / "cnn.jsonl").write_text(json.dumps({"id": "1", "article": "an article", "highlights": "a line"}) + "\n")
    settings_ = Settings(model=demo_checkpoint, db=str(folder / "jobs.db"), data_dir=str(data), max_request_cost=2000)
    with serving(create_app(settings_)) as client:
        yield client, [str(folder), demo_checkpoint]


def check(hostile, path: str, response) -> None:
    """Never a 5xx; the documented shape; no server details; a valid request answered right after."""
    client, server_paths = hostile
    assert response.status_code < 500, response.text
    body = response.json()
    if response.status_code >= 400:
        error = ErrorBody.model_validate(body).error
        assert error.request_id == response.headers["x-request-id"]
        assert not CLASS_NAME.search(response.text), response.text
        assert not any(server_path in response.text for server_path in server_paths), response.text
    elif path == "/summarize":
        SummarizeResponse.model_validate(body)
    else:
        JobView.model_validate(body)
    after = client.post("/summarize", json=VALID)
    assert after.status_code == 200, after.text


@EXAMPLES
@given(body=summarize_bodies)
def test_any_json_at_summarize(hostile, body):
    check(hostile, "/summarize", hostile[0].post("/summarize", content=json.dumps(body),
                                                 headers={"Content-Type": "application/json"}))


@EXAMPLES
@given(body=evaluate_bodies)
def test_any_json_at_evaluate(hostile, body):
    check(hostile, "/evaluate", hostile[0].post("/evaluate", content=json.dumps(body),
                                                headers={"Content-Type": "application/json"}))


@settings(EXAMPLES, max_examples=40)
@given(raw=raw_bodies, path=st.sampled_from(["/summarize", "/evaluate"]))
def test_any_bytes_at_either(hostile, raw, path):
    content, content_type = raw
    response = hostile[0].post(path, content=content, headers={"Content-Type": content_type} if content_type else {})
    assert response.status_code in (400, 415, 422), response.text
    check(hostile, path, response)
