"""The API contract: schemathesis, every check, against the live service (the command in docs/service.md).

A real uvicorn server on the demo model, with an API key (so that the auth checks have something
to check) and a small cost budget (so that schema-valid requests stay quick), gets the command in
docs/service.md, run from the repository root with ``tests/app/schemathesis.toml`` (checks' settings,
seed, example count; its hooks in ``tests/app/schemathesis_hooks.py`` make realistic jobs). The run must end
with no failure, and its stateful phase must have chained real jobs into the other job routes.

The server runs as deployed, without ``BART_OPT_DOCS``, so it serves no ``/openapi.json``: the
schema comes from the app object (``app.openapi()``, what that route would answer), written to a
file that schemathesis reads, with ``--url`` naming the server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.app.helpers import live_server

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "app" / "schemathesis.toml"


def test_schemathesis_finds_nothing_against_the_live_service(make_app, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "cnn.jsonl").write_text(json.dumps({"id": "1", "article": "the council met.", "highlights": "a vote"}) + "\n")
    app = make_app(api_key="contract-key", db=str(tmp_path / "jobs.db"), data_dir=str(data), max_request_cost=2000)
    schema = tmp_path / "openapi.json"
    schema.write_text(json.dumps(app.openapi()))
    with live_server(app) as (host, port):
        run = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run", str(schema),
             "--url", f"http://{host}:{port}", "--no-color"],
            cwd=ROOT, env={**os.environ, "BART_OPT_API_KEY": "contract-key"},
            capture_output=True, text=True, timeout=480,
        )  # fmt: skip
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert "Configuration:    " + str(CONFIG) in report, report
    covered = re.search(r"API Links:\s+(\d+) covered", report)
    assert covered and int(covered.group(1)) > 0, report  # POST /evaluate's jobs were read, streamed, cancelled
