"""The layout shows the layers: no import circles, the library core never imports the service, files stay small."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "bart_opt")
# The library core is everything in bart_opt/ but the command line (which starts the service) and
# the benchmarks and self-check (which run it).
OUTSIDE_THE_CORE = ("bart_opt.cli", "bart_opt.bench")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


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
