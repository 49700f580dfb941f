"""Shared fixtures: tiny random checkpoints built locally (nothing is downloaded)."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Checkpoint digests cached in a throwaway folder, never in the developer's ~/.cache (bart_opt.fingerprint),
# removed when the session ends.
if "BART_OPT_DIGEST_CACHE" not in os.environ:
    _digests = tempfile.mkdtemp(prefix="bart_opt_test_")
    atexit.register(shutil.rmtree, _digests, ignore_errors=True)
    os.environ["BART_OPT_DIGEST_CACHE"] = os.path.join(_digests, "digests.json")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

from bart_opt.demo import build_checkpoint


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
