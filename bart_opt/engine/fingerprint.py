"""What was loaded, by content: a checkpoint's fingerprint.

`fingerprint(folder, weights)` hashes (sha256, streamed a MiB at a time) the weights file
that was read, ``config.json``, ``generation_config.json`` and the tokenizer files present
(`bart_opt.engine.checkpoint.TOKENIZER_FILES`), and digests the sorted ``name sha256`` lines of
them into one ``sha256:<hex>``. Two loads have the same fingerprint exactly when every one of
those files has the same bytes, whatever the folder is called. A path string says nothing of
the kind: a folder refilled with another checkpoint keeps its name.

Hashing bart-large-cnn's 1.63 GB of weights takes seconds (3.6 s at the 434 MiB/s sha256
measured on a shared 2-core machine), so the digests of large files are cached by what the
file system says of them: the real path, device, inode, size, mtime
and ctime. ctime cannot be set back by `touch` or `os.utime`, so a file rewritten in place
(same size, mtime restored) is hashed again; so is a copy (another inode). The cache is one
small JSON file, ``$HF_HOME/bart_opt/digests.json`` (``~/.cache/huggingface/bart_opt/``), beside
the hub cache where the weights of hub models live, so that it lasts as long as they do
(a container that mounts HF_HOME keeps both); ``BART_OPT_DIGEST_CACHE`` names another file,
or turns the cache off when empty. It holds the newest `CACHE_ENTRIES` files; a cache that
cannot be read or written only costs the hashing again.

Hub downloads are checked on the way: a file that is a hub cache blob is named by its own
digest (the sha256 of an LFS file such as the weights, the git blob sha1 of a small file),
and a file whose bytes no longer match that name is refused as damaged.

A data file read over a while (a service job's intake) is watched the same way: `FileWatch`
takes what the file system says of it when reading begins, and `FileWatch.fingerprint` at the
end hashes it and checks that nothing changed from start to end (a rewrite in place changes its
ctime even when size and mtime are put back; a replacement changes its inode), raising
`FileChanged` otherwise. `DataFingerprint` is what a job records of it: size, mtime and sha256.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bart_opt.engine.checkpoint import TOKENIZER_FILES
from bart_opt.errors import CheckpointError

logger = logging.getLogger("bart_opt.engine.fingerprint")

CACHE_ENV = "BART_OPT_DIGEST_CACHE"
CACHE_ENTRIES = 256
CACHE_MAX_BYTES = 4 << 20  # 256 entries take about 80 KB; a larger file is not this cache's and is not read
CACHED_FROM_BYTES = 1 << 20  # smaller files are hashed on every load (microseconds)
IDENTITY_FILES = ("config.json", "generation_config.json", *TOKENIZER_FILES)
_CHUNK = 1 << 20
_LFS_BLOB = re.compile(r"[0-9a-f]{64}")
_GIT_BLOB = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Fingerprint:
    """A checkpoint's identity: `digest` (``sha256:<64 hex>``) over `files` (name -> sha256 hex).

    ``str(fingerprint)`` is the digest, the value to store with a run and compare on resume.
    """

    digest: str
    files: Mapping[str, str]
    _stats: Mapping[str, tuple] = field(default_factory=dict, compare=False, repr=False)

    def __str__(self) -> str:
        return self.digest

    def to_dict(self) -> dict:
        """``{"digest", "files"}``, for JSON."""
        return {"digest": self.digest, "files": dict(self.files)}

    def check_unchanged(self) -> None:
        """Raise `CheckpointError` when a hashed file was replaced or written since it was hashed."""
        for path, stat in self._stats.items():
            if _stat_key(Path(path)) != stat:
                raise CheckpointError(f"{Path(path).name} changed while the checkpoint was loading; load it again",
                                      Path(path).parent)


@dataclass(frozen=True)
class DataFingerprint:
    """A data file as it was read: its `size` in bytes, `mtime` (ns since the epoch) and `sha256` (``sha256:<hex>``)."""

    size: int
    mtime_ns: int
    sha256: str

    def to_dict(self) -> dict:
        """``{"size", "mtime", "sha256"}`` for JSON (mtime in ISO 8601, UTC)."""
        import datetime

        mtime = datetime.datetime.fromtimestamp(self.mtime_ns / 1e9, datetime.timezone.utc)
        return {"size": self.size, "mtime": mtime.isoformat(timespec="microseconds"), "sha256": self.sha256}


class FileChanged(ValueError):
    """A file was written, replaced or removed while it was being read."""


class FileWatch:
    """What the file system says of `path` now (device, inode, size, mtime, ctime), to check at the end of a read.

    Raises OSError when `path` cannot be looked at. `name` is how messages call the file.
    """

    def __init__(self, path: str | os.PathLike, name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or str(path)
        self.stat = stat_key(self.path)

    def fingerprint(self) -> DataFingerprint:
        """The file's fingerprint, hashed now; `FileChanged` if it changed since the watch began (or while hashing)."""
        self.check()
        digest = _hash_file(self.path)
        self.check()
        _, _, size, mtime_ns, _ = self.stat
        return DataFingerprint(size, mtime_ns, f"sha256:{digest}")

    def check(self) -> None:
        """Raise `FileChanged` if the file changed since the watch began."""
        try:
            now = stat_key(self.path)
        except OSError:
            now = None
        if now != self.stat:
            raise FileChanged(f"{self.name} changed while it was being read (it was written, replaced or removed: "
                              "its size, modification time or inode differ from when reading began)")


class CheckpointMismatch(CheckpointError):
    """A run made with one checkpoint met another: `expected` and `found` are both digests."""

    def __init__(self, expected: str, found: str, what: str = "the run") -> None:
        super().__init__(f"{what} was made with checkpoint {expected}, but the checkpoint loaded now is {found}")
        self.expected, self.found = expected, found


def check_fingerprint(expected: str, found: Fingerprint | str, what: str = "the run") -> None:
    """Raise `CheckpointMismatch` (naming both digests) unless `found` is the fingerprint `expected`."""
    if str(found) != expected:
        raise CheckpointMismatch(expected, str(found), what)


def fingerprint(folder: str | os.PathLike, weights: str, cache: Path | None | bool = True,
                extra: Sequence[str] = ()) -> Fingerprint:
    """The fingerprint of checkpoint `folder`, whose weights were read from the file named `weights`.

    `extra`: more file names to hash where present, beyond `IDENTITY_FILES` (the vocabulary files
    of other tokenizers than BART's, such as BERT's ``vocab.txt``).
    `cache`: True for the default cache file (see the module docstring), a path for another,
    None or False for none. Raises `CheckpointError` for a hub blob whose bytes do not match its name.
    """
    folder = Path(folder)
    names = [weights, *(name for name in dict.fromkeys((*IDENTITY_FILES, *extra)) if (folder / name).is_file())]
    store = DigestCache(default_cache_path() if cache is True else cache or None)
    files, stats = {}, {}
    for name in names:
        path = folder / name
        stats[str(path)] = _stat_key(path)
        files[name] = store.digest(path, stats[str(path)])
    store.save()
    manifest = "".join(f"{name} {files[name]}\n" for name in sorted(files))
    return Fingerprint("sha256:" + hashlib.sha256(manifest.encode()).hexdigest(), files, stats)


def default_cache_path() -> Path | None:
    """``$BART_OPT_DIGEST_CACHE`` (None when it is empty), else ``$HF_HOME/bart_opt/digests.json``."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        return Path(configured).expanduser() if configured.strip() else None
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "bart_opt" / "digests.json"


class DigestCache:
    """sha256 digests of large files by (real path, device, inode, size, mtime, ctime); see the module docstring."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, dict] = self._read() if path is not None else {}
        self.changed = False

    def digest(self, path: Path, stat: tuple) -> str:
        """The sha256 hex of `path` (whose `_stat_key` is `stat`), from the cache when it still holds."""
        real = str(path.resolve())
        entry = self.entries.get(real)
        if entry is not None and tuple(entry["stat"]) == stat:
            digest = entry["sha256"]
        else:
            digest = _hash_file(path)
            if stat[2] >= CACHED_FROM_BYTES and self.path is not None:
                self.entries.pop(real, None)
                self.entries[real] = {"stat": list(stat), "sha256": digest}
                self.changed = True
        _check_hub_blob(path, digest)
        return digest

    def save(self) -> None:
        """Write the cache (the newest `CACHE_ENTRIES`) if it changed; a failure is logged and ignored."""
        if not self.changed or self.path is None:
            return
        kept = dict(list(self.entries.items())[-CACHE_ENTRIES:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".digests-", suffix=".tmp")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"version": 1, "entries": kept}, out)
            os.replace(temporary, self.path)  # atomic: a concurrent reader sees the old file or the new one
        except OSError as error:
            logger.debug("could not write the digest cache %s: %s", self.path, error)

    def _read(self) -> dict[str, dict]:
        try:
            if self.path.stat().st_size > CACHE_MAX_BYTES:
                return {}
            data = json.loads(self.path.read_text(encoding="utf-8"))
            entries = data["entries"] if data.get("version") == 1 else {}
            return {key: value for key, value in entries.items()
                    if isinstance(value, dict) and isinstance(value.get("sha256"), str) and isinstance(value.get("stat"), list)}
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            return {}  # missing or unreadable: start afresh


def stat_key(path: Path) -> tuple:
    """What the file system says of `path` (symlinks followed): device, inode, size, mtime, ctime (OSError if nothing)."""
    stat = path.stat()
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _stat_key(path: Path) -> tuple:
    """`stat_key` of a checkpoint's file (`CheckpointError` when it cannot be looked at)."""
    try:
        return stat_key(path)
    except OSError as error:
        raise CheckpointError(f"{path.name} cannot be read ({os.strerror(error.errno or 0)})", path.parent) from None


def _hash_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _check_hub_blob(path: Path, sha256: str) -> None:
    """Refuse a hub cache blob (``.../blobs/<digest>``) whose bytes do not match its name."""
    real = path.resolve()
    if real.parent.name != "blobs":
        return
    if _LFS_BLOB.fullmatch(real.name):
        expected, found = real.name, sha256
    elif _GIT_BLOB.fullmatch(real.name):
        expected, found = real.name, _git_blob_sha1(real)
    else:
        return
    if expected != found:
        raise CheckpointError(
            f"{path.name} is damaged: the hub published it as {expected[:12]}..., its bytes hash to {found[:12]}...; "
            "delete it from the hub cache and download it again", path.parent)


def _git_blob_sha1(path: Path) -> str:
    """git's object id of the file: sha1 of ``blob <size>\\0`` and its bytes."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
