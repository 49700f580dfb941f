"""The shared error body: field paths, FastAPI's own 404/405 in the same shape, the OpenAPI document."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.domain_errors import (Busy, ClientGone, Conflict, DamagedStore, NotFound, Refused, ServiceError,
                               SourceUnavailable, Unavailable)
from app.errors import STATUS_OF, field_path, install_error_handlers, status_of
from app.summarize.service import ClientDisconnected


@pytest.mark.parametrize(
    ("loc", "path"),
    [(("body", "texts", 2), "texts[2]"), (("body", "generation", "num_beams"), "generation.num_beams"),
     (("query", "format"), "format"), (("body",), "body"), ((), "body")],
)  # fmt: skip
def test_field_path(loc, path):
    assert field_path(loc) == path


def test_unknown_route_and_wrong_method_use_the_error_shape(client):
    missing = client.get("/summarise")
    wrong = client.get("/summarize")
    assert missing.status_code == 404 and wrong.status_code == 405
    assert missing.json()["error"] == {
        "code": "not_found", "message": "no route for /summarise", "request_id": missing.headers["x-request-id"],
    }  # fmt: skip
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert "GET" in wrong.json()["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("put", "/evaluate", "GET, POST"), ("get", "/summarize", "POST"), ("post", "/health", "GET"),
     ("patch", "/evaluate/some-id", "DELETE, GET")],
)  # fmt: skip
def test_405_names_every_method_of_the_path_in_allow(client, method, path, allow):
    response = client.request(method.upper(), path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json()["error"]["message"].endswith(f"allowed: {allow}")


def test_the_openapi_document_describes_the_answers_as_sent(client):
    document = client.app.openapi()  # what GET /openapi.json serves with BART_OPT_DOCS=true
    paths = document["paths"]
    error_body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    metrics = paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert metrics["text/plain"]["schema"] == {"type": "string"}
    assert metrics["application/json"]["schema"] == {"$ref": "#/components/schemas/MetricsSnapshot"}
    summarize = paths["/summarize"]["post"]["responses"]
    assert {"400", "401", "408", "413", "415", "422", "429", "500", "503", "504"} <= set(summarize)
    assert "401" not in paths["/health"]["get"]["responses"]
    for operations in paths.values():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                if status[0] in "45":
                    assert response["content"] == error_body, (status, operation["operationId"])
    assert "HTTPValidationError" not in json.dumps(document)
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_the_answers_match_the_documented_error_shape(client):
    from app.errors import ErrorBody

    for response in (client.get("/nowhere"), client.post("/summarize", content=b"{"),
                     client.post("/summarize", json={"texts": []})):
        ErrorBody.model_validate(response.json())


# ---- the domain's errors: one status per kind, the shared body, Retry-After ------------------

DOMAIN_ANSWERS = [
    (NotFound("job_not_found", "no evaluation job 'x'"), 404, None, None),
    (Conflict("idempotency_key_in_progress", "Idempotency-Key 'k' is still loading", field="Idempotency-Key",
              retry_after=1), 409, "Idempotency-Key", "1"),
    (Refused("missing_column", "no column 'article'", field="text_column"), 422, "text_column", None),
    (Busy("queue_full", "the interactive queue is full (2 waiting); retry after 3 s", retry_after=3), 429, None, "3"),
    (ClientGone("client_closed_request", "the client disconnected; its work was cancelled"), 499, None, None),
    (SourceUnavailable("dataset_unavailable", "dataset.hub: could not reach the hub", field="dataset.hub"), 502,
     "dataset.hub", None),
    (Unavailable("not_ready", "the model is still loading", retry_after=5), 503, None, "5"),
    (DamagedStore("jobs_store_damaged", "the database is damaged"), 503, None, None),
]  # fmt: skip


def _raising(error: Exception) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/fail")
    async def fail() -> None:
        raise error

    return TestClient(app)


@pytest.mark.parametrize(("error", "status", "field", "retry_after"), DOMAIN_ANSWERS,
                         ids=[type(answer[0]).__name__ for answer in DOMAIN_ANSWERS])
def test_each_domain_error_is_answered_with_its_status_and_the_shared_body(error, status, field, retry_after):
    response = _raising(error).get("/fail")
    assert response.status_code == status == status_of(error)
    expected = {"code": error.code, "message": error.message, **({"field": field} if field else {}), "request_id": ""}
    assert response.content == json.dumps({"error": expected}, separators=(",", ":")).encode()
    assert response.headers.get("retry-after") == retry_after


def test_every_kind_of_domain_error_has_a_status_and_the_table_lists_only_kinds():
    def kinds(cls: type) -> list[type]:
        return [sub for direct in cls.__subclasses__() for sub in (direct, *kinds(direct))]

    assert {type(answer[0]) for answer in DOMAIN_ANSWERS} >= set(kinds(ServiceError)) - {ClientDisconnected}
    for kind in set(kinds(ServiceError)) - {ClientDisconnected}:
        assert 400 <= status_of(kind("code", "message")) < 600, kind
    assert status_of(ClientDisconnected()) == 499
    assert ServiceError not in STATUS_OF and all(issubclass(kind, ServiceError) for kind in STATUS_OF)


# ---- the domain speaks no HTTP ------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
DOMAIN = [*(path for package in ("jobs", "device", "summarize")
            for path in sorted((REPO / "app" / package).rglob("*.py"))),
          *(REPO / "app" / name for name in ("compare.py", "domain_errors.py"))]
HTTP = ("fastapi", "starlette", "app.errors")


def http_imports(source: str) -> set[str]:
    """The modules of `HTTP` (or theirs) that `source` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        found |= {name for name in names if any(name == http or name.startswith(http + ".") for http in HTTP)}
    return found


def test_the_jobs_and_the_summarize_core_import_no_http_and_no_app_errors():
    assert {path.relative_to(REPO).as_posix(): sorted(found) for path in DOMAIN
            if (found := http_imports(path.read_text(encoding="utf-8")))} == {}


def test_an_http_import_in_the_domain_is_found():
    planted = ("from starlette.concurrency import run_in_threadpool\nimport fastapi\n\n"
               "def f():\n    from app.errors import ApiError\n")
    assert http_imports(planted) == {"starlette.concurrency", "fastapi", "app.errors"}
    assert http_imports("from app.domain_errors import NotFound\nimport anyio\n") == set()
