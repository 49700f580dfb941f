"""The EL-attention speed bench (`python -m bart_opt.bench.el_speed`) at the tiny size: its table and its checks."""

from __future__ import annotations

import pytest
import torch

from bart_opt.bench import el_speed


def test_it_times_both_modes_and_prints_their_ratio(capsys):
    threads = torch.get_num_threads()
    try:
        assert el_speed.main(["--size", "tiny", "--inputs", "2", "--max-len", "16", "--repeats", "1",
                              "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr()
    assert out.err.count("round 0") == 2 and out.err.count("round 1") == 2  # a warm-up round, then one timed
    row = out.out.strip().splitlines()[-1].split(" | ")
    default, el, ratio = float(row[0].strip("| ")), float(row[1]), row[2]
    assert default > 0 and el > 0 and ratio.endswith("x")
    assert abs(float(ratio[:-1]) - el / default) <= 0.01 + 1e-3 * el / default  # printed to 4 digits, the ratio to 2
    assert row[3] == "yes"  # float32, a tiny batch: EL-attention gives the default's ids


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--inputs", "0"], ["--max-len", "2"], ["--size", "huge"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        el_speed.main(argv)
