"""``GET /options``: the generation options the service takes, from the one list in bart_opt.engine.spec."""

from __future__ import annotations

from app.schemas import GenerationOptions
from bart_opt.engine.spec import REQUEST_OPTIONS


def test_options_list_the_spec_options_in_order_with_their_kinds(client):
    response = client.get("/options")
    assert response.status_code == 200, response.text
    options = response.json()["generation"]
    assert [option["name"] for option in options] == list(REQUEST_OPTIONS) == list(GenerationOptions.model_fields)
    by_name = {option["name"]: option for option in options}
    assert by_name["num_beams"] == {"name": "num_beams", "label": "Beams", "type": "integer", "minimum": 1,
                                    "choices": None, "description": REQUEST_OPTIONS["num_beams"].help}
    assert by_name["min_length"]["minimum"] == 0 and by_name["length_penalty"]["type"] == "number"
    assert by_name["early_stopping"]["type"] == "choice" and by_name["early_stopping"]["choices"] == [True, False,
                                                                                                      "never"]


def test_options_need_the_api_key_when_one_is_set(make_app):
    from tests.app.helpers import serving

    with serving(make_app(api_key="secret")) as client:
        assert client.get("/options").status_code == 401
        assert client.get("/options", headers={"Authorization": "Bearer secret"}).status_code == 200
