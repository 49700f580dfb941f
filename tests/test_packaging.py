"""pyproject.toml's install: a core without the service, each extra what `bart_opt.extras` checks for, and the
scripts that install it (.ci/run, the Dockerfile, the README) naming extras that exist."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from bart_opt import extras

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
EXTRAS = PROJECT["optional-dependencies"]
NOT_IN_THE_CORE = {"fastapi", "uvicorn", "sqlalchemy", "alembic", "matplotlib", "ninja", "fastapi-offline",
                   "pydantic-settings", "prometheus-client", "httpx", "psycopg", "ctranslate2", "ray"}
"""Issue 39's contract (no fastapi, uvicorn, sqlalchemy or matplotlib), and what else only an extra needs."""


def name(requirement: str) -> str:
    """The normalized distribution name of a requirement (``uvicorn[standard]>=0.29`` -> ``uvicorn``)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def resolved(extra: str) -> set[str]:
    """The distributions `extra` asks for, through the extras it names of this project (``bart-opt[peers]``)."""
    found = set()
    for requirement in EXTRAS[extra]:
        if name(requirement) == "bart-opt":
            for inner in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                found |= resolved(inner.strip())
        else:
            found.add(name(requirement))
    return found


def test_the_core_installs_no_service_plot_or_builder():
    assert {name(r) for r in PROJECT["dependencies"]} & NOT_IN_THE_CORE == set()


def test_each_extra_installs_the_modules_the_commands_check_for():
    for extra, modules in extras.MODULES.items():
        assert {module.replace("_", "-") for module in modules} <= resolved(extra), extra


def test_the_extras_hold_what_the_issue_names():
    assert {"fastapi", "uvicorn", "sqlalchemy", "alembic", "fastapi-offline"} <= resolved("serve")
    assert {"matplotlib", "ctranslate2"} <= resolved("bench") and resolved("fast") == {"ninja"}
    assert {"serve", "bench", "fast", "peers", "ray", "postgres", "test"} <= set(EXTRAS)


def test_ci_installs_every_extra_and_the_readme_what_the_tests_need():
    ci = re.search(r'pip install --quiet -e "\.\[([a-z,]+)\]"', (REPO / ".ci" / "run").read_text(encoding="utf-8"))
    assert set(ci.group(1).split(",")) == set(EXTRAS)
    readme = re.search(r'pip install -e "\.\[([a-z,]+)\]" && bart-opt demo-model',
                       (REPO / "README.md").read_text(encoding="utf-8"))
    assert set(readme.group(1).split(",")) <= set(EXTRAS)
    needed = set.union(*(resolved(extra) for extra in readme.group(1).split(",")))
    assert NOT_IN_THE_CORE <= needed  # the README's second command runs every test


def test_the_image_installs_the_service():
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    named = set(re.search(r'for e in \(([^)]*)\)', dockerfile).group(1).replace('"', "").replace(" ", "").split(","))
    assert {"serve", "fast"} <= named <= set(EXTRAS)


def test_a_planted_core_dependency_is_found():
    assert {name(r) for r in ["torch>=2.4", "FastAPI>=0.110", "uvicorn[standard]>=0.29"]} & NOT_IN_THE_CORE == {
        "fastapi", "uvicorn"}
