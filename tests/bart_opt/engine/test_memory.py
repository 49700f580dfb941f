"""Tests for bart_opt.engine.memory: the live tensor counter, MemoryLog, LoggingMixin and measure()."""

from __future__ import annotations

import csv
import gc
import time

import pytest
import torch
from torch import nn

from bart_opt.engine.memory import (
    MAX_REPORT_ROWS, LiveTensorCounter, LoggingMixin, MemoryLog, format_bytes, measure, rss_bytes,
)

MB = 2**20
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _bytes(n: int, device: str = "cpu") -> torch.Tensor:
    return torch.empty(n, dtype=torch.uint8, device=device)


# ---------------------------------------------------------------- LiveTensorCounter


def test_counter_tracks_allocation_free_and_true_peak():
    with LiveTensorCounter() as counter:
        big = _bytes(4 * MB)
        assert counter.current_bytes == 4 * MB
        del big
        assert counter.current_bytes == 0
        small = _bytes(1 * MB)
        assert counter.current_bytes == 1 * MB
    assert counter.peak_bytes == 4 * MB
    counter.reset_peak()
    assert counter.peak_bytes == 1 * MB
    del small
    assert counter.current_bytes == 0  # frees after the block are still subtracted


def test_counter_ignores_tensors_made_before_and_counts_views_once():
    weight = torch.randn(256, 256)
    with LiveTensorCounter() as counter:
        transposed = weight.t()  # a view of a tensor from before: nothing new
        sliced = weight[:10]
        assert counter.current_bytes == 0
        out = torch.randn(1024)  # 4 KiB
        views = [out.view(32, 32), out[::2], out.view(32, 32).t(), out.unsqueeze(0)]
        assert counter.current_bytes == 4096
        del out
        assert counter.current_bytes == 4096  # views keep the storage alive
        del views
        gc.collect()
        assert counter.current_bytes == 0
    del transposed, sliced


def test_counter_sees_copies_from_may_alias_ops_in_place_growth_and_inference_mode():
    with LiveTensorCounter() as counter, torch.inference_mode():
        a = torch.ones(100)  # 400 B
        copy = a.view(10, 10).t().contiguous()  # "may alias" op that makes a new storage
        same = a.contiguous()  # returns its input: nothing new
        assert counter.current_bytes == 800
        grown = torch.empty(0)
        grown.resize_(1000)  # grown in place to 4000 B
        assert counter.current_bytes == 4800
        literal = torch.tensor([1.0, 2.0])  # made from Python data
        assert counter.current_bytes == 4808
    assert counter.peak_bytes == 4808
    del copy, same, grown, literal, a


def test_nested_counters_both_count():
    with LiveTensorCounter() as outer:
        first = _bytes(1000)
        with LiveTensorCounter() as inner:
            second = _bytes(3000)
        assert inner.current_bytes == 3000
        assert outer.current_bytes == 4000
    del first, second
    assert outer.current_bytes == inner.current_bytes == 0


# ---------------------------------------------------------------- MemoryLog on CPU


def test_rows_and_summary_report_the_true_peak_between_rows():
    with MemoryLog("cpu") as log:
        log.log_mem("start")
        big = _bytes(4 * MB)
        del big  # no row is logged while the 4 MB tensor is alive
        small = _bytes(1 * MB)
        log.log_mem("after 4 MB freed, 1 MB held")
        log.log_mem("nothing new")
    rows = log.rows()
    assert [r["msg"] for r in rows] == ["start", "after 4 MB freed, 1 MB held", "nothing new"]
    assert rows[0]["mem_bytes"] == 0 and rows[0]["mem_peak_bytes"] == 0
    assert rows[1]["mem_bytes"] == 1 * MB
    assert rows[1]["mem_peak_bytes"] == 4 * MB  # the true peak, never sampled by a row
    assert rows[2]["mem_peak_bytes"] == 1 * MB  # a new window starts at each row
    assert rows[0]["t"] <= rows[1]["t"] <= rows[2]["t"]
    assert all(r["cpu_mem_bytes"] > 0 for r in rows)

    summary = log.summary()
    assert set(summary) == {"device", "time_s", "cpu_mem_bytes", "mem_chg_bytes", "mem_peak_bytes"}
    assert summary["device"] == "cpu"
    assert summary["mem_peak_bytes"] == 4 * MB
    assert summary["mem_chg_bytes"] == 1 * MB
    assert summary["time_s"] >= rows[-1]["t"]
    del small


def test_weights_created_before_the_log_are_not_counted():
    weights = _bytes(2 * MB)
    with measure("cpu") as log:
        activation = weights.float()  # 8 MB
        log.log_mem("activation")
        del activation
    assert log.rows()[0]["mem_bytes"] == 8 * MB
    report = log.report()
    assert report["peak_bytes"] == 8 * MB
    assert report["change_bytes"] == 0
    assert report["peak_source"] == "live_tensors"


def test_phases_record_seconds_and_their_own_peak():
    with measure("cpu") as log:
        with log.phase("encode"):
            tmp = _bytes(3 * MB)
            del tmp
            time.sleep(0.01)
        keep = _bytes(1 * MB)
        for _ in range(2):
            with log.phase("step"):
                with log.phase("inner"):
                    tmp = _bytes(2 * MB)
                    del tmp
    phases = log.phases()
    assert [p["name"] for p in phases] == ["encode", "inner", "step", "inner", "step"]
    encode = phases[0]
    assert set(encode) == {"name", "start_t", "seconds", "peak_bytes", "end_bytes"}
    assert encode["seconds"] >= 0.01 and phases[2]["start_t"] >= encode["start_t"] + encode["seconds"]
    assert encode["peak_bytes"] == 3 * MB
    assert encode["end_bytes"] == 0
    assert phases[1]["peak_bytes"] == phases[2]["peak_bytes"] == 3 * MB  # 1 MB held + 2 MB inside

    report = log.report()
    assert [(p["name"], p["count"]) for p in report["phases"]] == [("encode", 1), ("inner", 2), ("step", 2)]
    step = report["phases"][2]
    assert step["peak_bytes"] == 3 * MB
    assert step["seconds"] == pytest.approx(phases[2]["seconds"] + phases[4]["seconds"])
    assert report["peak_bytes"] == 3 * MB
    assert report["change_bytes"] == 1 * MB
    del keep


def test_row_peak_covers_a_phase_boundary_between_rows():
    with measure("cpu") as log:
        log.log_mem("a")
        tmp = _bytes(5 * MB)
        del tmp
        with log.phase("p"):
            pass
        log.log_mem("b")
    assert log.rows()[1]["mem_peak_bytes"] == 5 * MB
    assert log.phases()[0]["peak_bytes"] == 0


def test_report_shape_and_reset():
    with measure("cpu") as log:
        x = _bytes(MB)
        log.log_mem("x")
        report = log.report()
        assert set(report) == {"device", "peak_bytes", "change_bytes", "rss_bytes", "seconds", "phases", "rows",
                               "peak_source"}
        assert report["rss_bytes"] == pytest.approx(rss_bytes(), rel=0.5)
        log.reset()
        assert log.rows() == [] and log.phases() == []
        y = _bytes(2 * MB)
        assert log.report()["peak_bytes"] == 2 * MB  # relative to the reset, where x was already held
    del x, y


def test_report_rows_are_the_readings_above_the_start_thinned_to_a_bound():
    held = _bytes(MB)
    with measure("cpu") as log:
        for i in range(3):
            step = _bytes((i + 1) * MB)
            log.log_mem(f"step {i}")
            del step
        rows = log.report()["rows"]
        assert [row["mem_bytes"] for row in rows] == [MB, 2 * MB, 3 * MB]  # held before the start: not counted
        assert [row["peak_bytes"] for row in rows] == [MB, 2 * MB, 3 * MB]
        assert rows == sorted(rows, key=lambda row: row["t"])
        for i in range(3 * MAX_REPORT_ROWS):
            log.log_mem(f"more {i}")
        thinned = log.report()["rows"]
        assert MAX_REPORT_ROWS // 2 <= len(thinned) <= MAX_REPORT_ROWS
        assert thinned[0] == rows[0]
    del held


def test_count_cpu_tensors_off_gives_time_and_rss_only():
    with measure("cpu", count_cpu_tensors=False) as log:
        x = _bytes(MB)
        log.log_mem("x")
    row = log.rows()[0]
    assert row["mem_bytes"] == row["mem_peak_bytes"] == 0
    assert row["cpu_mem_bytes"] > 0
    assert log.report()["peak_source"] == "none"
    del x


def test_csv_round_trip(tmp_path):
    with measure("cpu") as log:
        x = _bytes(MB)
        log.log_mem("one, with a comma")
        log.log_mem('two "quoted"')
    path = log.to_csv(tmp_path / "log.csv")
    with open(path, newline="", encoding="utf-8") as f:
        read = list(csv.DictReader(f))
    assert list(read[0]) == ["msg", "t", "cpu_mem_bytes", "mem_bytes", "mem_peak_bytes"]
    for got, want in zip(read, log.rows(), strict=True):
        assert got["msg"] == want["msg"]
        assert float(got["t"]) == pytest.approx(want["t"])
        assert int(got["mem_bytes"]) == want["mem_bytes"]
        assert int(got["mem_peak_bytes"]) == want["mem_peak_bytes"]
        assert int(got["cpu_mem_bytes"]) == want["cpu_mem_bytes"]
    del x


def test_printed_log_is_a_readable_table():
    with measure("cpu") as log:
        x = _bytes(3 * MB)
        for i in range(50):
            log.log_mem(f"row {i}")
    text = str(log)
    assert "mem_peak" in text and "3.00 MiB" in text and "cpu_mem" in text
    assert "row 0" in text and "row 49" in text and "row 25" not in text
    assert "10 rows not shown" in text
    del x


def test_format_bytes():
    assert format_bytes(12) == "12 B"
    assert format_bytes(3 * MB) == "3.00 MiB"
    assert format_bytes(1536 * MB) == "1.50 GiB"


def test_log_mem_costs_under_a_tenth_of_a_millisecond_on_cpu():
    with measure("cpu") as log:
        calls = 2000
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                log.log_mem("x")
            best = min(best, (time.perf_counter() - start) / calls)
    assert best < 1e-4


# ---------------------------------------------------------------- LoggingMixin


WIDTH = 512  # wide enough that a forward step is real work next to a log call


class Child(nn.Module, LoggingMixin):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.log_phase("child"):
            y = self.proj(x)
            self.log_mem("child out %s", tuple(y.shape))
        return y


class Parent(nn.Module, LoggingMixin):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Child(), Child()])

    def forward(self, x: torch.Tensor, steps: int = 1) -> torch.Tensor:
        self.log_mem("parent start")
        for _ in range(steps):
            for block in self.blocks:
                x = block(x)
        self.log_mem("parent end")
        return x


def test_mixin_tree_writes_to_one_shared_log():
    model = Parent()
    with measure("cpu") as log:
        assert model.attach_log(log) is log
        assert all(m.memory_log is log for m in model.modules() if isinstance(m, LoggingMixin))
        out = model(torch.randn(8, WIDTH))
    assert [r["msg"] for r in log.rows()] == ["parent start", "child out (8, 512)", "child out (8, 512)", "parent end"]
    assert [p["name"] for p in log.phases()] == ["child", "child"]
    summary = model.summary
    assert summary["mem_peak_bytes"] >= out.numel() * 4
    assert summary == log.summary()

    model.reset_logs()
    assert log.rows() == [] and log.phases() == []
    model.attach_log(None)
    assert model.memory_log is None and model.blocks[1].memory_log is None
    assert model.summary == {}
    model(torch.randn(8, WIDTH))
    assert log.rows() == []


def test_detached_logging_adds_nothing_measurable():
    """A detached log_mem/log_phase costs about as much as calling an empty method.

    Compared by ratios against work done in the same run, not absolute times:
    (1) a detached call against an empty method call, (2) the total cost of the
    detached calls a generate-like loop makes against the loop's own run time.
    """

    class Plain:
        def nothing(self, msg: str, *args) -> None:
            pass

    model, plain = Parent(), Plain()

    def per_call(fn) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(2000):
                fn("step %d", 1)
            best = min(best, (time.perf_counter() - start) / 2000)
        return best

    detached, empty = per_call(model.log_mem), per_call(plain.nothing)
    assert detached < 3 * empty

    with measure("cpu") as log:
        model.attach_log(log)
        model(torch.randn(8, WIDTH), steps=20)
    calls = len(log.rows()) + 2 * len(log.phases())  # a phase enters and exits
    model.attach_log(None)
    x = torch.randn(64, WIDTH)
    with torch.inference_mode():
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            model(x, steps=20)
            best = min(best, time.perf_counter() - start)
    assert calls * detached / best < 0.02


# ---------------------------------------------------------------- CUDA


@needs_cuda
def test_cuda_rows_use_the_allocator_and_true_peak():
    with measure("cuda") as log:
        assert log.peak_source == "cuda_allocator"
        log.log_mem("start")
        big = _bytes(64 * MB, "cuda")
        del big
        small = _bytes(16 * MB, "cuda")
        log.log_mem("after")
    rows = log.rows()
    assert rows[1]["mem_bytes"] - rows[0]["mem_bytes"] == 16 * MB
    assert rows[1]["mem_peak_bytes"] - rows[0]["mem_bytes"] >= 64 * MB
    report = log.report()
    assert report["peak_bytes"] >= 64 * MB
    assert report["change_bytes"] == 16 * MB
    assert report["device"].startswith("cuda")
    del small


@needs_cuda
def test_cuda_phase_peak():
    with measure("cuda") as log:
        with log.phase("alloc"):
            tmp = _bytes(32 * MB, "cuda")
            del tmp
    assert log.report()["phases"][0]["peak_bytes"] >= 32 * MB


@needs_cuda
def test_cuda_nested_logs_keep_each_others_peaks():
    with measure("cuda") as outer:
        spike = _bytes(64 * MB, "cuda")
        del spike
        with measure("cuda") as inner:  # starting it reads (and resets) the device's peak counter
            inner.log_mem("inner")
        outer.log_mem("outer")
    assert outer.rows()[0]["mem_peak_bytes"] - outer.rows()[0]["mem_bytes"] >= 64 * MB


class FakeCudaAllocator:
    """The torch.cuda functions MemoryLog reads, over a scripted allocator (for CPU-only machines).

    `allocate` / `free` move the allocated and peak counters; `launch(seconds)` queues work
    that `synchronize` waits for, as kernels run asynchronously on a real device.
    """

    def __init__(self, monkeypatch):
        self.allocated = self.peak = 0
        self.queued = 0.0
        for name in ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "synchronize"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def allocate(self, n):
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n):
        self.allocated -= n

    def launch(self, seconds):
        self.queued += seconds

    def memory_allocated(self, device=None):
        return self.allocated

    def max_memory_allocated(self, device=None):
        return self.peak

    def reset_peak_memory_stats(self, device=None):
        self.peak = self.allocated

    def synchronize(self, device=None):
        time.sleep(self.queued)
        self.queued = 0.0


def test_nested_and_interleaved_cuda_logs_do_not_clobber_peaks(monkeypatch):
    cuda = FakeCudaAllocator(monkeypatch)
    outer = MemoryLog("cuda:0").start()
    cuda.allocate(500)
    cuda.free(500)  # a spike only the outer log was open for
    inner = MemoryLog("cuda:0").start()  # reads and resets the device's one peak counter
    cuda.allocate(200)
    cuda.free(200)
    inner.log_mem("inner")
    other = MemoryLog("cuda:0").start()  # e.g. a request on another thread
    cuda.allocate(300)
    cuda.free(300)
    other.log_mem("other")
    outer.log_mem("outer")
    inner.log_mem("inner again")
    assert [r["mem_peak_bytes"] for r in inner.rows()] == [200, 300]
    assert other.rows()[0]["mem_peak_bytes"] == 300
    assert outer.rows()[0]["mem_peak_bytes"] == 500
    assert outer.report()["peak_bytes"] == 500 and inner.report()["peak_bytes"] == 300


def test_cuda_phase_times_wait_for_queued_kernels(monkeypatch):
    cuda = FakeCudaAllocator(monkeypatch)
    with MemoryLog("cuda:0") as log:
        with log.phase("decode"):
            cuda.launch(0.2)  # returns at once, like a kernel launch
    assert log.phases()[0]["seconds"] >= 0.2


def test_detached_logging_costs_nothing_measurable_in_bart_generate(demo_checkpoint):
    """The engine's own log calls, detached, add under 1% to generate (cost per call x calls / run time)."""
    from bart_opt import Bart

    model = Bart.from_pretrained(demo_checkpoint)
    ids = torch.randint(4, model.config.vocab_size, (2, 24))
    settings = {"num_beams": 4, "max_length": 24, "min_length": 16}
    with measure("cpu") as log:
        model.attach_log(log)
        attached = model.generate(ids, **settings)
    model.attach_log(None)
    calls = len(log.rows()) + 2 * len(log.phases())
    assert len(log.rows()) >= 15 and "encode" in {p["name"] for p in log.phases()}

    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        detached = model.generate(ids, **settings)
        best = min(best, time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(2000):
        model.log_mem("beam step %d", 1)
        with model.log_phase("decode"):
            pass
    per_call = (time.perf_counter() - start) / 4000
    assert torch.equal(attached, detached)
    assert calls * per_call / best < 0.01


# ---------------------------------------------------------------- the cross-attention state against layer count


def _cross_state_bytes(path: str, dtype: torch.dtype, el_attention: bool, ids, mask, static: bool = False) -> int:
    """Live tensor bytes of the cross-attention state `generate` builds (4 beams), once the encoder output is gone."""
    from bart_opt import Bart

    model = Bart.from_pretrained(path, dtype=dtype, el_attention=el_attention, static=static)
    with torch.inference_mode(), LiveTensorCounter() as counter:
        memory = model.encode(ids, mask)  # (B, S, D)
        state = model.cross_attention(memory, mask, beams=4)
        del memory
        held = counter.current_bytes
    del state
    return held


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_el_attention_cross_state_does_not_grow_with_decoder_layers(make_checkpoint, dtype):
    """At d_model 256 with 2 and 6 decoder layers: EL-attention holds one copy of the encoder output per
    input whatever the layer count (float32: real rows only; bfloat16: padded rows and the padding mask),
    the default mode two per layer (keys and values)."""
    lengths = (200, 37, 120, 81)
    ids = torch.randint(4, 1000, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, S) right-padded
    d_model, width = 256, dtype.itemsize
    el, default = {}, {}
    for layers in (2, 6):
        path = make_checkpoint(with_tokenizer=False, init_std=0.2, d_model=d_model, encoder_layers=1,
                               decoder_layers=layers, encoder_attention_heads=8, decoder_attention_heads=8,
                               ffn_dim=256, vocab_size=1000)
        el[layers] = _cross_state_bytes(path, dtype, True, ids, mask) / len(lengths)
        default[layers] = _cross_state_bytes(path, dtype, False, ids, mask) / len(lengths)
    tokens = sum(lengths) if dtype == torch.float32 else mask.numel()  # rows kept: real, or padded too
    one_copy = tokens * d_model * width / len(lengths)  # the encoder output, per input
    mask_bytes = 0 if dtype == torch.float32 else mask.numel() / len(lengths)  # the bool padding mask
    assert el[2] == el[6] == one_copy + mask_bytes, (el, one_copy)
    # The default mode keeps the same rows once per layer for keys and once for values.
    assert default[2] == 2 * 2 * one_copy + mask_bytes and default[6] == 2 * 6 * one_copy + mask_bytes, default
    assert default[6] > 2.9 * default[2] and default[2] > 3.9 * el[2]


def test_el_attention_in_the_static_search_holds_the_padded_encoder_output_once(make_checkpoint):
    """The static search's EL state at d_model 256, 2 and 6 decoder layers: the padded encoder output once
    and its additive key mask, whatever the layer count; the static search's own state grows with the layers."""
    lengths = (200, 37, 120, 81)
    ids = torch.randint(4, 1000, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, S) right-padded
    el, static = {}, {}
    for layers in (2, 6):
        path = make_checkpoint(with_tokenizer=False, init_std=0.2, d_model=256, encoder_layers=1,
                               decoder_layers=layers, encoder_attention_heads=8, decoder_attention_heads=8,
                               ffn_dim=256, vocab_size=1000)
        el[layers] = _cross_state_bytes(path, torch.float32, True, ids, mask, static=True)
        static[layers] = _cross_state_bytes(path, torch.float32, False, ids, mask, static=True)
    from bart_opt.engine.cache import STATIC_ALIGN, round_up

    # (B, S, D) and (B, 1, 1, S) float32, the mask's rows 16-aligned (bart_opt.engine.cache.aligned_bias: S 200 -> 208)
    padded_copy = mask.numel() * 256 * 4
    key_bias = len(lengths) * round_up(max(lengths), STATIC_ALIGN) * 4
    assert el[2] == el[6] == padded_copy + key_bias, el
    assert static[6] > 2.9 * static[2] and static[2] > 3.9 * el[2], (static, el)
