"""The layout shows the layers: no import circles, the library core never imports the service, nor the
bench at import time, the jobs speak no HTTP, ``bart-opt --help`` starts without torch, files stay small."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "bart_opt")
# The library core is everything in bart_opt/ but the command line (which starts the service) and
# the benchmarks and self-check (which run it).
OUTSIDE_THE_CORE = ("bart_opt.cli", "bart_opt.bench")


def module_name(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_name(path, root): path for package in packages for path in sorted((root / package).rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports, anywhere in it (a function's lazy import included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {name for name in names if name in known}
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (Tarjan's strongly connected components of two or more modules;
    a package's ``__init__`` re-exporting its own modules is not one)."""
    def package_of(name: str) -> str:
        return name.rsplit(".", 1)[0] if "." in name else name

    edges = {name: {t for t in targets if not (package_of(t) == name or t.startswith(name + "."))}
             for name, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_there_are_no_import_circles():
    assert cycles(import_graph()) == []


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_library_core_never_imports_the_service():
    reaching = {name: sorted(t for t in targets if t.split(".")[0] == "app")
                for name, targets in import_graph().items()
                if name.startswith("bart_opt") and not name.startswith(OUTSIDE_THE_CORE)}
    assert {name: targets for name, targets in reaching.items() if targets} == {}


def test_module_names_do_not_collide_between_the_service_and_its_jobs():
    top = {path.stem for path in (REPO / "app").glob("*.py")} - {"__init__"}
    jobs = {path.stem for path in (REPO / "app" / "jobs").glob("*.py")} - {"__init__"}
    assert top & jobs == set()
    assert not {"schema", "schemas"} <= jobs


def test_files_stay_under_about_600_lines():
    long = {name: lines for name, path in modules().items()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 620}
    assert long == {}


def imported_names(tree: ast.AST, at_import_time: bool = False) -> set[str]:
    """Every module name `tree` imports (``from a import b`` gives ``a`` and ``a.b``). With `at_import_time`,
    only what runs when the module is imported: not the bodies of functions, nor ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if at_import_time and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if at_import_time and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def imports_of(root: Path, package: str, forbidden: tuple[str, ...], at_import_time: bool) -> dict[str, list[str]]:
    """The modules under `root`/`package` that import a module within `forbidden`, with what they import."""
    found = {}
    for name, path in modules(root, (package,)).items():
        names = imported_names(ast.parse(path.read_text(encoding="utf-8")), at_import_time)
        if hits := sorted(n for n in names if _within(n, forbidden)):
            found[name] = hits
    return found


def test_no_library_module_imports_the_service_at_import_time():
    # The bench included: its service benchmarks, the self-check's service line and `bart-opt serve`
    # import app inside the functions that run the service, so the library installs without it.
    assert imports_of(REPO, "bart_opt", ("app",), at_import_time=True) == {}


def test_a_bench_module_that_imports_the_service_is_found(tmp_path):
    bench = tmp_path / "bart_opt" / "bench"
    bench.mkdir(parents=True)
    (bench / "__init__.py").write_text("")
    (bench / "planted.py").write_text("import json\nimport app.main\n")
    (bench / "planted_from.py").write_text("try:\n    from app import settings\nexcept ImportError:\n    pass\n")
    (bench / "lazy.py").write_text("def run():\n    from app.main import create_app\n")
    (bench / "typing_only.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                          "    from app.settings import Settings\n")
    assert imports_of(tmp_path, "bart_opt", ("app",), at_import_time=True) == {
        "bart_opt.bench.planted": ["app.main"], "bart_opt.bench.planted_from": ["app", "app.settings"]}


HTTP = ("fastapi", "starlette", "app.errors")
"""What the jobs must not import (issue 39's contract): the domain raises its own errors, app/errors.py maps them."""


def test_the_jobs_import_no_http():
    # tests/app/test_errors.py checks the summarize core too; this one also catches ``from app import errors``.
    assert imports_of(REPO, "app/jobs", HTTP, at_import_time=False) == {}


def test_a_job_module_that_imports_http_is_found(tmp_path):
    jobs = tmp_path / "app" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "__init__.py").write_text("")
    (jobs / "routes.py").write_text("import fastapi\n")
    (jobs / "status.py").write_text("def refuse():\n    from starlette.status import HTTP_409_CONFLICT\n")
    (jobs / "mapped.py").write_text("from app import errors\n")
    (jobs / "clean.py").write_text("from app.jobs import store\nimport fastapi_like\n")
    assert imports_of(tmp_path, "app/jobs", HTTP, at_import_time=False) == {
        "app.jobs.routes": ["fastapi"], "app.jobs.status": ["starlette.status", "starlette.status.HTTP_409_CONFLICT"],
        "app.jobs.mapped": ["app.errors"]}


HEAVY = ("torch", "transformers", "datasets", "nltk", "fastapi", "app")
"""What ``bart-opt --help`` and ``--version`` must not import: each costs seconds, or belongs to an extra."""


def startup_imports(module: str, *argv: str, path: tuple[Path, ...] = (REPO,)) -> tuple[int, set[str]]:
    """``python -X importtime -m module argv`` with `path` on PYTHONPATH: its exit status and every module it
    imported (importtime lists each on stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", module, *argv], capture_output=True, text=True,
                          env=env, timeout=120)
    return proc.returncode, {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                             if line.startswith("import time:")}


def heavy(imported: set[str]) -> list[str]:
    return sorted(name for name in imported if _within(name, HEAVY))


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_import_no_torch(flag):
    status, imported = startup_imports("bart_opt.cli", flag)
    assert status == 0 and "bart_opt.engine.options" in imported  # the parser was built (-m runs the cli as __main__)
    assert heavy(imported) == []


def test_a_command_that_imports_torch_at_start_is_found(tmp_path):
    # A stand-in torch (an empty package first on the path), so the planted command costs no real import.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "planted_cli.py").write_text("import argparse\nimport torch\nargparse.ArgumentParser().parse_args()\n")
    status, imported = startup_imports("planted_cli", "--help", path=(tmp_path, REPO))
    assert status == 0 and heavy(imported) == ["torch"]
