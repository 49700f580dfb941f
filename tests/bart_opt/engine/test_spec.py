"""GenerationSpec: resolved once, with transformers 5's semantics, every rule checked by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bart_opt import Bart, GenerationSpec, InvalidRequest, Summarizer
from tests.bart_opt.agreement import generate_agreeing
from tests.bart_opt.reference import batch, reference_model

RANDOM = dict(init_std=0.2, eos_bias=5.0)


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint) -> str:
    return make_checkpoint(**RANDOM)


@pytest.fixture(scope="module")
def model(checkpoint) -> Bart:
    return Bart.from_pretrained(checkpoint)


def with_generation_config(source: str, tmp_path, generation_config: dict) -> str:
    """A copy of checkpoint `source` whose generation_config.json is `generation_config`."""
    folder = tmp_path / "ckpt"
    shutil.copytree(source, folder)
    (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return str(folder)


def checkpoint_generation_config(path: str) -> dict:
    return json.loads(Path(path, "generation_config.json").read_text())


def reference_generate(path, ids, mask, **kwargs):
    with torch.no_grad():
        return reference_model(path).generate(input_ids=ids, attention_mask=mask, **kwargs)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # The demo checkpoint's generation config: 4 beams, max_length 40, min_length 8.
        ({}, dict(num_beams=4, max_length=40, min_length=8, length_penalty=2.0, no_repeat_ngram_size=3)),
        ({"max_new_tokens": 12}, dict(max_length=13)),
        ({"max_new_tokens": 12, "max_length": 30}, dict(max_length=13)),  # max_new_tokens wins, as in transformers
        ({"min_new_tokens": 2, "min_length": 10}, dict(min_length=3)),  # min_new_tokens wins, even when smaller
        ({"num_beams": 1, "length_penalty": 1}, dict(num_beams=1, length_penalty=1.0)),
        ({"early_stopping": "never"}, dict(early_stopping="never")),
        ({"forced_bos_token_id": None, "eos_token_id": [2, 3]}, dict(forced_bos_token_id=None, eos_token_id=(2, 3))),
    ],
)
def test_overrides_resolve_with_transformers_5_semantics(model, overrides, expected):
    spec = model.generation_spec(overrides)
    assert {key: getattr(spec, key) for key in expected} == expected


def test_min_new_tokens_overrides_min_length_exactly_as_transformers_does(checkpoint, model):
    ids, mask = batch(checkpoint, (1, 4, 2), seed=11)
    for options in (dict(num_beams=1, min_length=12, min_new_tokens=5, max_length=30),
                    dict(num_beams=3, min_length=3, min_new_tokens=9, max_length=30)):
        generate_agreeing(model, ids, mask, checkpoint, **options)
    # The override really changed the output: min_length=12 alone forces longer summaries.
    assert not torch.equal(model.generate(ids, mask, num_beams=1, min_length=12, max_length=30),
                           model.generate(ids, mask, num_beams=1, min_length=12, min_new_tokens=5, max_length=30))


def test_generation_config_without_num_beams_summarizes_as_transformers_does(checkpoint, tmp_path):
    config = checkpoint_generation_config(checkpoint)
    del config["num_beams"], config["max_length"]
    path = with_generation_config(checkpoint, tmp_path, config)
    ids, mask = batch(path, (3, 1), seed=2)
    generate_agreeing(Bart.from_pretrained(path), ids, mask, path)
    spec = Summarizer.from_pretrained(path, device="cpu").generation_spec()
    assert spec.num_beams == 1 and spec.max_length == 21  # transformers' global defaults: 1 beam, 20 new tokens
    result = Summarizer.from_pretrained(path, device="cpu").summarize(["The city council voted on monday."])
    assert result.errors == [None] and result.generation["num_beams"] == 1


def test_generation_config_without_eos_runs_to_max_length_as_transformers_does(checkpoint, tmp_path):
    path = with_generation_config(checkpoint, tmp_path, {"decoder_start_token_id": 2})
    ids, mask = batch(path, (2, 3), seed=4)
    got = generate_agreeing(Bart.from_pretrained(path), ids, mask, path, max_length=12)
    assert got.shape[1] == 12


def test_empty_generation_config_takes_its_tokens_from_config_json(checkpoint, tmp_path):
    path = with_generation_config(checkpoint, tmp_path, {})
    ids, mask = batch(path, (2,), seed=4)
    with pytest.raises(ValueError, match="decoder_start_token_id"):  # transformers 5 cannot generate here
        reference_generate(path, ids, mask)
    spec = Bart.from_pretrained(path).generation_spec()
    assert (spec.decoder_start_token_id, spec.eos_token_id, spec.pad_token_id) == (2, (2,), 1)
    result = Summarizer.from_pretrained(path, device="cpu").summarize(["Police said the storm hit the city."])
    assert result.errors == [None] and 0 < result.items[0]["output_tokens"] <= 20


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"top_k": 5}, "top_k", "unsupported generation option 'top_k'"),
        ({"do_sample": True}, "do_sample", "True is not supported"),
        ({"num_beams": 0}, "num_beams", "must be >= 1"),
        ({"num_beams": True}, "num_beams", "must be an integer, got True"),
        ({"num_beams": "4"}, "num_beams", "must be an integer, got '4'"),
        ({"max_length": 4.0}, "max_length", "must be an integer"),
        ({"max_length": 1, "min_length": 0}, "max_length", "leaves no room"),
        ({"max_new_tokens": 0}, "max_new_tokens", "must be >= 1"),
        ({"max_length": 5000}, "max_length", "the model has 1024 (max_position_embeddings)"),
        ({"max_new_tokens": 1025, "min_length": 0}, "max_new_tokens", "asks for 1025 decoder positions"),
        ({"max_length": 5}, "max_length", "min_length 8 is above max_length 5"),  # the checkpoint's min_length
        ({"min_length": 41}, "min_length", "min_length 41 is above max_length 40"),  # the checkpoint's max_length
        ({"min_new_tokens": 50, "max_new_tokens": 10}, "min_new_tokens", "min_length 51 is above max_length 11"),
        ({"length_penalty": 200}, "length_penalty", "outside [-10, 10]"),
        ({"length_penalty": float("inf")}, "length_penalty", "finite number"),
        ({"early_stopping": "sometimes"}, "early_stopping", 'true, false or "never"'),
        ({"early_stopping": 1}, "early_stopping", 'true, false or "never"'),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size", "must be >= 0"),
        ({"eos_token_id": 10_000}, "eos_token_id", "outside the vocabulary"),
        ({"forced_bos_token_id": [0, 1]}, "forced_bos_token_id", "must be a token id"),
        ({"decoder_start_token_id": None, "bos_token_id": None}, "decoder_start_token_id", "must be set"),
    ],
)
def test_every_rule_raises_invalid_request_naming_the_option(model, overrides, field, words):
    with pytest.raises(InvalidRequest) as caught:
        model.generation_spec(overrides)
    assert caught.value.field == field
    assert words in caught.value.message
    assert isinstance(caught.value, ValueError) and str(caught.value).startswith(f"{field}: ")


def test_beam_cap(model):
    assert model.generation_spec({"num_beams": 8}, max_beams=8).num_beams == 8
    with pytest.raises(InvalidRequest, match="num_beams: 9 is above the limit of 8"):
        model.generation_spec({"num_beams": 9}, max_beams=8)


def test_a_checkpoint_setting_an_unsupported_option_is_blamed_and_can_be_overridden(checkpoint, tmp_path):
    config = checkpoint_generation_config(checkpoint)
    path = with_generation_config(checkpoint, tmp_path, {**config, "do_sample": True})
    model = Bart.from_pretrained(path)
    with pytest.raises(InvalidRequest, match="generation_config.json sets it; override do_sample"):
        model.generation_spec()
    assert model.generation_spec({"do_sample": False}).num_beams == 4


def test_specs_are_frozen_hashable_values_that_round_trip_through_json(model):
    one, two = model.generation_spec({"num_beams": 2}), model.generation_spec({"num_beams": 2, "max_length": None})
    assert one == two and hash(one) == hash(two) and one != model.generation_spec({"num_beams": 3})
    with pytest.raises(AttributeError):
        one.num_beams = 5
    stored = json.loads(json.dumps(one.to_dict()))
    assert GenerationSpec.from_dict(stored) == one
    with pytest.raises(ValueError, match="exactly the keys"):
        GenerationSpec.from_dict({k: v for k, v in stored.items() if k != "num_beams"})


def test_generate_takes_a_spec_or_keywords_not_both(checkpoint, model):
    ids, mask = batch(checkpoint, (2,), seed=1)
    spec = model.generation_spec({"num_beams": 2, "max_length": 12, "min_length": 0})
    assert torch.equal(model.generate(ids, mask, spec=spec), model.generate(ids, mask, num_beams=2, max_length=12,
                                                                            min_length=0))
    with pytest.raises(InvalidRequest, match="either as a spec or as keywords"):
        model.generate(ids, mask, spec=spec, num_beams=3)
