"""The image, built and run: in a container on the trained demo model the service answers /health and
/ready, writes real summaries, runs an evaluation job as its non-root user with the jobs database on the
volume, passes its HEALTHCHECK, drains the request in flight on SIGTERM and exits 0, and a new container
on the same volume still lists the finished job. A container that cannot become ready fails the wait at
once, with the reason and its log; one that never answers fails it at its deadline.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from bart_opt.engine import native
from tests.app.helpers import samples, value
from tests.docker.podman import Container, ContainerError, container_name, free_port, podman

JOB_TIMEOUT_S = 300
HTTP_TIMEOUT_S = 120
IDLE_STOP_GRACE_S = 10  # "a few seconds": an idle server has nothing to drain
# The first test's setup bootstraps the base and builds the image (pyproject's 600 s is too short for that on
# a busy machine); every step below has its own, shorter deadline.
pytestmark = pytest.mark.timeout(3600)


def sample_records(demo) -> list[dict]:
    """The demo's held-out records (the data file mounted at /data)."""
    _, data = demo
    return [json.loads(line) for line in (data / "sample.jsonl").read_text().splitlines()]


def wait_for_job(url: str, job_id: str, timeout: float) -> dict:
    """The job's view once it is no longer queued or running; fails past `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = httpx.get(f"{url}/evaluate/{job_id}", timeout=10).json()
        if view["status"] not in ("queued", "running"):
            return view
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {view['status']} after {timeout} s: {view['progress']}")


@pytest.fixture(scope="module")
def finished_job(service, steps) -> dict:
    """An evaluation job of 4 records of the mounted data file, run to its end."""
    with steps.timed("POST /evaluate (4 records) to succeeded"):
        answer = httpx.post(f"{service.current.url}/evaluate", json={"dataset": {"file": "sample.jsonl"}, "limit": 4},
                            timeout=HTTP_TIMEOUT_S)  # fmt: skip
        assert answer.status_code == 202, answer.text
        return wait_for_job(service.current.url, answer.json()["id"], JOB_TIMEOUT_S)


def test_health_and_ready_answer_on_the_cpu(service):
    health = httpx.get(f"{service.current.url}/health", timeout=10).json()
    assert health["status"] == "ok", health
    # The container's own open-file limit (the host's, given by ulimit_flags), and the server's use of it.
    assert 0 < health["descriptors"]["open"] < health["descriptors"]["limit"], health
    ready = httpx.get(f"{service.current.url}/ready", timeout=10).json()
    assert (ready["status"], ready["device"]) == ("ready", "cpu")


def test_summarize_answers_real_summaries_of_the_mounted_model(service, demo, steps):
    records = sample_records(demo)[:3]
    body = {"texts": [record["article"] for record in records],
            "references": [record["highlights"] for record in records]}
    with steps.timed("POST /summarize (3 texts)"):
        answer = httpx.post(f"{service.current.url}/summarize", json=body, timeout=HTTP_TIMEOUT_S)
    assert answer.status_code == 200, answer.text
    summaries = answer.json()["summaries"]
    assert len(summaries) == 3 and all(summary.strip() for summary in summaries), summaries
    assert len(set(summaries)) == 3, summaries  # each text its own summary
    # The trained demo model summarizes its held-out stories close to their highlights (ROUGE-1 near 100).
    scores = [item["rouge"]["rouge1"]["fmeasure"] for item in answer.json()["items"]]
    assert min(scores) > 50, (scores, summaries)


def test_the_server_runs_as_the_image_user_10001(service, image):
    assert image.inspect["Config"]["User"] == "bartopt"
    status = service.current.exec("cat", "/proc/1/status").stdout
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    assert uids == ["10001"] * 4, status  # real, effective, saved and filesystem uid of the server (PID 1)
    assert "bart-opt\0serve" in service.current.exec("cat", "/proc/1/cmdline").stdout


def test_the_healthcheck_passes_and_fails_without_a_server(service, image):
    check = image.inspect["Healthcheck"]  # kept by buildah --format docker (the OCI format has no HEALTHCHECK)
    assert check["Test"][0] == "CMD-SHELL", check
    passed = podman("healthcheck", "run", service.current.name, check=False)
    assert passed.returncode == 0, passed.stdout
    failed = service.current.exec("sh", "-c", check["Test"][1], env={"BART_OPT_PORT": str(free_port())})
    assert failed.returncode != 0, failed.stdout


def test_the_fast_mode_toolchain_works_in_the_image(service, steps):
    if native.kernel_isa() is not None:  # the container shares this CPU: the kernel is built for it, as bartopt
        with steps.timed("fast-mode kernel build in the container"):
            built = service.current.exec("python", "-c", "import sys; from bart_opt.engine import native; "
                                         "sys.exit(native.kernel() is None)", timeout=600)  # fmt: skip
        assert built.returncode == 0, built.stdout
    else:  # neither AVX512-BF16 nor AVX2: torch's kernel on this CPU; what the build needs is still there for others
        probe = service.current.exec("python", "-c", "import os, subprocess, sysconfig; "
                                     "import torch.utils.cpp_extension as ext; ext.verify_ninja_availability(); "
                                     "subprocess.run(['c++', '--version'], check=True); "
                                     "os.stat(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))")  # fmt: skip
        assert probe.returncode == 0, probe.stdout


def test_the_job_succeeds_with_its_database_on_the_volume(service, finished_job):
    assert finished_job["status"] == "succeeded", finished_job
    assert (finished_job["progress"]["done"], finished_job["progress"]["failed"]) == (4, 0)
    assert finished_job["rouge"]["rouge1"]["mid"]["fmeasure"] > 50, finished_job["rouge"]
    database = service.volume_path() / "jobs.db"
    assert database.is_file() and database.stat().st_uid == 10001


def test_sigterm_drains_the_request_in_flight_exits_0_and_a_restart_keeps_the_job(service, finished_job, demo):
    url = service.current.url
    body = {"texts": [record["article"] for record in sample_records(demo)[:4]], "generation": {"num_beams": 4}}
    answers: list[tuple[httpx.Response, float]] = []

    def send() -> None:
        answer = httpx.post(f"{url}/summarize", json=body, timeout=HTTP_TIMEOUT_S)
        answers.append((answer, time.monotonic()))

    sender = threading.Thread(target=send)
    sender.start()
    try:
        deadline = time.monotonic() + 60
        # In flight: this scrape and the slow request.
        while value(samples(httpx.get(f"{url}/metrics", timeout=10).text), "bart_opt_requests_in_flight") < 2:
            assert time.monotonic() < deadline, "the slow request never arrived"
            time.sleep(0.05)
        stopped_at = time.monotonic()
        code, log = service.restart()
    finally:
        sender.join(HTTP_TIMEOUT_S + 10)
    assert code == 0, log
    assert answers, "the request in flight got no answer"
    answer, answered_at = answers[0]
    assert answer.status_code == 200 and len(answer.json()["summaries"]) == 4, answer.text
    assert answered_at > stopped_at  # it was still in flight at SIGTERM, and it was finished

    listed = httpx.get(f"{service.current.url}/evaluate", timeout=10).json()["jobs"]
    assert [(job["id"], job["status"]) for job in listed] == [(finished_job["id"], "succeeded")], listed
    again = httpx.get(f"{service.current.url}/evaluate/{finished_job['id']}", timeout=10).json()
    assert again["rouge"] == finished_job["rouge"]


def test_a_read_only_root_filesystem_serves_and_sigterm_stops_the_idle_server_at_once(image, demo, steps):
    model, _ = demo
    # --tmpfs /tmp as docker needs it (podman --read-only adds one itself); the image's volumes stay writable.
    container = Container.run(image.id, container_name(), {}, [f"{model}:/model:ro"],
                              flags=("--read-only", "--tmpfs", "/tmp"))  # fmt: skip
    try:
        container.wait_ready()
        written = container.exec("sh", "-c", "touch /opt/venv/probe")
        assert written.returncode != 0 and "Read-only file system" in written.stdout, written.stdout
        record = sample_records(demo)[0]
        answer = httpx.post(f"{container.url}/summarize", json={"texts": [record["article"]]}, timeout=HTTP_TIMEOUT_S)
        assert answer.status_code == 200 and answer.json()["summaries"][0].strip(), answer.text
        inline = {"dataset": {"records": [{"text": record["article"], "reference": record["highlights"]}]}}
        job = httpx.post(f"{container.url}/evaluate", json=inline, timeout=HTTP_TIMEOUT_S)
        assert job.status_code == 202, job.text  # the jobs database, on the (anonymous) volume, takes it
        assert wait_for_job(container.url, job.json()["id"], JOB_TIMEOUT_S)["status"] == "succeeded"
        # Exit 0 within the grace period: the server ended on SIGTERM (podman's SIGKILL after it gives 137).
        with steps.timed(f"podman stop of the idle server (SIGTERM, grace {IDLE_STOP_GRACE_S} s)"):
            code = container.stop(IDLE_STOP_GRACE_S)
        assert code == 0, container.logs()
    finally:
        container.remove()


def test_the_jobs_database_on_a_postgresql_server(image, demo, postgres_cluster, steps):
    import psycopg

    model, data = demo
    url = postgres_cluster.create_database()  # on 127.0.0.1: the container shares the host's network
    container = Container.run(image.id, container_name(), {"BART_OPT_DB": url},
                              [f"{model}:/model:ro", f"{data}:/data:ro"])  # fmt: skip
    try:
        container.wait_ready()
        with steps.timed("POST /evaluate (2 records) on PostgreSQL to succeeded"):
            answer = httpx.post(f"{container.url}/evaluate", json={"dataset": {"file": "sample.jsonl"}, "limit": 2},
                                timeout=HTTP_TIMEOUT_S)  # fmt: skip
            assert answer.status_code == 202, answer.text
            view = wait_for_job(container.url, answer.json()["id"], JOB_TIMEOUT_S)
        assert view["status"] == "succeeded" and view["progress"]["done"] == 2, view
        code = container.stop(IDLE_STOP_GRACE_S)
        assert code == 0, container.logs()
    finally:
        container.remove()
    with psycopg.connect(url) as connection:  # the job lives in the server's database, not in the container
        assert connection.execute("SELECT id, status FROM jobs").fetchall() == [(view["id"], "succeeded")]


def test_a_mounted_folder_that_is_not_a_checkpoint_fails_the_wait_at_once(image, tmp_path):
    folder = tmp_path / "not-a-checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    for path in (tmp_path, folder):
        path.chmod(0o755)
    (folder / "config.json").chmod(0o644)
    container = Container.run(image.id, container_name(), {}, [f"{folder}:/model:ro"])
    try:
        with pytest.raises(ContainerError, match="will not become ready") as failure:
            container.wait_ready()
    finally:
        container.remove()
    assert "model_load_failed" in str(failure.value) and "/model" in str(failure.value)  # the reason, its log


def test_a_container_that_exits_fails_the_wait_with_its_log(image):
    container = Container.run(image.id, container_name(), {"BART_OPT_MAX_TEXTS": "0"}, [])
    try:
        with pytest.raises(ContainerError, match=r"exited \(exit 2\) before it was ready") as failure:
            container.wait_ready()
    finally:
        container.remove()
    assert "BART_OPT_MAX_TEXTS" in str(failure.value)  # the setting, named as the operator set it


def test_a_container_that_never_answers_fails_the_wait_at_its_deadline(image):
    container = Container.run(image.id, container_name(), {}, [], argv=("sleep", "600"))
    try:
        with pytest.raises(ContainerError, match=r"not ready within 10 s \(last: /health: ConnectError\)"):
            container.wait_ready(timeout=10)
    finally:
        container.remove()
