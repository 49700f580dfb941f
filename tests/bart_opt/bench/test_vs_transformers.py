"""Smoke test of the benchmark script at --size tiny (not timed: only that it runs and reports properly)."""

from __future__ import annotations

import json

from bart_opt.bench import vs_transformers as bench


def test_tiny_bench_writes_json_table_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    status = bench.main(
        ["--size", "tiny", "--device", "cpu", "--max-len", "48", "--batch-size", "3", "--repeats", "0", "--threads", "1",
         "--json", str(out_json), "--plot", str(out_png)]
    )
    assert status == 0

    payload = json.loads(out_json.read_text())
    assert set(payload) == {"config", "results", "ratios", "log_overhead"}
    assert payload["config"]["batch_size"] == 3 and payload["config"]["max_len"] == 48
    assert payload["config"]["lengths"][0] == 48 and len(set(payload["config"]["lengths"])) == 3

    rows = {(r["engine"], r["task"]): r for r in payload["results"]}
    assert set(rows) == {(e, t) for e in bench.ENGINES for t in bench.TASKS}
    for row in rows.values():
        assert {"engine", "task", "peak_bytes", "weights_bytes", "seconds"} <= set(row)
        assert row["peak_bytes"] > 0 and row["seconds"] > 0
        assert row["peak_source"] == "live_tensors"
    assert rows["bart_opt", "forward"]["weights_bytes"] == rows["transformers", "forward"]["weights_bytes"]
    assert rows["bart_opt_exact", "forward"]["weights_bytes"] == rows["bart_opt", "forward"]["weights_bytes"]
    for task in ("generate_9", "throughput_cnn"):
        ref = rows["transformers", task]
        for engine in ("bart_opt", "bart_opt_exact"):
            ours = rows[engine, task]
            assert ours["equal_to_transformers"] is True
            assert ours["generated_tokens"] == ref["generated_tokens"] > 0
            assert ours["samples_per_s"] == 3 / ours["seconds"]
    assert rows["bart_opt", "generate_9"]["output_len"] == 10  # decoder start + 9 new tokens
    assert rows["bart_opt", "throughput_cnn"]["output_len"] >= 57  # min_length 56 after the start token

    ratios = payload["ratios"]
    assert set(ratios) == set(bench.TASKS)
    gen = ratios["generate_9"]
    ours, ref = rows["bart_opt", "generate_9"], rows["transformers", "generate_9"]
    assert gen["peak"] == ours["peak_bytes"] / ref["peak_bytes"]
    assert gen["outputs_equal"] is True
    assert ratios["forward"]["max_abs_logit_diff"] < 1e-3
    exact = rows["bart_opt_exact", "generate_9"]
    assert gen["exact"]["outputs_equal"] is True
    assert gen["exact"]["peak"] == exact["peak_bytes"] / ref["peak_bytes"]
    assert gen["exact"]["peak_vs_default"] == exact["peak_bytes"] / ours["peak_bytes"]
    assert ratios["forward"]["exact"]["max_abs_logit_diff"] == 0.0

    overhead = payload["log_overhead"]
    assert overhead["log_mem_us"] > 0 and overhead["counter_slowdown"] > 0

    printed = capsys.readouterr().out
    assert "| generate_9 | bart_opt |" in printed and "| generate_9 | bart_opt_exact |" in printed
    assert "peak (bart_opt / transformers)" in printed and "| generate_9 | exact |" in printed
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_model_folder_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    assert bench.main(["--model", str(missing), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "cannot load" in err and str(missing) in err


def test_the_title_names_the_throughput_batch_when_it_differs():
    config = {"batch_size": 6, "max_len": 1024, "throughput_batch_size": 48, "throughput_max_len": 1024,
              "tasks": ["throughput_cnn"]}
    assert bench.describe_batches(config) == "throughput_cnn: 48 inputs padded to 1024 tokens"
    config["tasks"] = ["forward", "throughput_cnn"]
    assert bench.describe_batches(config) == ("6 inputs padded to 1024 tokens; "
                                             "throughput_cnn: 48 inputs padded to 1024 tokens")
    config["throughput_batch_size"] = 6
    assert bench.describe_batches(config) == "6 inputs padded to 1024 tokens"


def test_quantize_int8_benchmarks_the_int8_mode_without_exact_mode(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    status = bench.main(["--size", "tiny", "--device", "cpu", "--max-len", "48", "--batch-size", "3", "--repeats", "0",
                         "--threads", "1", "--tasks", "generate_9", "--skip-overhead", "--quantize", "int8",
                         "--json", str(out_json)])
    assert status == 0
    payload = json.loads(out_json.read_text())
    assert payload["config"]["quantize"] == "int8"
    rows = {r["engine"]: r for r in payload["results"]}
    assert set(rows) == {"transformers", "bart_opt"}  # exact mode is float arithmetic: int8 refuses it
    # The int8 weights, packed outside torch's tensors, are counted: about a third of float32's at this shape.
    assert 0.2 < rows["bart_opt"]["weights_bytes"] / rows["transformers"]["weights_bytes"] < 0.45
    assert rows["bart_opt"]["generated_tokens"] == rows["transformers"]["generated_tokens"] > 0
    assert "(float32, bart_opt int8)" in capsys.readouterr().out


def test_quantize_is_refused_where_it_cannot_run(capsys):
    for argv in (["--quantize", "int8", "--peers", "ctranslate2"], ["--quantize", "int8", "--device", "cuda"],
                 ["--quantize", "int4"]):
        try:
            bench.main(argv)
        except SystemExit as stop:
            assert stop.code == 2
        else:
            raise AssertionError(f"{argv} was accepted")
    err = capsys.readouterr().err
    assert "--quantize is for bart_opt against transformers on a CPU" in err and "invalid choice: 'int4'" in err


def test_el_attention_adds_its_rows_and_ratios(tmp_path):
    out_json = tmp_path / "bench.json"
    status = bench.main(["--size", "tiny", "--device", "cpu", "--max-len", "48", "--batch-size", "3", "--repeats", "0",
                         "--threads", "1", "--tasks", "forward,generate_9", "--skip-exact", "--skip-overhead",
                         "--el-attention", "--json", str(out_json)])
    assert status == 0
    payload = json.loads(out_json.read_text())
    assert payload["config"]["el_attention"] is True
    rows = {(r["engine"], r["task"]): r for r in payload["results"]}
    engines = ("transformers", "bart_opt", bench.EL_ENGINE)
    assert set(rows) == {(e, t) for e in engines for t in ("forward", "generate_9")}
    el, default = rows[bench.EL_ENGINE, "generate_9"], rows["bart_opt", "generate_9"]
    assert el["equal_to_transformers"] is True and el["generated_tokens"] == default["generated_tokens"]
    ratios = payload["ratios"]
    assert ratios["generate_9"]["el"]["peak_vs_default"] == el["peak_bytes"] / default["peak_bytes"]
    assert ratios["generate_9"]["el"]["seconds_vs_default"] == el["seconds"] / default["seconds"]
    # A teacher-forced pass does not use EL-attention: the same logits as the default mode's.
    assert ratios["forward"]["el"]["max_abs_logit_diff"] == ratios["forward"]["max_abs_logit_diff"]


def test_static_adds_its_engine_row_and_a_throughput_table(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    assert bench.main(["--size", "tiny", "--device", "cpu", "--max-len", "24", "--batch-size", "2", "--repeats", "0",
                       "--threads", "1", "--skip-exact", "--skip-overhead", "--static", "--tasks",
                       "generate_9,throughput_cnn", "--json", str(out_json)]) == 0
    payload = json.loads(out_json.read_text())
    rows = {(r["engine"], r["task"]): r for r in payload["results"]}
    assert set(rows) == {(e, t) for e in ("transformers", "bart_opt", "bart_opt_static")
                         for t in ("generate_9", "throughput_cnn")}
    for task in ("generate_9", "throughput_cnn"):
        assert rows["bart_opt_static", task]["equal_to_transformers"] is True
        static = payload["ratios"][task]["static"]
        assert static["outputs_equal"] is True
        assert static["seconds_vs_default"] == rows["bart_opt_static", task]["seconds"] / rows["bart_opt", task]["seconds"]
    assert payload["profiles"] == {"transformers": None, "bart_opt": None, "bart_opt_static": None}
    printed = capsys.readouterr().out
    assert "| throughput_cnn | static |" in printed
    docs = rows["bart_opt_static", "throughput_cnn"]["samples_per_s"]
    assert f"| bart_opt_static | {docs:.2f} |" in printed and "| n/a | n/a | n/a | n/a |" in printed


def test_plot_without_matplotlib_is_refused_before_any_run(tmp_path, capsys, monkeypatch):
    from bart_opt import extras

    monkeypatch.setattr(extras, "missing", lambda extra: ["matplotlib"] if extra == "bench" else [])
    monkeypatch.setattr(bench, "build_random_checkpoint", lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    assert bench.main(["--size", "tiny", "--device", "cpu", "--plot", str(tmp_path / "bench.png")]) == 2
    assert capsys.readouterr().err == ("bart-opt bench: error: --plot needs matplotlib, which this installation "
                                       "lacks: pip install 'bart-opt[bench]'\n")
