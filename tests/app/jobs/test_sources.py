"""`check_hub_source`: plain hub ids on the allowlist pass; anything that could be a path does not."""

from __future__ import annotations

import pytest

from app.jobs.sources import SourceRefused, check_hub_source, parse_allowlist

ANY = parse_allowlist("*")


@pytest.mark.parametrize("hub", ["abisee/cnn_dailymail", "EdinburghNLP/xsum", "a.b/c-d_e", "x/y"])
def test_hub_ids_pass(hub):
    check_hub_source(hub, "3.0.0", "validation", ANY)


@pytest.mark.parametrize("hub", [
    "/srv/data", "./data/x", "../x/y", "~/x", "~user/x", "file:///srv/x", "file://x/y", "http://h/x", "s3://b/x",
    "C:\\x\\y", "C:/x", "x", "json", "x/y/z", "x//y", "/x/y", "x/", "-x/y", "x/y.", "x/..", "x--y/z", "x /y",
    "x/y\n", "x/y\x00",
])  # fmt: skip
def test_anything_that_could_name_a_path_is_refused(hub):
    with pytest.raises(SourceRefused, match="is not a hub dataset id") as caught:
        check_hub_source(hub, None, "test", ANY)
    assert caught.value.field == "dataset.hub"


def test_the_allowlist(monkeypatch, tmp_path):
    allowed = parse_allowlist(" abisee/cnn_dailymail , EdinburghNLP/xsum,")
    assert allowed == {"abisee/cnn_dailymail", "EdinburghNLP/xsum"}
    check_hub_source("EdinburghNLP/xsum", None, "test", allowed)
    with pytest.raises(SourceRefused, match="not among the hub datasets this server reads"):
        check_hub_source("other/set", None, "test", allowed)
    with pytest.raises(SourceRefused, match="hub datasets are disabled"):
        check_hub_source("abisee/cnn_dailymail", None, "test", parse_allowlist(""))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "abisee").mkdir()
    (tmp_path / "abisee" / "cnn_dailymail").write_text("a local file the loader would read")
    with pytest.raises(SourceRefused, match="also names a file or folder on the server"):
        check_hub_source("abisee/cnn_dailymail", None, "test", allowed)


@pytest.mark.parametrize(("config", "split", "field"), [
    ("3.0.0", "test[:100]", "dataset.split"), ("3.0.0", "../x", "dataset.split"), ("a/b", "test", "dataset.config"),
    ("", "test", "dataset.config"),
])  # fmt: skip
def test_configs_and_splits_are_plain_names(config, split, field):
    with pytest.raises(SourceRefused) as caught:
        check_hub_source("abisee/cnn_dailymail", config, split, ANY)
    assert caught.value.field == field
