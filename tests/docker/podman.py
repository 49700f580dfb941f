"""Podman and buildah for the image smoke test: the build, containers, and a deadline on every wait.

Measured on these machines: podman's default runtime (crun) cannot set rlimits and cgroups are in
hybrid mode, so containers run under runc with the host's own open-file and process limits (podman's
defaults are above the host's hard limits, which an unprivileged sandbox may not raise). Containers
share the host's network: the server listens on a free loopback port given as ``BART_OPT_PORT``.

Containers and volumes made here carry the label `LABEL` = this process's PID namespace and PID, so
that a later session can remove what a killed one left behind (`reap_leftovers`).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import shlex
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx

RUNTIME = ("--runtime", "runc")
LABEL = "bart-opt-smoke.owner"
OWNER = f"{os.stat('/proc/self/ns/pid').st_ino}:{os.getpid()}"
POLL_S = 0.1
READY_TIMEOUT_S = 180
_names = itertools.count()


class ContainerError(AssertionError):
    """A build, a container or a command of the smoke test went wrong; the message says what and shows its log."""


def command(*argv: str, timeout: float, check: bool = True, log: Path | None = None) -> subprocess.CompletedProcess:
    """Run `argv` within `timeout` seconds; raise `ContainerError` with its output's tail if it fails (unless
    not `check`) or runs out of time. With `log`, the output goes to that file instead of memory, each line
    after the seconds since the start (`timed_lines` reads them back)."""
    shown = shlex.join(argv)[:300]
    if log is None:
        try:
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ContainerError(f"{shown} did not finish within {timeout:.0f} s") from None
    else:
        done = _run_logged(argv, shown, timeout, log)
    if check and done.returncode != 0:
        raise ContainerError(f"{shown} failed (exit {done.returncode}):\n{done.stdout[-4000:]}")
    return done


def _run_logged(argv: tuple[str, ...], shown: str, timeout: float, log: Path) -> subprocess.CompletedProcess:
    """`command` with its output written to `log` as it comes, each line after ``SECONDS|``."""
    start = time.monotonic()
    with log.open("w") as sink, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                 text=True) as process:  # fmt: skip

        def copy() -> None:
            for line in process.stdout:
                sink.write(f"{time.monotonic() - start:.1f}|{line}")
                sink.flush()

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise ContainerError(f"{shown} did not finish within {timeout:.0f} s; its log: {log}") from None
        finally:
            reader.join(30)
        sink.write(f"{time.monotonic() - start:.1f}|(exit {process.returncode})\n")  # the end, for `timed_lines`
    output = "".join(line.partition("|")[2] for line in log.read_text().splitlines(keepends=True)[:-1])
    return subprocess.CompletedProcess(argv, process.returncode, output)


def timed_lines(log: Path, prefixes: tuple[str, ...]) -> list[tuple[str, float]]:
    """(line, seconds until the next of them or the end) for the lines of a `command` log that start with one
    of `prefixes`: the time of each step of a build (``STEP 5/19: RUN ...``, ``COMMIT ...``)."""
    stamped = [line.partition("|") for line in log.read_text().splitlines()]
    marks = [(float(at), text) for at, _, text in stamped if text.startswith(prefixes)]
    end = float(stamped[-1][0])
    return [(text, (marks[i + 1][0] if i + 1 < len(marks) else end) - at) for i, (at, text) in enumerate(marks)]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """``podman --runtime runc ARGS``."""
    return command("podman", *RUNTIME, *args, timeout=timeout, check=check)


def build_image(context: Path, base: str, tag: str, read_only: list[Path], log: Path, timeout: float) -> str:
    """``buildah bud`` the Dockerfile in `context` on `base` as `tag`, with `read_only` folders mounted where
    they lie on the host (the find-links folders); the new image's ID. ``--format docker``: the OCI format
    has no HEALTHCHECK. ``--layers``: the steps whose inputs did not change come from buildah's cache."""
    mounts = [arg for folder in read_only for arg in ("--volume", f"{folder}:{folder}:ro")]
    iidfile = log.with_suffix(".iid")
    command("buildah", "bud", "--layers", "--isolation", "chroot", "--format", "docker", "--network", "host",
            "--build-arg", f"BASE={base}", *mounts, "--iidfile", str(iidfile), "-t", tag, str(context),
            timeout=timeout, log=log)  # fmt: skip
    return iidfile.read_text().strip().removeprefix("sha256:")


def image_id(tag: str) -> str | None:
    """The ID of the image `tag` names, None when there is none."""
    done = podman("image", "inspect", tag, "--format", "{{.Id}}", check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def image_config(image: str) -> dict:
    """`podman image inspect` of `image`: its ``Size`` (bytes), ``Healthcheck``, ``Config`` (``User``, ...)."""
    return json.loads(podman("image", "inspect", image).stdout)[0]


def ulimit_flags() -> list[str]:
    """``--ulimit`` flags giving a container this process's open-file and process limits (the latter at most
    the kernel's ``pid_max``: these machines refuse a larger one, and it would mean nothing)."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    flags = []
    for name, which, cap in (("nofile", resource.RLIMIT_NOFILE, None), ("nproc", resource.RLIMIT_NPROC, pid_max)):
        soft, hard = resource.getrlimit(which)
        if cap is not None:
            soft, hard = (cap if limit == resource.RLIM_INFINITY else min(limit, cap) for limit in (soft, hard))
        if hard != resource.RLIM_INFINITY:  # an unlimited host: podman's defaults are allowed
            flags += ["--ulimit", f"{name}={soft}:{hard}"]
    return flags


def container_name() -> str:
    """A container name of this session, unique on the machine."""
    return f"bart-opt-smoke-{os.getpid()}-{next(_names)}"


def free_port() -> int:
    """A loopback port free now (the container binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Container:
    """A detached container of the service on the host network; `wait_ready` says how long it took.

    `started` is the monotonic time just before ``podman run``; `remove` is safe to call twice.
    """

    def __init__(self, name: str, port: int, started: float) -> None:
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.started = started

    @classmethod
    def run(cls, image: str, name: str, env: dict[str, str], mounts: list[str],
            argv: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> Container:
        """Start `image` as `name` with `env`, ``-v`` `mounts` and other ``podman run`` `flags` (running `argv`
        instead of the image's command, if given). The model is the folder mounted at ``/model``, nothing
        comes from the hub, and the server listens on a free loopback port."""
        port = free_port()
        env = {"BART_OPT_MODEL": "/model", "HF_HUB_OFFLINE": "1", **env,
               "BART_OPT_HOST": "127.0.0.1", "BART_OPT_PORT": str(port)}  # fmt: skip
        started = time.monotonic()
        podman("run", "-d", "--name", name, "--network", "host", "--label", f"{LABEL}={OWNER}", *ulimit_flags(),
               *(arg for key, value in env.items() for arg in ("-e", f"{key}={value}")),
               *(arg for mount in mounts for arg in ("-v", mount)), *flags, image, *argv)  # fmt: skip
        return cls(name, port, started)

    def state(self) -> tuple[str, int]:
        """(status, exit code) of the container: ``running``, ``exited``, ..."""
        status, code = podman("inspect", self.name, "--format", "{{.State.Status}} {{.State.ExitCode}}").stdout.split()
        return status, int(code)

    def logs(self, tail: int = 60) -> str:
        """The last `tail` lines the container wrote (stdout and stderr; podman 4.3's own ``--tail`` loses a
        last line without a newline)."""
        return "\n".join(podman("logs", self.name, check=False).stdout.splitlines()[-tail:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> dict[str, float]:
        """Wait until ``/health`` and then ``/ready`` answer 200; {"health": s, "ready": s} since `started`.

        Fails at once, with the container's log, when it exits or when ``/ready`` says the model failed to
        load (it never would become ready); fails with the last answer and the log past `timeout`.
        """
        deadline = self.started + timeout
        reached: dict[str, float] = {}
        last = "no answer"
        while time.monotonic() < deadline:
            path = "/ready" if "health" in reached else "/health"
            try:
                answer = httpx.get(self.url + path, timeout=2)
            except httpx.TransportError as error:
                last = f"{path}: {type(error).__name__}"
                if self.state()[0] != "running":
                    status, code = self._settled()
                    raise ContainerError(f"container {self.name} {status} (exit {code}) before it was ready; "
                                         f"its log:\n{self.logs()}") from None  # fmt: skip
            else:
                last = f"{path}: {answer.status_code} {answer.text[:300]}"
                if answer.status_code == 200:
                    reached["health" if path == "/health" else "ready"] = time.monotonic() - self.started
                    if path == "/ready":
                        return reached
                    continue
                if path == "/ready" and '"model_load_failed"' in answer.text:
                    raise ContainerError(f"container {self.name} will not become ready ({last}); "
                                         f"its log:\n{self.logs()}")  # fmt: skip
            time.sleep(POLL_S)
        raise ContainerError(f"container {self.name} not ready within {timeout:.0f} s (last: {last}); "
                             f"its log:\n{self.logs()}")  # fmt: skip

    def _settled(self, timeout: float = 30) -> tuple[str, int]:
        """(status, exit code) once a container that stopped running is ``exited``: podman shows it as
        ``stopped`` for a moment first, before its log is complete."""
        deadline = time.monotonic() + timeout
        while (state := self.state())[0] == "stopped" and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return state

    def exec(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run `argv` in the container as its user, in ``/`` (so that ``python`` imports the installed
        packages, not the sources in the image's WORKDIR); the result, whatever its exit status."""
        flags = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
        return podman("exec", "--workdir", "/", *flags, self.name, *argv, timeout=timeout, check=False)

    def stop(self, grace_s: int) -> int:
        """``podman stop -t grace_s`` (SIGTERM, SIGKILL after `grace_s`); the container's exit code."""
        podman("stop", "-t", str(grace_s), self.name, timeout=grace_s + 60)
        status, code = self._settled()
        if status != "exited":
            raise ContainerError(f"container {self.name} is {status} after podman stop")
        return code

    def remove(self) -> None:
        """Remove the container (and its anonymous volumes), stopping it first without a grace period."""
        podman("rm", "-f", "-v", "-t", "0", self.name, check=False)


def reap_leftovers() -> None:
    """Remove the containers and volumes a dead session of this PID namespace left behind."""
    namespace = OWNER.split(":")[0]

    def dead(owner: str) -> bool:
        space, _, pid = owner.partition(":")
        if space != namespace or not pid.isdigit():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    listings = {
        "container": ("ps", "-a", "--format", "{{.ID}} {{index .Labels \"%s\"}}" % LABEL),
        "volume": ("volume", "ls", "--format", "{{.Name}} {{index .Labels \"%s\"}}" % LABEL),
    }
    for kind, listing in listings.items():
        lines = podman(*listing, "--filter", f"label={LABEL}", check=False).stdout.splitlines()
        for line in lines:
            ident, _, owner = line.partition(" ")
            if dead(owner.strip()):
                podman(kind, "rm", "-f", ident, check=False)
