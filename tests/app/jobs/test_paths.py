"""`resolve_data_file`: only regular files inside the data directory, symlinks followed and checked."""

from __future__ import annotations

import pytest

from app.jobs.paths import DataFileMissing, PathRefused, resolve_data_file


@pytest.fixture
def tree(tmp_path):
    """tmp/data/{cnn.jsonl, sub/inner.csv, inside -> cnn.jsonl, out -> ../secret.jsonl, up -> ..}, tmp/secret.jsonl."""
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "cnn.jsonl").write_text("{}\n")
    (data / "sub" / "inner.csv").write_text("article\n")
    (tmp_path / "secret.jsonl").write_text("{}\n")
    (data / "inside.jsonl").symlink_to(data / "cnn.jsonl")
    (data / "out.jsonl").symlink_to(tmp_path / "secret.jsonl")
    (data / "up").symlink_to(tmp_path)
    return data


@pytest.mark.parametrize(("name", "target"), [
    ("cnn.jsonl", "cnn.jsonl"), ("sub/inner.csv", "sub/inner.csv"), ("./sub/./inner.csv", "sub/inner.csv"),
    ("inside.jsonl", "cnn.jsonl"),
])  # fmt: skip
def test_files_inside_resolve_to_their_real_path(tree, name, target):
    assert resolve_data_file(tree, name) == (tree / target).resolve()


@pytest.mark.parametrize(("name", "words"), [
    ("../secret.jsonl", "contains '..'"),
    ("sub/../../secret.jsonl", "contains '..'"),
    ("sub/../cnn.jsonl", "contains '..'"),
    ("..\\secret.jsonl", "contains '..'"),
    ("/etc/passwd", "absolute path"),
    ("\\\\server\\share\\x.jsonl", "absolute path"),
    ("C:\\data\\x.jsonl", "absolute path"),
    ("C:x.jsonl", "absolute path"),
    ("out.jsonl", "leads outside the data directory"),
    ("up/secret.jsonl", "leads outside the data directory"),
    ("up", "leads outside the data directory"),
    ("", "empty"),
    ("a\x00.jsonl", "NUL"),
    ("a\ud800.jsonl", "not valid Unicode"),
    ("a/" * 3000 + "x.jsonl", "longer than 4096 bytes"),
])  # fmt: skip
def test_names_leading_out_are_refused(tree, name, words):
    with pytest.raises(PathRefused, match=words):
        resolve_data_file(tree, name)


def test_absolute_path_to_a_file_inside_is_still_refused(tree):
    with pytest.raises(PathRefused, match="absolute path"):
        resolve_data_file(tree, str(tree / "cnn.jsonl"))


def test_missing_file_directory_and_data_dir(tree, tmp_path):
    with pytest.raises(DataFileMissing, match="no file 'nope.jsonl'"):
        resolve_data_file(tree, "nope.jsonl")
    with pytest.raises(DataFileMissing, match="not a regular file"):
        resolve_data_file(tree, "sub")
    with pytest.raises(DataFileMissing, match="BART_OPT_DATA_DIR"):
        resolve_data_file(tmp_path / "absent", "cnn.jsonl")


def test_data_dir_given_through_a_symlink_works(tree, tmp_path):
    (tmp_path / "alias").symlink_to(tree)
    assert resolve_data_file(tmp_path / "alias", "cnn.jsonl") == (tree / "cnn.jsonl").resolve()
