"""The shared error body: field paths, FastAPI's own 404/405 in the same shape, the OpenAPI document."""

from __future__ import annotations

import json

import pytest

from app.errors import field_path


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
