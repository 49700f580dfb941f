"""The suite's own setup (tests/conftest.py): the pytest-xdist groups name files that exist."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import AGREEMENT_FILES, LONG_FILES, LONG_TESTS, RAY_FILES, is_long, xdist_group

REPO = Path(__file__).resolve().parents[1]


def group_files(group: str) -> list[Path]:
    """The test files `xdist_group` puts in `group`."""
    files = sorted((REPO / "tests").rglob("test_*.py"))
    return [path for path in files if xdist_group(f"{path.relative_to(REPO).as_posix()}::test") == group]


def test_ray_files_and_the_image_tests_form_one_group_each_and_other_files_their_own():
    # A renamed or moved Ray file would otherwise start its own Ray instance on the other worker.
    assert all((REPO / path).is_file() for path in RAY_FILES)
    assert {path.relative_to(REPO).as_posix() for path in group_files("ray")} == RAY_FILES
    assert [path.name for path in group_files("docker")] == ["test_image.py"]
    assert xdist_group("tests/bart_opt/engine/test_model.py::test_x[a]") == "tests/bart_opt/engine/test_model.py"


def test_the_long_runs_name_files_and_tests_that_exist():
    assert all((REPO / path).is_file() for path in LONG_FILES)
    for nodeid in LONG_TESTS:
        path, name = nodeid.split("::")
        assert f"def {name}(" in (REPO / path).read_text(), nodeid
    assert is_long("tests/docker/test_image.py::test_x", ())
    assert is_long("tests/app/device/test_engine.py::t", ["ray_cluster"])
    assert not is_long("tests/app/device/test_engine.py::t", ["engine"])
    assert not is_long("tests/bart_opt/engine/test_model.py::t", ())


def test_the_agreement_files_exist_and_form_one_group():
    assert {path.relative_to(REPO).as_posix() for path in group_files("agreement")} == AGREEMENT_FILES
