"""The CPU base of the image smoke test (Debian bookworm with python3, venv and pip, from Debian's
packages), and what the test needs of the machine (`unavailable`).

No registry is reachable from these machines, so the base is bootstrapped here with mmdebstrap and
imported into podman. Two things of the host go into it, because the build's pip needs them: the
host's CA bundle (the registries' certificates chain to it) and an ``/etc/pip.conf`` naming the host
pip's find-links folders, where the CPU torch wheel lies (the build mounts them read-only; PyPI's
default torch is the multi-GB CUDA build).

The tarball is cached under ``~/.cache/bart-opt/docker/`` for `MAX_AGE_S` (bootstrapping takes about a
minute), keyed on everything that goes into it; a file lock keeps concurrent sessions from building it
twice. By hand: ``python3 -m tests.docker.base`` prints the image's name.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.docker.podman import command

SUITE = "bookworm"
PYTHON_TAG = "cp311"  # bookworm's python3 is 3.11: the torch wheel must be built for it
PACKAGES = ("ca-certificates", "python3", "python3-venv", "python3-pip")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bart-opt" / "docker"
MAX_AGE_S = 7 * 24 * 3600  # a week-old base still gets Debian's fixes through the build's apt-get
BOOTSTRAP_TIMEOUT_S = 900
DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"
TOOLS = ("podman", "buildah", "runc", "mmdebstrap")
INSTALL = "apt-get install -y podman buildah runc mmdebstrap"


def unavailable() -> str | None:
    """Why the image smoke test cannot run here (None when it can): rootful podman and buildah with runc,
    mmdebstrap, and the CPU torch wheel in the host pip's find-links."""
    if not sys.platform.startswith("linux"):
        return f"containers are built and run on Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"the image smoke test runs rootful podman and buildah: it needs root (this is uid {os.geteuid()})"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found ({INSTALL}; .ci/run does it as root)"
    if cpu_torch_wheel() is None:
        return (f"no torch-{torch_requirement()}+cpu {PYTHON_TAG} wheel in the host pip's find-links folders "
                f"{[str(folder) for folder in find_links()]}: the build would download PyPI's multi-GB CUDA torch")
    return None


def torch_requirement() -> str:
    """The torch version the Dockerfile installs where the base has none (its ``ARG TORCH=torch==X``)."""
    match = re.search(r"^ARG TORCH=torch==(\S+)$", DOCKERFILE.read_text(), re.M)
    if match is None:
        raise ValueError(f"{DOCKERFILE} has no 'ARG TORCH=torch==VERSION' line")
    return match.group(1)


def find_links() -> list[Path]:
    """The local folders of the host pip's ``find-links`` settings (``pip config list``), in its order."""
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60).stdout  # fmt: skip
    folders: list[Path] = []
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            for entry in value.strip().strip("'\"").split():
                folder = Path(entry.removeprefix("file://"))
                if "://" not in entry.removeprefix("file://") and folder.is_dir() and folder not in folders:
                    folders.append(folder)
    return folders


def cpu_torch_wheel() -> Path | None:
    """The CPU wheel of the Dockerfile's torch for the base's python in a find-links folder, if any."""
    pattern = f"torch-{torch_requirement()}+cpu-{PYTHON_TAG}-*.whl"
    return next((wheel for folder in find_links() for wheel in sorted(folder.glob(pattern))), None)


def pip_conf(folders: list[Path]) -> str:
    """The base's ``/etc/pip.conf``: the host's find-links folders and CA bundle."""
    return f"[global]\nfind-links = {' '.join(map(str, folders))}\ncert = {CA_BUNDLE}\n"


def base_image(log=print) -> str:
    """The name of the imported base image, bootstrapping and importing it first where needed."""
    conf = pip_conf(find_links())
    key = hashlib.sha256("\n".join([SUITE, *PACKAGES, conf]).encode() + CA_BUNDLE.read_bytes()).hexdigest()[:12]
    name = f"localhost/bart-opt-base:{SUITE}-{key}"
    tarball = CACHE / f"base-{SUITE}-{key}.tar"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = tarball.exists() and time.time() - tarball.stat().st_mtime < MAX_AGE_S
        if not fresh:
            log(f"bootstrapping the {SUITE} base with mmdebstrap into {tarball}")
            _bootstrap(tarball, conf)
        if not fresh or not _image_exists(name):
            log(f"importing {tarball} as {name}")
            command("podman", "import", str(tarball), name, timeout=600)
    return name


def _bootstrap(tarball: Path, conf: str) -> None:
    """mmdebstrap a minimal base with `PACKAGES`, the host's CA bundle and `conf` into `tarball` (atomically)."""
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        conf_file = Path(work) / "pip.conf"
        conf_file.write_text(conf)
        partial = Path(work) / tarball.name
        mmdebstrap = [
            "mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
            f"--customize-hook=upload {CA_BUNDLE} {CA_BUNDLE}", f"--customize-hook=upload {conf_file} /etc/pip.conf",
            SUITE, str(partial),
        ]  # fmt: skip
        command(*mmdebstrap, timeout=BOOTSTRAP_TIMEOUT_S)
        partial.replace(tarball)


def _image_exists(name: str) -> bool:
    return command("podman", "image", "exists", name, timeout=60, check=False).returncode == 0


if __name__ == "__main__":
    print(base_image(log=lambda line: print(line, file=sys.stderr)))
