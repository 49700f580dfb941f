"""Fixtures for the service tests: apps on the demo checkpoint and a Summarizer outside them."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.main import create_app
from app.device.engine import load_summarizer
from app.settings import Settings
from bart_opt.pipeline.summarizer import Summarizer
from tests.app.helpers import serving

# Every app the tests build (and every server they start) keeps its evaluation jobs in a
# throwaway database, never in ./bart_opt_jobs.db where a developer's own jobs may wait.
_jobs_folder = tempfile.mkdtemp(prefix="bart_opt_test_jobs_")
atexit.register(shutil.rmtree, _jobs_folder, ignore_errors=True)
os.environ["BART_OPT_DB"] = str(Path(_jobs_folder) / "jobs.db")
# The tests assert CPU facts (live-tensor memory counts, fp32 summaries); on a GPU machine the
# service would otherwise pick CUDA and float16.
os.environ["BART_OPT_DEVICE"] = "cpu"
# Starlette's TestClient and httpx's ASGI transport send "Host: testserver", which the Host check
# (app.hosts) refuses on a server without an API key; the tests of that check set allowed_hosts themselves.
os.environ["BART_OPT_ALLOWED_HOSTS"] = "testserver,localhost,127.0.0.1"


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Run the demo model on one intra-op thread, as BART_OPT_TORCH_THREADS=1 would.

    Its ops are tiny, so more threads only add synchronisation; on a busy 2-core machine
    that turns a 0.1 s call into seconds. Restored after the service tests.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def make_app(demo_checkpoint):
    """`make_app(load=..., **settings)`: an app on the demo checkpoint with these settings."""

    def _make(*, load=load_summarizer, **overrides) -> FastAPI:
        return create_app(Settings(**{"model": demo_checkpoint, **overrides}), load=load)

    return _make


@pytest.fixture(scope="module")
def client(demo_checkpoint) -> Iterator[TestClient]:
    """A module-wide running app with default settings on the demo checkpoint."""
    with serving(create_app(Settings(model=demo_checkpoint))) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def direct(demo_checkpoint) -> Summarizer:
    """A Summarizer of its own on the demo checkpoint, for summaries computed outside the service."""
    return Summarizer.from_pretrained(demo_checkpoint, device="cpu")
