"""The report's plots: valid PNG and SVG files for every metric the rows hold, the same bytes every time."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET
from pathlib import Path

from bart_opt.compare import compare_runs
from bart_opt.report.plots import slug, write_plots
from bart_opt.report.runs import load_report_runs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """The width and height in a PNG's header chunk (IHDR, the first chunk), after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path} is not a PNG"
    assert data[-8:-4] == b"IEND", f"{path} is cut short"
    return struct.unpack(">II", data[16:24])


def check_plot(path: Path) -> None:
    width, height = png_size(path)
    assert width > 200 and height > 150
    root = ET.parse(path.with_suffix(".svg")).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"


def test_every_metric_of_the_rows_gets_its_plots_and_the_forest_its_panels(report_runs, tmp_path):
    runs = load_report_runs([report_runs["lead"], report_runs["model"]])
    for run in runs:  # another metric's per-example scores, as the rows will hold them
        for k, row in enumerate(run.rows):
            row["scores"] = {"length": {"tokens": float(len(row["prediction"].split())), "sentences": 1.0 + k % 2}}
    comparison = compare_runs([run.compared() for run in runs], resamples=200, top=0)
    comparison["comparisons"][0]["length"] = {"tokens": {"delta": -1.5, "interval": [-3.0, 0.25]}}
    written = write_plots(runs, tmp_path, comparison)
    stems = ["scores-rouge", "length-rouge", "scores-length", "length-length", "forest", "batches"]
    assert written == [tmp_path / f"{stem}.{fmt}" for stem in stems for fmt in ("png", "svg")]
    for path in written[::2]:
        check_plot(path)
    again = write_plots(runs, tmp_path / "again", comparison)
    assert [path.read_bytes() for path in again] == [path.read_bytes() for path in written]


def test_a_single_run_has_no_forest_plot(report_runs, tmp_path):
    written = write_plots(load_report_runs([report_runs["lead"]]), tmp_path)
    assert {path.stem for path in written} == {"scores-rouge", "length-rouge", "batches"}
    check_plot(tmp_path / "batches.png")  # no memory peaks to draw: the panel says so


def test_metric_names_become_safe_file_names():
    assert (slug("rouge"), slug("bert score/x"), slug("../..")) == ("rouge", "bert-score-x", "metric")
