"""The primitive-cache benchmark: its table, and one small run end to end."""

from __future__ import annotations

from bart_opt.bench import primitive_cache


def run(capacity: int, seconds: float, end: float, summaries: str = "same") -> dict:
    return {"capacity": capacity, "seconds": seconds, "rss_loaded_mb": 400.0, "rss_end_mb": end, "summaries": summaries}


def test_the_table_shows_each_run_its_growth_and_the_best_runs_ratio():
    runs = [run(64, 10.0, 450), run(1024, 12.0, 800), run(64, 11.0, 452), run(1024, 9.0, 810)]
    table = primitive_cache.table(runs, 64)
    assert "| 64 | 1 | 10.00 | 400 | 450 | +50 |" in table and "| 1024 | 2 | 9.00 | 400 | 810 | +410 |" in table
    assert "best run at 64 entries against 1024: 0.90x the speed; the same summaries in every run: yes" in table
    assert table.endswith("yes") and primitive_cache.table([run(64, 1, 1), run(1024, 1, 1, "other")], 64).endswith("NO")


def test_a_small_run_writes_the_same_summaries_at_both_capacities(make_checkpoint, capsys):
    """The bound changes which primitives are kept, never what they compute (the memory itself:
    tests/bart_opt/engine/test_kernels.py)."""
    assert primitive_cache.main(["--model", make_checkpoint(), "--docs", "12", "--batch", "4", "--repeats", "1"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("CPU: ") and "the same summaries in every run: yes" in printed
    capacities = [line.split("|")[1].strip() for line in printed.splitlines() if line.startswith("| 64 |")
                  or line.startswith("| 1024 |")]
    assert capacities == ["64", "1024"], printed
