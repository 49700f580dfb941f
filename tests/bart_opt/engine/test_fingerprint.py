"""A checkpoint's fingerprint: its files' bytes, not its path; cached by file identity; damaged files refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bart_opt.engine.fingerprint as fingerprints
import bart_opt.engine.loading as loading
from bart_opt import Bart
from bart_opt.errors import CheckpointError
from bart_opt.engine.fingerprint import (
    CheckpointMismatch,
    DigestCache,
    FileChanged,
    FileWatch,
    check_fingerprint,
    fingerprint,
)
from bart_opt.pipeline.summarizer import Summarizer

IDENTITY = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture
def cache_file(tmp_path, monkeypatch) -> Path:
    """A digest cache of the test's own that caches every file, however small."""
    path = tmp_path / "digests.json"
    monkeypatch.setenv(fingerprints.CACHE_ENV, str(path))
    monkeypatch.setattr(fingerprints, "CACHED_FROM_BYTES", 0)
    return path


def copy_of(checkpoint: str, tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(checkpoint, tmp_path / name))


def flip_byte_keeping_size_and_mtime(path: Path, offset: int) -> None:
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # what `touch -r` would restore
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns


def test_the_same_bytes_in_another_folder_have_the_same_fingerprint(demo_checkpoint, tmp_path, cache_file):
    original = Bart.from_pretrained(demo_checkpoint).fingerprint
    moved = Bart.from_pretrained(str(copy_of(demo_checkpoint, tmp_path, "elsewhere"))).fingerprint
    assert original == moved and str(original).startswith("sha256:") and len(str(original)) == 7 + 64
    assert sorted(original.files) == sorted(IDENTITY)
    weights = Path(demo_checkpoint, "model.safetensors").read_bytes()
    assert original.files["model.safetensors"] == hashlib.sha256(weights).hexdigest()


@pytest.mark.parametrize("name", IDENTITY)
def test_one_byte_of_any_file_read_changes_the_fingerprint_even_with_size_and_mtime_kept(
        demo_checkpoint, tmp_path, cache_file, name):
    folder = copy_of(demo_checkpoint, tmp_path, "ckpt")
    before = fingerprint(folder, "model.safetensors")  # the cache now holds every file
    path = folder / name
    flip_byte_keeping_size_and_mtime(path, path.stat().st_size // 2)
    after = fingerprint(folder, "model.safetensors")
    assert after.digest != before.digest
    assert [n for n in after.files if after.files[n] != before.files[n]] == [name]


def test_a_second_start_reads_the_digest_from_the_cache(demo_checkpoint, tmp_path, cache_file, monkeypatch):
    folder = copy_of(demo_checkpoint, tmp_path, "ckpt")
    hashed = []
    real_hash = fingerprints._hash_file
    monkeypatch.setattr(fingerprints, "_hash_file", lambda path: hashed.append(path.name) or real_hash(path))
    first = fingerprint(folder, "model.safetensors")
    assert sorted(hashed) == sorted(IDENTITY) and cache_file.is_file()
    hashed.clear()
    assert fingerprint(folder, "model.safetensors") == first and hashed == []
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    fingerprint(folder, "model.safetensors")
    assert hashed == ["config.json"]


def test_an_unreadable_or_absent_cache_only_costs_hashing(demo_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprints, "CACHED_FROM_BYTES", 0)
    expected = fingerprint(demo_checkpoint, "model.safetensors", cache=None)
    broken = tmp_path / "digests.json"
    weights = Path(demo_checkpoint, "model.safetensors")
    poisoned = {str(weights.resolve()): {"stat": list(fingerprints._stat_key(weights)), "sha256": "0" * 64}}
    oversized = json.dumps({"version": 1, "entries": poisoned, "pad": "x" * fingerprints.CACHE_MAX_BYTES})
    for content in ("not json", json.dumps({"version": 1, "entries": {"x": 5}}), json.dumps([1, 2]), oversized):
        broken.write_text(content)
        assert fingerprint(demo_checkpoint, "model.safetensors", cache=broken) == expected
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert fingerprint(demo_checkpoint, "model.safetensors", cache=blocked / "digests.json") == expected
    monkeypatch.setenv(fingerprints.CACHE_ENV, "")
    assert fingerprints.default_cache_path() is None


def test_the_cache_keeps_only_its_newest_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(fingerprints, "CACHED_FROM_BYTES", 0)
    monkeypatch.setattr(fingerprints, "CACHE_ENTRIES", 3)
    cache = DigestCache(tmp_path / "digests.json")
    for i in range(5):
        path = tmp_path / f"f{i}"
        path.write_text(str(i))
        cache.digest(path, fingerprints._stat_key(path))
    cache.save()
    kept = json.loads((tmp_path / "digests.json").read_text())["entries"]
    assert sorted(Path(name).name for name in kept) == ["f2", "f3", "f4"]


@given(st.binary(min_size=1, max_size=64), st.binary(min_size=1, max_size=64))
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fingerprints_are_equal_exactly_when_the_bytes_are(tmp_path_factory, first, second):
    folders = []
    for content in (first, second):
        folder = tmp_path_factory.mktemp("fp")
        (folder / "model.safetensors").write_bytes(content)
        (folder / "config.json").write_text("{}")
        folders.append(fingerprint(folder, "model.safetensors", cache=None))
    assert (folders[0] == folders[1]) == (first == second)


def hub_snapshot(checkpoint: str, tmp_path: Path) -> Path:
    """The layout huggingface_hub's cache uses: snapshots/<rev>/<name> -> ../../blobs/<digest>."""
    repo = tmp_path / "models--someone--bart"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for source in Path(checkpoint).iterdir():
        data = source.read_bytes()
        if source.suffix == ".safetensors":
            blob = hashlib.sha256(data).hexdigest()
        else:
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / source.name).symlink_to(Path("..", "..", "blobs", blob))
    return snapshot


@pytest.mark.parametrize("name", ["model.safetensors", "generation_config.json"])
def test_a_hub_download_damaged_in_the_cache_is_refused(demo_checkpoint, tmp_path, cache_file, name):
    """An LFS file (the weights, named by sha256) and a small git file (named by its git blob sha1)."""
    snapshot = hub_snapshot(demo_checkpoint, tmp_path)
    assert Summarizer.from_pretrained(str(snapshot), device="cpu").fingerprint == Bart.from_pretrained(
        demo_checkpoint).fingerprint  # the blobs as downloaded pass
    target = (snapshot / name).resolve()
    text = target.read_bytes()
    # Still a readable file: a byte of the weights' data, or the digit of num_beams.
    offset = len(text) - 3 if name == "model.safetensors" else text.index(b'"num_beams": ') + 13
    flip_byte_keeping_size_and_mtime(target, offset)
    with pytest.raises(CheckpointError, match=rf"{name} is damaged: the hub published it as"):
        Summarizer.from_pretrained(str(snapshot), device="cpu")


@pytest.mark.parametrize("damage", ["truncated", "lengthened", "header"])
def test_a_damaged_weights_file_is_a_checkpoint_error(demo_checkpoint, tmp_path, damage):
    folder = copy_of(demo_checkpoint, tmp_path, "damaged")
    path = folder / "model.safetensors"
    data = path.read_bytes()
    damaged = {"truncated": data[:-100], "lengthened": data + b"\0" * 100,
               "header": data[:8] + b"x" * 16 + data[24:]}[damage]
    path.write_bytes(damaged)
    with pytest.raises(CheckpointError) as caught:
        Bart.from_pretrained(str(folder))
    assert caught.value.problem == "model.safetensors is damaged and cannot be read"


def test_a_checkpoint_replaced_while_it_loads_is_refused(demo_checkpoint, make_checkpoint, tmp_path, monkeypatch):
    folder = copy_of(demo_checkpoint, tmp_path, "swapped")
    other = Path(make_checkpoint(init_std=0.2, seed=5), "model.safetensors")
    real_read = loading.read_state_dict

    def read_then_swap(path):
        state = real_read(path)
        shutil.copy(other, path)  # another checkpoint's weights land while these are read
        return state

    monkeypatch.setattr(loading, "read_state_dict", read_then_swap)
    with pytest.raises(CheckpointError, match="model.safetensors changed while the checkpoint was loading"):
        Bart.from_pretrained(str(folder))


def test_a_run_on_another_checkpoint_names_both_fingerprints(demo_checkpoint, make_checkpoint):
    ours = Bart.from_pretrained(demo_checkpoint).fingerprint
    theirs = Bart.from_pretrained(make_checkpoint(init_std=0.2, seed=5)).fingerprint
    check_fingerprint(ours.digest, ours)
    with pytest.raises(CheckpointMismatch) as caught:
        check_fingerprint(ours.digest, theirs, "job 1234")
    assert ours.digest in str(caught.value) and theirs.digest in str(caught.value) and "job 1234" in str(caught.value)
    assert ours.to_dict() == {"digest": ours.digest, "files": dict(ours.files)}


# ---- a data file watched while it is read ---------------------------------------------------------------


def test_a_watched_file_that_did_not_change_is_fingerprinted_by_its_bytes(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"id": "1"}\n')
    found = FileWatch(path, "d.jsonl").fingerprint()
    assert found.size == 12 and found.mtime_ns == path.stat().st_mtime_ns
    assert found.sha256 == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert set(found.to_dict()) == {"size", "mtime", "sha256"}


@pytest.mark.parametrize("change", ["rewritten in place, mtime restored", "replaced", "removed", "appended to"])
def test_a_watched_file_that_changed_is_refused(tmp_path, change):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"old 1\nold 2\n")
    stat = path.stat()
    watch = FileWatch(path, "d.jsonl")
    if change == "rewritten in place, mtime restored":
        with path.open("r+b") as handle:
            handle.write(b"new")
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    elif change == "replaced":
        (tmp_path / "other").write_bytes(b"new 1\nnew 2\n")
        os.replace(tmp_path / "other", path)
    elif change == "removed":
        path.unlink()
    else:
        with path.open("ab") as handle:
            handle.write(b"old 3\n")
    with pytest.raises(FileChanged, match="d.jsonl changed while it was being read"):
        watch.fingerprint()
