"""Passwords hidden in the URLs a user gives (tracking URIs here; the jobs database's forms in tests/app/jobs)."""

from __future__ import annotations

import pytest

from bart_opt.redaction import redacted


@pytest.mark.parametrize("uri, shown", [
    ("http://ana:s3cret@mlflow.internal:5000", "http://ana:***@mlflow.internal:5000"),
    ("https://ana:p@ss/w0rd@mlflow.internal/prefix", "https://ana:***@mlflow.internal/prefix"),
    ("https://mlflow.internal/?user=ana&password=s3cret", "https://mlflow.internal/?user=ana&password=***"),
    ("http://ana@mlflow.internal:5000", "http://ana@mlflow.internal:5000"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("sqlite:////var/lib/mlflow/mlflow.db", "sqlite:////var/lib/mlflow/mlflow.db"),
    ("./mlruns", "./mlruns"),
])
def test_a_tracking_uri_is_shown_without_its_password(uri, shown):
    assert redacted(uri) == shown
