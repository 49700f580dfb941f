"""Shared fixtures: tiny random checkpoints built locally (nothing is downloaded)."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Checkpoint digests cached in a throwaway folder, never in the developer's ~/.cache (bart_opt.engine.fingerprint),
# removed when the session ends.
if "BART_OPT_DIGEST_CACHE" not in os.environ:
    _digests = tempfile.mkdtemp(prefix="bart_opt_test_")
    atexit.register(shutil.rmtree, _digests, ignore_errors=True)
    os.environ["BART_OPT_DIGEST_CACHE"] = os.path.join(_digests, "digests.json")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite's two pytest-xdist workers share two cores: OpenMP threads that wait by sleeping instead of
# spinning leave a core to the other worker (and to the servers and commands tests start, which inherit
# it). Thread counts are unchanged, so results are too. Set before torch loads its OpenMP runtime.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from bart_opt.demo import build_checkpoint

pytest_plugins = ["tests.docker.report"]  # the image smoke test's figures in the terminal summary


# The whole suite runs on this many pytest-xdist workers (CI's machines have 2 cores): 384-398 s on the quiet
# 2-core Xeon, against 575-630 s in one process.
WORKERS = 2
# Test files whose tests share one Ray instance (`ray_cluster`) or start Ray themselves.
RAY_FILES = {"tests/app/jobs/test_ray_runner.py", "tests/app/device/test_engine.py",
             "tests/bart_opt/test_distributed.py"}
# Test files that share the published fidelity batch (tests/bart_opt/conftest.py, `published_batch`): one worker
# computes transformers' outputs for it once per dtype instead of once per file.
AGREEMENT_FILES = {"tests/bart_opt/engine/test_fidelity.py", "tests/bart_opt/engine/test_el_attention.py",
                   "tests/bart_opt/engine/test_el_static.py", "tests/bart_opt/engine/test_static_generation.py",
                   "tests/bart_opt/bench/test_near_ties.py"}
# The long end-to-end runs, marked `long`: the README's test command leaves them out (pyproject's addopts,
# ``-m "not long"``) to stay within 8 minutes on 2 cores, and `.ci/run` runs them after it
# (``python3 -m pytest -q -m long``). Whole files (the image; Ray started and killed; several service processes
# killed and restarted), single tests (a whole benchmark command), and every test that uses `ray_cluster`.
LONG_FILES = {"tests/docker/test_image.py", "tests/bart_opt/test_distributed.py", "tests/app/jobs/test_ray_runner.py",
              "tests/app/jobs/test_replicas.py", "tests/app/jobs/test_crash_resume.py",
              "tests/app/jobs/test_processes.py"}
LONG_TESTS = {"tests/bart_opt/bench/test_vs_peers.py::test_tiny_peer_run_end_to_end",
              "tests/bart_opt/bench/test_primitive_cache.py::test_a_small_run_writes_the_same_summaries_at_both_capacities"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the worker count into its settings
def pytest_cmdline_main(config) -> None:
    """Run the whole suite (``python -m pytest`` from the repository root, no paths) on `WORKERS` pytest-xdist
    workers where pytest-xdist is installed (the test extra); with any worker count, group them
    (``--dist loadgroup``, `xdist_group`). ``-n N`` picks another count, ``-n 0`` one process; tests named
    on the command line, and runs that debug, collect or list fixtures, run in one process unless ``-n``
    is given."""
    option = config.option
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    one_process = (option.collectonly or option.usepdb or option.trace or option.tx or option.showfixtures
                   or option.show_fixtures_per_test)
    if option.numprocesses is None and config.args_source == pytest.Config.ArgsSource.TESTPATHS and not one_process:
        option.numprocesses = WORKERS
    if option.numprocesses and option.dist == "no":
        option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """In the xdist controller: tell a worker to group its tests. A worker reads ``--dist`` from the command
    line, which does not hold the one `pytest_cmdline_main` set."""
    node.workerinput["bart_opt_loadgroup"] = node.config.option.dist == "loadgroup"


def xdist_group(nodeid: str) -> str:
    """The pytest-xdist group of a test (``--dist loadgroup`` runs a group on one worker): its file, so module
    fixtures are built once; every Ray test together, so the session starts one Ray instance; all of
    tests/docker together, so the session builds the image once; the agreement tests together, so the
    published batch's reference outputs are computed once."""
    path = nodeid.split("::", 1)[0]
    if path in RAY_FILES:
        return "ray"
    if path in AGREEMENT_FILES:
        return "agreement"
    if path.startswith("tests/docker/"):
        return "docker"
    return path


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks and the loadgroup option
def pytest_collection_modifyitems(config, items) -> None:
    """Mark each test with its `xdist_group` (read only under ``--dist loadgroup``); in a worker told to
    group (`pytest_configure_node`), turn xdist's loadgroup option on."""
    if getattr(config, "workerinput", {}).get("bart_opt_loadgroup"):
        config.option.loadgroup = True
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item.nodeid)))
        if is_long(item.nodeid, item.fixturenames):
            item.add_marker(pytest.mark.long)


def is_long(nodeid: str, fixtures) -> bool:
    """Whether a test is one of the long end-to-end runs (see `LONG_FILES`)."""
    path = nodeid.split("::", 1)[0]
    return path in LONG_FILES or nodeid.split("[", 1)[0] in LONG_TESTS or "ray_cluster" in fixtures


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory):
    """Factory: `make_checkpoint(**overrides)` writes (once per distinct overrides) a random BART folder."""
    cache: dict[tuple, str] = {}

    def _make(**overrides) -> str:
        key = tuple(sorted(overrides.items()))
        if key not in cache:
            path = tmp_path_factory.mktemp("ckpt")
            cache[key] = str(build_checkpoint(path, **overrides))
        return cache[key]

    return _make


@pytest.fixture(scope="session")
def demo_checkpoint(make_checkpoint) -> str:
    """The default demo checkpoint: 2+2 layers, d_model 32, byte-level BPE tokenizer, CNN-like generation config."""
    return make_checkpoint(init_std=0.2)


@pytest.fixture
def unreadable_checkpoint(demo_checkpoint, tmp_path) -> str:
    """The demo checkpoint's folder with its weights file replaced by bytes no reader takes: loading it is a
    `CheckpointError` ("model.safetensors is damaged"), so a refusal that comes instead came before the
    weights were read."""
    folder = tmp_path / "unreadable"
    shutil.copytree(demo_checkpoint, folder)
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    return str(folder)


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    """One local Ray instance for the whole session (2 CPUs, no dashboard, a 150 MB object store,
    workers' output not sent to the driver); yields its address for ``--ray ADDRESS``.

    Its workers import this checkout (Ray puts the driver's working directory on their path) and
    inherit this process's environment (HF_HUB_OFFLINE above). Its shutdown is bounded as the
    command's is (`bart_opt.cli.entry`): a hung one must not hold the session's exit.
    """
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[ray]'")
    from bart_opt.distributed import disconnect

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=150 * 2**20,
             logging_level=logging.WARNING)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        if not disconnect(timeout_s=60):
            atexit.unregister(ray._private.worker.shutdown)  # Ray's exit hook would wait on the same hang
            warnings.warn("the session's Ray instance did not shut down within 60 s; Ray's reaper stops it",
                          stacklevel=1)


@pytest.fixture(scope="session")
def postgres_cluster():
    """One throwaway PostgreSQL cluster for the session (`bart_opt.bench.postgres.TempCluster`: initdb and
    pg_ctl in a temp folder, as the postgres user when root); the tests that need it skip, saying why,
    only where none can be started on this machine."""
    from bart_opt.bench.postgres import TempCluster, unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no PostgreSQL server for the PostgreSQL tests: {reason}")
    with TempCluster() as cluster:
        yield cluster
