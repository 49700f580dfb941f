"""Batch planning, padding trim and out-of-memory splitting (no model needed)."""

from __future__ import annotations

import gc
import random
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch

from bart_opt.pipeline.batching import (
    collate,
    fixed_batches,
    pipelined,
    plan_batches,
    run_with_oom_split,
    trim_pad_columns,
)


class FakeOOM(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError on CPU."""


def test_plan_covers_every_input_once_and_respects_budgets():
    rng = random.Random(0)
    lengths = [rng.randint(1, 1024) for _ in range(300)]
    plan = plan_batches(lengths, max_batch_tokens=16384, max_batch_size=12, num_beams=4)
    assert sorted(i for batch in plan for i in batch) == list(range(300))
    for batch in plan:
        assert len(batch) <= 12
        cost = max(lengths[i] for i in batch) * len(batch) * 4
        assert cost <= 16384 or len(batch) == 1


def test_plan_is_length_sorted_longest_first_and_fills_batches():
    lengths = [5, 100, 7, 100, 50, 6]
    plan = plan_batches(lengths, max_batch_tokens=400, max_batch_size=10, num_beams=2)
    # 100*2*2 = 400 fits two of the longest; then 50 with 7, 6, 5 (50*4*2 = 400).
    assert plan == [[1, 3], [4, 2, 5, 0]]


def test_plan_counts_beams_and_caps_batch_size():
    lengths = [10] * 10
    assert [len(b) for b in plan_batches(lengths, max_batch_tokens=100, max_batch_size=64)] == [10]
    assert [len(b) for b in plan_batches(lengths, max_batch_tokens=100, max_batch_size=64, num_beams=4)] == [2] * 5
    assert [len(b) for b in plan_batches(lengths, max_batch_tokens=10**6, max_batch_size=3)] == [3, 3, 3, 1]


def test_an_input_over_the_budget_gets_a_batch_of_its_own():
    plan = plan_batches([2000, 10, 10], max_batch_tokens=100, max_batch_size=8)
    assert plan == [[0], [1, 2]]


def test_plan_rejects_bad_budgets():
    with pytest.raises(ValueError, match="max_batch_tokens"):
        plan_batches([1, 2], max_batch_tokens=0, max_batch_size=4)


def test_fixed_batches_keep_input_order():
    assert fixed_batches(10, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_collate_pads_right_to_the_requested_width():
    ids, mask = collate([[0, 5, 2], [0, 2]], pad_id=1, pad_to=5)
    assert ids.tolist() == [[0, 5, 2, 1, 1], [0, 2, 1, 1, 1]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
    with pytest.raises(ValueError, match="shorter than the longest"):
        collate([[0, 5, 2]], pad_id=1, pad_to=2)


def test_trim_drops_all_padding_columns_and_counts_them():
    # A caller padded to 8 columns; the longest row has 5 tokens.
    ids, mask = collate([[0, 4, 4, 4, 2], [0, 4, 2], [0, 2]], pad_id=1, pad_to=8)
    trimmed_ids, trimmed_mask, stats = trim_pad_columns(ids, mask, pad_id=1)
    assert trimmed_ids.shape == (3, 5)
    assert torch.equal(trimmed_ids, ids[:, :5]) and torch.equal(trimmed_mask, mask[:, :5])
    assert stats.columns_before == 8 and stats.columns_after == 5
    assert stats.tokens == 10
    assert stats.padding_computed == 3 * 5 - 10
    assert stats.padding_avoided == 3 * 3


def test_trim_without_mask_uses_the_pad_id_and_keeps_a_full_batch():
    ids = torch.tensor([[0, 7, 2], [0, 2, 1]])
    _, mask, stats = trim_pad_columns(ids, None, pad_id=1)
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert (stats.columns_after, stats.padding_avoided, stats.padding_computed) == (3, 0, 1)


def test_trim_rejects_mismatched_mask():
    with pytest.raises(ValueError, match="does not match"):
        trim_pad_columns(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), pad_id=1)


def test_oom_split_halves_until_batches_fit():
    calls = []

    def batch_fn(positions):
        calls.append(list(positions))
        if len(positions) > 2:
            raise FakeOOM("too big")
        return [p * 10 for p in positions]

    outcome = run_with_oom_split(batch_fn, [3, 1, 4, 0, 2], oom_errors=(FakeOOM,))
    assert outcome.results == {p: p * 10 for p in range(5)}
    assert outcome.errors == {}
    # [3, 1, 4, 0, 2] -> [3, 1] + [4, 0, 2] -> [4] + [0, 2]
    assert outcome.calls == [[3, 1], [4], [0, 2]]
    assert outcome.splits == 2
    assert calls[0] == [3, 1, 4, 0, 2]


def test_oom_on_a_single_input_fails_that_input_only():
    freed = []

    def batch_fn(positions):
        if 7 in positions:
            raise FakeOOM("CUDA out of memory")
        return [f"summary {p}" for p in positions]

    outcome = run_with_oom_split(batch_fn, list(range(10)), oom_errors=(FakeOOM,),
                                 on_oom=lambda positions, error: freed.append(len(positions)))
    assert set(outcome.results) == set(range(10)) - {7}
    assert list(outcome.errors) == [7]
    assert "out of memory" in outcome.errors[7] and "CUDA out of memory" in outcome.errors[7]
    assert freed[0] == 10 and freed[-1] == 1


def test_other_errors_are_not_swallowed():
    def batch_fn(positions):
        raise KeyError("bug")

    with pytest.raises(KeyError):
        run_with_oom_split(batch_fn, [0, 1], oom_errors=(FakeOOM,))


@pytest.mark.parametrize("keeps_error", [False, True])
def test_failed_call_tensors_are_released_before_the_retry(keeps_error):
    """The traceback of an OOM holds the failed call's frames; they must not keep its tensors alive
    when the retry starts, even when a frame also holds the error (a cycle only the GC would break)."""
    alive_at_retry = []
    made = []

    def batch_fn(positions):
        scratch = torch.ones(1000)  # stands in for the failed call's activations
        made.append(weakref.ref(scratch))
        if len(positions) > 1:
            try:
                raise FakeOOM("too big")
            except FakeOOM as error:
                kept = error if keeps_error else None  # noqa: F841 (the frame -> error -> frame cycle)
                raise
        return [scratch.sum().item()]

    def on_oom(positions, message):
        alive_at_retry.append(made[-1]() is not None)

    gc.disable()
    try:
        outcome = run_with_oom_split(batch_fn, [0, 1], oom_errors=(FakeOOM,), on_oom=on_oom)
    finally:
        gc.enable()
    assert outcome.results == {0: 1000.0, 1: 1000.0}
    assert alive_at_retry == [False]


@pytest.mark.parametrize("text", [
    "CUDA error: out of memory",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes",
])
def test_allocation_failures_raised_as_runtime_errors_count_as_oom(text):
    def batch_fn(positions):
        if len(positions) > 1:
            raise RuntimeError(text)
        return positions

    outcome = run_with_oom_split(batch_fn, [0, 1])
    assert outcome.splits == 1 and outcome.results == {0: 0, 1: 1}


def test_other_runtime_errors_are_not_swallowed():
    def batch_fn(positions):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_with_oom_split(batch_fn, [0, 1])


def test_oom_message_is_one_short_line():
    cuda_text = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 3.19 MiB\n"
        "is free. Including non-PyTorch memory, this process has 79.14 GiB memory in use. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    )

    def batch_fn(positions):
        raise torch.cuda.OutOfMemoryError(cuda_text)

    outcome = run_with_oom_split(batch_fn, [4])
    assert outcome.errors == {
        4: "out of memory on this input even in a batch of one (CUDA out of memory. Tried to allocate 2.00 GiB.)"
    }


def test_isolate_runs_a_failed_batch_input_by_input_and_keeps_the_one_at_fault():
    calls = []

    def batch_fn(batch):
        calls.append(list(batch))
        if 2 in batch:
            raise ValueError("input 2 is cursed")
        return [p * 10 for p in batch]

    outcome = run_with_oom_split(batch_fn, [0, 1, 2, 3], isolate=True)
    assert outcome.results == {0: 0, 1: 10, 3: 30} and list(outcome.failures) == [2] and outcome.failed
    assert str(outcome.failures[2]) == "input 2 is cursed" and calls == [[0, 1, 2, 3], [0], [1], [2], [3]]
    with pytest.raises(ValueError, match="cursed"):
        run_with_oom_split(batch_fn, [2, 3])


def test_skip_withdraws_inputs_before_each_call():
    withdrawn: set[int] = set()

    def batch_fn(batch):
        withdrawn.add(3)  # withdrawn while the first call runs: the retries leave it out
        raise FakeOOM("CUDA out of memory")

    outcome = run_with_oom_split(batch_fn, [0, 1, 2, 3], oom_errors=(FakeOOM,), skip=lambda: withdrawn)
    assert outcome.skipped == [3] and sorted(outcome.errors) == [0, 1, 2]


class LoggingDevice:
    """A device that runs each call at once and logs it; `cancelled` names plans it drops instead."""

    finishes = stopping = False

    def __init__(self, depth: int, log: list, cancelled: tuple = ()):
        self.depth, self.log, self.dropped = depth, log, cancelled
        self.futures: list[Future] = []

    def submit(self, call):
        future: Future = Future()
        plan = call.args[-1]
        self.log.append(("start", plan))
        if plan in self.dropped:
            future.cancel()
        else:
            future.set_result(call())
        self.futures.append(future)
        return future

    def cancel(self, future: Future) -> None:
        self.log.append(("cancel", self.futures.index(future)))


def consume(results, log: list) -> None:
    for value in results:
        log.append(("got", value))


@pytest.mark.parametrize(("depth", "plans", "expected"), [
    (1, [1, 2], [("start", 1), ("start", 2), ("got", 10), ("got", 20)]),
    # Two on the device; after the failing -2 is known, plan 4 waits until -2 was delivered.
    (2, [1, -2, 3, 4], [("start", 1), ("start", -2), ("start", 3), ("got", 10), ("got", -20), ("start", 4),
                        ("got", 30), ("got", 40)]),
])
def test_the_next_plans_are_on_the_device_before_one_is_delivered_and_failures_go_one_at_a_time(depth, plans,
                                                                                                expected):
    log: list = []
    with ThreadPoolExecutor(1) as finisher:
        consume(pipelined(plans, lambda plan: plan, lambda plan: plan * 10, device=LoggingDevice(depth, log),
                          finisher=finisher, failed=lambda plan: plan < 0), log)
    assert log == expected


def test_a_plan_the_device_dropped_ends_the_run_and_closing_cancels_what_was_not_started():
    log: list = []
    with ThreadPoolExecutor(1) as finisher:
        consume(pipelined([1, 2, 3, 4], lambda plan: plan, lambda plan: plan * 10,
                          device=LoggingDevice(2, log, cancelled=(2,)), finisher=finisher), log)
        assert log == [("start", 1), ("start", 2), ("start", 3), ("got", 10), ("cancel", 2)]
        log.clear()
        results = pipelined([1, 2, 3], lambda plan: plan, lambda plan: plan, device=LoggingDevice(2, log),
                            finisher=finisher)
        assert next(results) == 1
        results.close()
    assert log == [("start", 1), ("start", 2), ("start", 3), ("cancel", 1), ("cancel", 2)]  # 2 and 3 dropped
