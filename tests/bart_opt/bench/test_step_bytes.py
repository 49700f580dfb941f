"""The bytes-per-step bench (`python -m bart_opt.bench.step_bytes`) at a tiny shape on the meta device."""

from __future__ import annotations

import json

from bart_opt.bench import step_bytes


def test_bytes_per_step_grow_with_the_filled_cache_and_the_moved_rows(tmp_path, capsys):
    out = tmp_path / "bytes.json"
    assert step_bytes.main(["--shape", "tiny", "--inputs", "3", "--source", "40", "--moved-fraction", "0.5",
                            "--stride", "40", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["position"]: r for r in result["positions"]}
    total = lambda r, mode: r[mode]["decode"] + r[mode]["search"]  # noqa: E731
    # The default reads what is filled; the static search the filled part rounded up to 32 positions.
    best = "default_none_moved"
    assert total(rows[1], best) < total(rows[33], best) < total(rows[141], best)
    assert total(rows[1], "static") == total(rows[32], "static") < total(rows[33], "static")
    assert all(total(r, "default") > total(r, "default_none_moved") for t, r in rows.items() if t > 1)
    assert rows[1]["static"]["decode"] > 0 and rows[1]["default"]["search"] > 0
    assert "| mean over every position |" in capsys.readouterr().out
