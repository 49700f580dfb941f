"""``BART_OPT_DB`` (`app.jobs.database`): its password never printed, and a failed connection named by its cause.

The PostgreSQL cases run against a throwaway cluster (`postgres_cluster`) whose test users log in with a password.
"""

from __future__ import annotations

import logging
import uuid
from urllib.parse import quote

import pytest
from pydantic import ValidationError

from app.jobs.database import InvalidDatabaseUrl, database_url, redacted
from app.jobs.store import JobStore, StoreError
from app.settings import Settings
from bart_opt.bench.service_load import free_port
from bart_opt.cli import main
from tests.app.helpers import serving

PASSWORD = "Sx/9@Qk:7%Zr"  # '/', '@', ':' and '%': each one breaks a naive URL parser or redaction
ENCODED = quote(PASSWORD, safe="")


def leaks(text: str) -> list[str]:
    """Every 4-character piece of the password, as given or percent-encoded, that `text` shows."""
    return sorted({form[i:i + 4] for form in (PASSWORD, ENCODED) for i in range(len(form) - 3) if form[i:i + 4] in text})


def url_forms(port: int, database: str = "jobs", user: str = "app") -> dict[str, str]:
    where = f"127.0.0.1:{port}/{database}"
    return {
        "userinfo, encoded": f"postgresql://{user}:{ENCODED}@{where}",
        "query parameter, encoded": f"postgresql://{user}@{where}?sslmode=disable&password={ENCODED}",
        "query parameter, as typed": f"postgresql://{user}@{where}?password={PASSWORD}",
        "userinfo, as typed": f"postgresql://{user}:{PASSWORD}@{where}",
        "lost slash": f"postgresql:/{user}:{PASSWORD}@{where}",
        "lost both slashes": f"postgresql:{user}:{PASSWORD}@{where}",
        "unencoded %": f"postgresql://{user}:a%zz@{where}",
    }


@pytest.mark.parametrize("form", list(url_forms(5432)))
def test_every_form_of_the_url_is_shown_with_its_password_hidden(form):
    value = url_forms(5432)[form]
    shown = redacted(value)
    assert leaks(shown) == [] and "a%zz" not in shown and "***" in shown, shown
    assert shown.startswith("postgresql:") and "127.0.0.1:5432/jobs" in shown


@pytest.mark.parametrize("form", ["query parameter, as typed", "userinfo, as typed", "lost slash", "lost both slashes",
                                  "unencoded %"])
def test_a_url_that_cannot_be_read_as_meant_is_refused_at_start_with_its_password_hidden(form, capsys, tmp_path,
                                                                                        monkeypatch):
    value = url_forms(5432)[form]
    with pytest.raises(InvalidDatabaseUrl) as refused:
        database_url(value)
    assert leaks(str(refused.value)) == [] and "a%zz" not in str(refused.value)
    with pytest.raises(ValidationError) as invalid:
        Settings(db=value)
    assert leaks(str(invalid.value)) == []
    monkeypatch.setenv("BART_OPT_DB", value)
    assert main(["serve", "--model", str(tmp_path / "unused"), "--port", "0"]) == 2
    printed = capsys.readouterr()
    assert "BART_OPT_DB" in printed.err and leaks(printed.out + printed.err) == [] and "a%zz" not in printed.err


@pytest.fixture(scope="module")
def password_user(postgres_cluster) -> str:
    """A user of the session's cluster who logs in with `PASSWORD` and owns the public schema of its database."""
    name = f"app_{uuid.uuid4().hex[:8]}"
    postgres_cluster.add_user(name, PASSWORD, database=f"jobs_{name}")
    return name


@pytest.mark.parametrize("form", ["userinfo, encoded", "query parameter, encoded"])
def test_the_forms_that_connect_log_the_open_database_without_its_password(form, password_user, postgres_cluster,
                                                                          make_app, caplog):
    value = url_forms(postgres_cluster.port, f"jobs_{password_user}", password_user)[form]
    with caplog.at_level(logging.INFO), serving(make_app(db=value)) as client:
        listing = client.get("/evaluate")
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert listing.status_code == 200, listing.text
    assert f"jobs database postgresql+psycopg://{password_user}" in logged and " open" in logged
    assert leaks(logged) == [] and "***" in logged


# ---- each cause of a failed connection, named: in the 503, the log and /ready -----------------------


@pytest.fixture(scope="module")
def limited_user(postgres_cluster, password_user) -> str:
    """A user who logs in with `PASSWORD` but may create nothing in its database (``locked_<password_user>``)."""
    name = f"limited_{password_user}"
    postgres_cluster.add_user(name, PASSWORD, database=f"locked_{password_user}", create=False)
    return name


def causes(cluster, user: str, limited: str) -> dict[str, tuple[str, str]]:
    """url and the words naming the cause, for each way the jobs database can refuse the service."""
    return {
        "wrong password": (f"postgresql://{user}:wrong@127.0.0.1:{cluster.port}/jobs_{user}",
                           "refused its login (password authentication failed: check the user and password"),
        "unknown user": (f"postgresql://nobody_{user}:{ENCODED}@127.0.0.1:{cluster.port}/jobs_{user}",
                         "refused its login"),
        "no CREATE right": (f"postgresql://{limited}:{ENCODED}@127.0.0.1:{cluster.port}/locked_{user}",
                            "cannot be accessed (permission denied: its user lacks a right it needs, such as CREATE"),
        "unreachable": (f"postgresql://{user}:{ENCODED}@127.0.0.1:{free_port()}/jobs_{user}",
                        "cannot be reached (nothing listens at its address: connection refused)"),
    }


@pytest.mark.parametrize("cause", ["wrong password", "unknown user", "no CREATE right", "unreachable"])
def test_the_store_names_why_it_cannot_open_the_database(cause, password_user, limited_user, postgres_cluster):
    value, words = causes(postgres_cluster, password_user, limited_user)[cause]
    store = JobStore(value)
    try:
        with pytest.raises(StoreError) as failed:
            store.initialize()
    finally:
        store.close()
    assert words in failed.value.reason and "does not answer" not in failed.value.reason
    assert "127.0.0.1" not in failed.value.reason and password_user not in failed.value.reason  # safe for a client


@pytest.mark.parametrize("cause", ["wrong password", "no CREATE right", "unreachable"])
def test_the_503_the_log_and_ready_name_the_cause(cause, password_user, limited_user, postgres_cluster, make_app,
                                                  caplog):
    value, words = causes(postgres_cluster, password_user, limited_user)[cause]
    with caplog.at_level(logging.INFO), serving(make_app(db=value, db_connect_timeout_s=2)) as client:
        listing = client.get("/evaluate")
        ready = client.get("/ready")
    assert listing.status_code == 503 and words in listing.json()["error"]["message"]
    assert ready.status_code == 200 and ready.json()["status"] == "degraded"
    warning = next(w for w in ready.json()["warnings"] if w["code"] == "jobs_unavailable")
    assert words in warning["message"]
    logged = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert any(words in line for line in logged), logged
    assert leaks("\n".join(record.getMessage() for record in caplog.records)) == []
