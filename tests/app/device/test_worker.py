"""The device worker's scheduling, with a recording runner instead of a model."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from app.device.worker import Kind, NotAccepting, QueueFull, State, WorkerDied, WorkItem, Worker
from bart_opt.engine.spec import GenerationSpec


class RecordingRunner:
    """Answers each item with its texts upper-cased; holds the first batch until `release()`."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[list[WorkItem]] = []
        self.busy = threading.Event()
        self._release = threading.Event()
        self.fail_on = fail_on

    def release(self) -> None:
        self._release.set()

    def __call__(self, items: list[WorkItem]) -> list:
        self.batches.append(items)
        self.busy.set()
        assert self._release.wait(10)
        if self.fail_on is not None and any(self.fail_on in text for item in items for text in item.texts):
            raise RuntimeError("model blew up")
        return [[text.upper() for text in item.texts] for item in items]


def make_worker(runner: RecordingRunner, **options) -> Worker:
    defaults = {"queue_size": 8, "max_batch_tokens": 1000, "max_batch_size": 8}
    worker = Worker(lambda: runner, **{**defaults, **options})
    worker.start()
    assert worker.wait_ready(10)
    return worker


def spec(beams: int) -> GenerationSpec:
    return GenerationSpec(num_beams=beams, max_length=20, min_length=0, length_penalty=1.0, no_repeat_ngram_size=0,
                          early_stopping=False, forced_bos_token_id=None, forced_eos_token_id=None,
                          decoder_start_token_id=2, eos_token_id=(2,), pad_token_id=1)


def item(text: str, *, beams: int = 1, longest: int = 10, kind: Kind = Kind.INTERACTIVE, texts: int = 1) -> WorkItem:
    return WorkItem(texts=[text] * texts, generation=spec(beams), longest=longest, kind=kind)


def occupy(worker: Worker, runner: RecordingRunner) -> WorkItem:
    """Put one item on the device and wait until the runner holds it."""
    first = worker.submit(item("first"))
    assert runner.busy.wait(10)
    return first


def texts_of(batch: list[WorkItem]) -> list[str]:
    return [text for work in batch for text in work.texts]


def test_waiting_items_with_equal_settings_share_one_call_and_get_their_own_results():
    runner = RecordingRunner()
    worker = make_worker(runner)
    occupy(worker, runner)
    waiting = [worker.submit(item(f"t{i}")) for i in range(3)]
    runner.release()
    assert [w.future.result(10) for w in waiting] == [["T0"], ["T1"], ["T2"]]
    assert [texts_of(batch) for batch in runner.batches] == [["first"], ["t0", "t1", "t2"]]
    assert all(w.queue_seconds > 0 for w in waiting)
    worker.stop(10)


def test_different_generation_settings_are_never_merged_and_order_is_kept():
    runner = RecordingRunner()
    worker = make_worker(runner)
    occupy(worker, runner)
    for name, beams in [("a", 1), ("b", 4), ("c", 1), ("d", 4)]:
        worker.submit(item(name, beams=beams))
    runner.release()
    worker.stop(10)
    assert [texts_of(batch) for batch in runner.batches] == [["first"], ["a", "c"], ["b", "d"]]


def test_merging_respects_the_token_budget_and_the_batch_size():
    runner = RecordingRunner()
    # Budget 100 with 2 beams: longest 10 allows 5 texts; batch size caps at 4 texts.
    worker = make_worker(runner, max_batch_tokens=100, max_batch_size=4)
    occupy(worker, runner)
    for name in "abcdef":
        worker.submit(item(name, beams=2, longest=10))
    worker.submit(item("long", beams=2, longest=40))  # 40 x (k + 1) x 2 > 100 next to anything
    runner.release()
    worker.stop(10)
    assert [texts_of(batch) for batch in runner.batches] == [["first"], ["a", "b", "c", "d"], ["e", "f"], ["long"]]


def test_micro_batching_off_runs_one_request_per_call():
    runner = RecordingRunner()
    worker = make_worker(runner, micro_batch=False)
    occupy(worker, runner)
    for name in "abc":
        worker.submit(item(name))
    runner.release()
    worker.stop(10)
    assert [texts_of(batch) for batch in runner.batches] == [["first"], ["a"], ["b"], ["c"]]


def test_full_queue_refuses_with_a_retry_hint():
    runner = RecordingRunner()
    worker = make_worker(runner, queue_size=2)
    occupy(worker, runner)
    worker.submit(item("a"))
    worker.submit(item("b"))
    with pytest.raises(QueueFull) as refused:
        worker.submit(item("c"))
    assert refused.value.retry_after >= 1
    assert worker.queue_length() == 2
    runner.release()
    worker.stop(10)


def test_cancelled_item_leaves_the_queue_and_never_runs():
    runner = RecordingRunner()
    worker = make_worker(runner, queue_size=2)
    occupy(worker, runner)
    dropped = worker.submit(item("dropped"))
    kept = worker.submit(item("kept"))
    assert worker.cancel(dropped)
    assert worker.queue_length() == 1
    worker.submit(item("fits-again"))  # the freed slot is usable at once
    runner.release()
    assert kept.future.result(10) == ["KEPT"]
    with pytest.raises(CancelledError):
        dropped.future.result(0)
    worker.stop(10)
    assert "dropped" not in [text for batch in runner.batches for text in texts_of(batch)]


def test_running_item_cannot_be_cancelled():
    runner = RecordingRunner()
    worker = make_worker(runner)
    running = occupy(worker, runner)
    assert not worker.cancel(running)
    runner.release()
    assert running.future.result(10) == ["FIRST"]
    worker.stop(10)


def test_interactive_work_goes_first_but_jobs_get_a_turn_after_a_burst():
    runner = RecordingRunner()
    worker = make_worker(runner, micro_batch=False, interactive_burst=2, job_queue_size=4)
    occupy(worker, runner)
    submitted = [worker.submit(item(name, kind=Kind.JOB)) for name in ("job1", "job2")]
    submitted += [worker.submit(item(name)) for name in "abcde"]
    runner.release()
    for work in submitted:
        work.future.result(10)
    worker.stop(10)
    order = [texts_of(batch)[0] for batch in runner.batches[1:]]
    # "first" counted as one interactive call, so one more before job1, then two per job.
    assert order == ["a", "job1", "b", "c", "job2", "d", "e"]


def test_job_items_are_never_merged():
    runner = RecordingRunner()
    worker = make_worker(runner, job_queue_size=4)
    occupy(worker, runner)
    jobs = [worker.submit(item(f"job{i}", kind=Kind.JOB)) for i in range(3)]
    runner.release()
    assert [job.future.result(10) for job in jobs] == [["JOB0"], ["JOB1"], ["JOB2"]]
    assert [len(batch) for batch in runner.batches] == [1, 1, 1, 1]
    worker.stop(10)


def test_failed_batch_fails_its_items_and_the_worker_goes_on():
    runner = RecordingRunner(fail_on="boom")
    runner.release()
    worker = make_worker(runner)
    bad = worker.submit(item("boom"))
    with pytest.raises(RuntimeError, match="model blew up"):
        bad.future.result(10)
    good = worker.submit(item("fine"))
    assert good.future.result(10) == ["FINE"]
    worker.stop(10)


def test_load_failure_is_reported_and_refuses_work():
    def broken_load():
        raise OSError("no such checkpoint: /nowhere")

    worker = Worker(broken_load, queue_size=2, max_batch_tokens=10, max_batch_size=2)
    worker.start()
    assert not worker.wait_ready(10)
    assert worker.state is State.FAILED
    assert "no such checkpoint" in str(worker.load_error)
    with pytest.raises(NotAccepting, match="failed to load"):
        worker.submit(item("a"))


def test_submit_before_the_model_is_loaded_is_refused():
    loaded = threading.Event()
    runner = RecordingRunner()

    def slow_load():
        assert loaded.wait(10)
        return runner

    worker = Worker(slow_load, queue_size=2, max_batch_tokens=10, max_batch_size=2)
    worker.start()
    with pytest.raises(NotAccepting, match="still loading"):
        worker.submit(item("early"))
    loaded.set()
    assert worker.wait_ready(10)
    runner.release()
    assert worker.submit(item("late")).future.result(10) == ["LATE"]
    worker.stop(10)


def test_stop_finishes_queued_requests_drops_queued_jobs_and_refuses_new_work():
    runner = RecordingRunner()
    worker = make_worker(runner, job_queue_size=2)
    occupy(worker, runner)
    queued = worker.submit(item("queued"))
    job = worker.submit(item("job", kind=Kind.JOB))
    stopper = threading.Thread(target=worker.stop, args=(10,))
    stopper.start()
    # stop() flips the state before it joins; wait for that, then check new work is refused.
    for _ in range(1000):
        if worker.state is State.STOPPING:
            break
        threading.Event().wait(0.01)
    with pytest.raises(NotAccepting, match="shutting down"):
        worker.submit(item("late"))
    runner.release()
    stopper.join(10)
    assert queued.future.result(0) == ["QUEUED"]
    assert job.future.cancelled()
    assert worker.state is State.STOPPED


def test_a_scheduling_failure_ends_the_worker_loudly_and_fails_every_waiting_item(caplog):
    runner = RecordingRunner()
    worker = make_worker(runner, job_queue_size=2)
    running = occupy(worker, runner)
    waiting = [worker.submit(item("a")), worker.submit(item("job", kind=Kind.JOB))]

    def broken_scheduler():
        raise RuntimeError("scheduler bug")

    worker._take_interactive = broken_scheduler
    runner.release()
    assert running.future.result(10) == ["FIRST"]
    for work in waiting:
        with pytest.raises(WorkerDied):
            work.future.result(10)
    assert worker.state is State.DEAD and worker.queue_length() == worker.queue_length(Kind.JOB) == 0
    with pytest.raises(NotAccepting, match="stopped unexpectedly") as refused:
        worker.submit(item("late"))
    assert refused.value.state is State.DEAD
    assert len(caplog.records) == 1 and "RuntimeError: scheduler bug" in caplog.records[0].exc_text
    worker.stop(1)
    assert worker.state is State.DEAD


def test_abandon_marks_a_running_item_for_the_runner():
    runner = RecordingRunner()
    worker = make_worker(runner)
    running = occupy(worker, runner)
    assert not running.abandoned
    running.abandon()
    assert running.abandoned and runner.batches[0][0].abandoned
    runner.release()
    worker.stop(10)
