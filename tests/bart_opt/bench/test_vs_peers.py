"""``bart-opt bench --peers``: workload, result rows, table, and one tiny run with CTranslate2."""

from __future__ import annotations

import json

import pytest

from bart_opt.engine import hardware
from bart_opt.bench import vs_peers, vs_transformers as bench
from bart_opt.bench.engines import EngineSpec
from bart_opt.bench.isa import UNKNOWN


def test_workload_is_twelve_cnn_like_documents():
    lengths = vs_peers.doc_lengths(12, 1024)
    assert lengths == list(vs_peers.CNN_DOC_LENGTHS)
    assert (min(lengths), max(lengths), sum(lengths)) == (453, 1024, 9537)
    scaled = vs_peers.doc_lengths(14, 128)
    assert max(scaled) == 128 and min(scaled) == round(453 / 8) and scaled[12:] == scaled[:2]


def test_engines_are_reference_ours_then_peers():
    labels = [s.label for s in vs_peers.engine_specs(["ctranslate2"])]
    assert labels == ["transformers float32", "bart_opt float32", "bart_opt bfloat16", "bart_opt_fast bfloat16",
                      "bart_opt int8", "bart_opt_fast int8+bfloat16", "ctranslate2 float32", "ctranslate2 int8"]
    assert [s.label for s in vs_peers.engine_specs([])] == labels[:6]
    # Without native bfloat16 the fastest combination is int8 itself (the fast mode changes nothing in float32).
    assert "bart_opt_fast int8+bfloat16" not in [s.label for s in vs_peers.engine_specs([], native_bf16=False)]
    fastest = vs_peers.FASTEST
    assert fastest.quantize == "int8" and fastest.float_dtype.is_floating_point and str(fastest.float_dtype) == "torch.bfloat16"
    assert EngineSpec("bart_opt", "int8").float_dtype.itemsize == 4 and EngineSpec("ctranslate2", "int8").quantize is None


def _first(outputs) -> dict:
    return {"outputs": outputs, "memory_run_seconds": 9.0, "memory_run_cpu_seconds": 17.0, "loaded_bytes": 2**30,
            "peak_rss_bytes": 3 * 2**20,
            "peak_rss_source": "VmHWM reset"}


REFERENCE_OUT = [[2, 0, 5, 2], [2, 0, 6, 7, 2]]


def test_result_row_counts_identical_outputs_and_keeps_the_spread():
    runs = [{"seconds": 4.0, "cpu_seconds": 7.0, "same_as_first": True},
            {"seconds": 3.0, "cpu_seconds": 6.5, "same_as_first": True},
            {"seconds": 5.0, "cpu_seconds": 8.0, "same_as_first": True}]
    row = vs_peers.result_row(EngineSpec("ctranslate2", "int8"), _first([[2, 0, 5, 2], [2, 0, 6, 2]]), runs,
                                 REFERENCE_OUT)
    assert row["seconds"] == 3.0 and row["seconds_runs"] == [4.0, 3.0, 5.0] and row["spread"] == 2.0
    assert row["cpu_seconds"] == 6.5
    assert row["identical_to_reference"] == 1 and row["identical_docs"] == [True, False]
    assert row["generated_tokens"] == 6 and row["tokens_per_s"] == 2.0 and row["docs_per_s"] == 2 / 3
    assert row["deterministic"] is True and row["peak_rss_bytes"] == 3 * 2**20
    unstable = vs_peers.result_row(EngineSpec("bart_opt", "float32"), _first(REFERENCE_OUT),
                                      [{"seconds": 1.0, "cpu_seconds": 2.0, "same_as_first": False}], REFERENCE_OUT)
    assert unstable["deterministic"] is False and unstable["identical_to_reference"] == 2
    memory_run_only = vs_peers.result_row(EngineSpec("bart_opt", "float32"), _first(REFERENCE_OUT), [], REFERENCE_OUT)
    assert memory_run_only["seconds"] == 9.0 and memory_run_only["cpu_seconds"] == 17.0


def _rows(seconds: dict) -> list[dict]:
    rows = []
    for spec in vs_peers.engine_specs(["ctranslate2"]):
        out = REFERENCE_OUT if spec.name != "ctranslate2" else [[2, 0, 9, 2], [2, 0, 6, 7, 2]]
        first = _first(out)
        rows.append(vs_peers.result_row(spec, first, [{"seconds": seconds[spec.label], "cpu_seconds": 2 * seconds[spec.label],
                                                                 "same_as_first": True}],
                                           REFERENCE_OUT))
    return rows


CPU = {"model": "AMD EPYC 7B13 64-Core Processor", "flags": ["avx2"], "isa": "AVX2", "native_bf16": False}


def test_targets_and_table():
    seconds = {"transformers float32": 90.0, "bart_opt float32": 12.0, "bart_opt bfloat16": 8.0,
               "bart_opt_fast bfloat16": 6.0, "bart_opt int8": 5.0, "bart_opt_fast int8+bfloat16": 4.0,
               "ctranslate2 float32": 12.6, "ctranslate2 int8": 9.0}
    rows = _rows(seconds)
    goals = vs_peers.targets(rows)
    assert goals["bart_opt_float32_vs_ctranslate2_float32"] == {"speed_ratio": 12.6 / 12.0, "target": 1.0, "met": True}
    assert goals["bart_opt_fastest_vs_ctranslate2_int8"] == {"speed_ratio": 9.0 / 4.0, "target": 1.5, "met": True,
                                                            "engine": "bart_opt_fast int8+bfloat16"}
    assert vs_peers.targets(rows, native_bf16=False)["bart_opt_fastest_vs_ctranslate2_int8"]["target"] == 1.3
    assert vs_peers.targets(rows[:6]) == {}
    rows[1]["identical_to_reference"] = 1  # fast enough, but not transformers' ids: the float32 target is missed
    assert vs_peers.targets(rows)["bart_opt_float32_vs_ctranslate2_float32"]["met"] is False
    rows[1]["identical_to_reference"] = 2

    config = {"model": "random tiny", "docs": 2, "min_doc_len": 40, "max_doc_len": 48, "input_tokens": 88,
              "threads": 2, "repeats": 1, "settings_text": "num_beams 4", "cpu": CPU, "isa": "avx2",
              "libraries": {"aten": "AVX2", "ctranslate2": "AVX2"}}
    table = vs_peers.format_table(config, rows)
    assert table.startswith("CPU: AMD EPYC 7B13 64-Core Processor; ISA AVX2 (limited to AVX2 in every engine); "
                            "flags avx2 yes, avx512f no")
    assert "libraries: aten AVX2, ctranslate2 AVX2" in table.splitlines()[0]
    assert "| bart_opt_fastest_vs_ctranslate2_int8 (bart_opt_fast int8+bfloat16) | 2.25x | >= 1.3x | yes |" in table
    assert "2 documents of 40-48 tokens (88 in all), 2 thread(s) each" in table
    assert "| bart_opt | float32 | 12.00 | 1 run | 24.00 | 0.167 | 0.6 | 7.50x | 1.00 GiB | 3.00 MiB | 2/2 |" in table
    assert "| ctranslate2 | int8 | 9.00 | 1 run | 18.00 | 0.222 | 0.8 | 10.00x | 1.00 GiB | 3.00 MiB | 1/2 |" in table
    assert "| bart_opt_fast bfloat16 |" not in table and "| bart_opt_fast | bfloat16 | 6.00 |" in table
    assert "| bart_opt | int8 | 5.00 |" in table


def test_unknown_peer_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--peers", "onnxruntime"])
    assert stop.value.code == 2
    assert "unknown peer(s) onnxruntime" in capsys.readouterr().err


def test_missing_peer_package_is_a_clear_error(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ctranslate2" else real(name, *a))
    assert bench.main(["--peers", "ctranslate2"]) == 2
    assert "pip install 'bart-opt[peers]'" in capsys.readouterr().err


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_tiny_peer_run_end_to_end(tmp_path, capsys, isa):
    """The whole command; with --isa avx2 every engine's libraries must report AVX2 (checked by the run
    itself, before any engine loads) and every torch worker ran ATen's AVX2 kernels."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is the peers extra: pip install -e '.[peers]'")
    out_json = tmp_path / "peers.json"
    status = bench.main(["--peers", "ctranslate2", "--size", "tiny", "--docs", "2", "--max-len", "48",
                         "--repeats", "2", "--threads", "1", "--isa", isa, "--json", str(out_json)])
    assert status == 0
    payload = json.loads(out_json.read_text())
    config, rows = payload["config"], {r["label"]: r for r in payload["results"]}
    assert config["doc_lengths"] == [48, 48] and config["threads"] == 1
    assert config["ctranslate2_options"]["max_decoding_length"] == 140
    assert config["cpu"]["model"] == hardware.probe().model and config["isa"] == isa
    torch_isas = {r["torch_isa"] for r in rows.values() if r["engine"] != "ctranslate2"}
    if isa == "avx2":  # a library that names no ISA (MKL on an AMD CPU) says so, and is not held to it
        assert set(config["libraries"].values()) <= {"AVX2", UNKNOWN} and config["cpu"]["isa"] == "AVX2"
        assert {config["libraries"][lib] for lib in ("aten", "onednn", "ctranslate2")} == {"AVX2"}
        assert torch_isas == {"AVX2"} and not config["cpu"]["native_bf16"]
        assert config["env"]["CT2_FORCE_CPU_ISA"] == "AVX2" and config["env"]["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    else:
        assert torch_isas == {hardware.probe().torch_isa} and config["env"] == {}
    assert list(rows) == [s.label for s in vs_peers.engine_specs(["ctranslate2"], config["cpu"]["native_bf16"])]
    for row in rows.values():
        assert row["timed_runs"] == 2 and len(row["seconds_runs"]) == 2 and row["deterministic"] is True
        assert row["seconds"] > 0 and row["cpu_seconds"] > 0
        assert row["generated_tokens"] >= 2 * 56  # min_length 56 after the start token
        assert row["peak_rss_bytes"] > 0 and row["loaded_bytes"] > 0
        assert all(57 <= n <= 142 for n in row["output_lengths"])
        assert row["peak_rss_source"] == "VmHWM reset"
    assert rows["transformers float32"]["identical_to_reference"] == 2  # the reference against itself
    assert all(0 <= row["identical_to_reference"] <= 2 for row in rows.values())  # the others: figures
    assert set(payload["targets"]) == {"bart_opt_float32_vs_ctranslate2_float32", "bart_opt_fastest_vs_ctranslate2_int8"}
    printed = capsys.readouterr().out
    assert printed.startswith(f"CPU: {hardware.probe().model}; ISA {config['cpu']['isa']}")
    assert "| ctranslate2 | int8 |" in printed and "| bart_opt | int8 |" in printed
    assert "same ids as transformers fp32" in printed


def test_engines_option_limits_the_rows_and_refuses_unknown_ones(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--isa", "avx2"])  # without --peers
    assert "--isa and --engines go with --peers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--peers", "ctranslate2", "--isa", "avx512"])
    assert "invalid choice: 'avx512'" in capsys.readouterr().err
    assert bench.main(["--peers", "ctranslate2", "--engines", "transformers float32,bart_opt int4"]) == 2
    assert "unknown: ['bart_opt int4']" in capsys.readouterr().err
    assert bench.main(["--peers", "ctranslate2", "--engines", "bart_opt int8"]) == 2  # no reference to compare with
    assert "'transformers float32' (the reference)" in capsys.readouterr().err
