"""Fixtures of the image smoke test: the CPU image built once a session, the service's container on the
demo model, and the times of every step, printed at the end of the run (`tests.docker.report`).

Where the test cannot run (`tests.docker.base.unavailable`), the image fixture skips with the reason.
Whatever happens, the containers and the volume a fixture made are removed when it ends; the image
stays as the next build's layer cache.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from bart_opt.demo import write_demo_model
from tests.docker.base import base_image, find_links, unavailable
from tests.docker.podman import (LABEL, OWNER, Container, build_image, container_name, image_config, image_id,
                                 podman, reap_leftovers, timed_lines)
from tests.docker.report import FIGURES, SKIPPED

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1800
IMAGE_TAG = "localhost/bart-opt-smoke:last-build"
# Room for a request in flight at SIGTERM on a busy 2-core machine (the default is 30 s).
SERVICE_ENV = {"BART_OPT_SHUTDOWN_TIMEOUT": "120"}
STOP_GRACE_S = 150


class Steps:
    """Records the smoke test's figures for the summary (`FIGURES`)."""

    @contextmanager
    def timed(self, name: str):
        """Time the block as step `name` (recorded when it ends, failed or not)."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - start)

    def add(self, name: str, amount: float, unit: str = "s") -> None:
        """Record figure `name`: `amount` in `unit`."""
        FIGURES.append((name, amount, unit))

    def add_build_steps(self, log: Path) -> None:
        """Record the time of each RUN step of the build in `log` and of its final commit; the other steps
        (ARG, ENV, COPY, ...: a second or less each) as one figure."""
        if not log.exists():
            return
        other = 0.0
        for text, seconds in timed_lines(log, ("STEP ", "COMMIT ")):
            if text.startswith("COMMIT "):
                self.add("  from COMMIT to buildah's exit", seconds)
            elif (instruction := text.partition(": ")[2]).startswith("RUN "):
                self.add(f"  {text.partition(':')[0].lower()}: {' '.join(instruction.split())[:46]}", seconds)
            else:
                other += seconds
        self.add("  the other steps (ARG, ENV, COPY, USER, ...)", other)


@pytest.fixture(scope="session")
def steps() -> Steps:
    """The recorder of the session's smoke-test figures."""
    return Steps()


@dataclass(frozen=True)
class Image:
    """The built image: its ID (what containers run: another session may move `IMAGE_TAG`) and
    `podman image inspect` record."""

    id: str
    inspect: dict


@pytest.fixture(scope="session")
def image(steps, tmp_path_factory) -> Image:
    """The CPU image, built once a session from this checkout on the Debian base.

    It stays on the machine as `IMAGE_TAG`, the layer cache of the next build (which then needs only
    the layers whose inputs changed: the code's, unless pyproject.toml or the Dockerfile changed, or
    the base was renewed); the image it replaces is removed.
    """
    reason = unavailable()
    if reason is not None:
        SKIPPED.append(reason)
        pytest.skip(reason)
    reap_leftovers()
    with steps.timed("base image (mmdebstrap + import, or the cached one)"):
        base = base_image(log=lambda line: None)
    previous = image_id(IMAGE_TAG)
    log = tmp_path_factory.mktemp("build") / "build.log"
    try:
        with steps.timed("image build (buildah bud --layers, CPU torch), of which:"):
            built = build_image(ROOT, base, IMAGE_TAG, find_links(), log, timeout=BUILD_TIMEOUT_S)
    finally:
        steps.add_build_steps(log)
    if previous not in (None, built):
        podman("rmi", previous, check=False)  # in use by a concurrent session: it removes it later
    image = Image(built, image_config(built))
    steps.add("image size", image.inspect["Size"] / 2**20, "MiB")
    return image


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, Path]:
    """(model folder, data folder): the trained demo checkpoint and its sample.jsonl, readable by the image's user."""
    work = tmp_path_factory.mktemp("demo")
    model = write_demo_model(work / "model")
    data = work / "data"
    data.mkdir()
    shutil.copy(model / "sample.jsonl", data / "sample.jsonl")
    for folder in (work, model, data):
        folder.chmod(0o755)
        for path in folder.iterdir():
            if path.is_file():
                path.chmod(0o644)
    return model, data


class Service:
    """The service in a container on the demo model, its jobs database on a named volume.

    `current` is the running container; `restart` stops it (SIGTERM, then SIGKILL after `STOP_GRACE_S`)
    and starts a new one on the same volume, so the service runs again after any test.
    """

    def __init__(self, image: Image, model: Path, data: Path, volume: str, steps: Steps) -> None:
        self.image, self.volume, self.steps = image, volume, steps
        self.mounts = [f"{model}:/model:ro", f"{data}:/data:ro", f"{volume}:/var/lib/bart-opt"]
        self.starts = 0
        self.current = self._start()

    def _start(self) -> Container:
        self.starts += 1
        container = Container.run(self.image.id, container_name(), SERVICE_ENV, self.mounts)
        try:
            reached = container.wait_ready()
        except BaseException:
            container.remove()
            raise
        for endpoint, seconds in reached.items():
            self.steps.add(f"start {self.starts}: podman run to /{endpoint} 200", seconds)
        return container

    def restart(self) -> tuple[int, str]:
        """Stop the current container: (its exit code, its log). A new one on the same volume is then `current`."""
        try:
            with self.steps.timed("podman stop (SIGTERM, drain)"):
                code = self.current.stop(STOP_GRACE_S)
            log = self.current.logs()
        finally:
            self.current.remove()
        self.current = self._start()
        return code, log

    def volume_path(self) -> Path:
        """Where the jobs volume lies on the host."""
        return Path(podman("volume", "inspect", self.volume, "--format", "{{.Mountpoint}}").stdout.strip())


@pytest.fixture(scope="module")
def service(image, demo, steps):
    """A running `Service` for the module; its containers and volume are removed at the end."""
    volume = f"bart-opt-smoke-{os.getpid()}-jobs"
    podman("volume", "create", "--label", f"{LABEL}={OWNER}", volume)
    running = None
    try:
        running = Service(image, *demo, volume, steps)
        yield running
    finally:
        if running is not None:
            running.current.remove()
        podman("volume", "rm", "-f", volume, check=False)
