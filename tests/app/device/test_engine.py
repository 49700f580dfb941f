"""The shared engine, and the evaluation core on every executor: one process, the device worker, Ray."""

from __future__ import annotations

import threading

import pytest

from app.device.engine import Engine, WorkerDevice
from app.metrics import Metrics
from app.settings import Settings
from app.device.worker import Kind
from bart_opt.evaluate import ListSource, RunControl, SummarizerExecutor, evaluate_records, metrics_from_rows
from bart_opt.evaluate import score_baselines
from bart_opt.engine.options import EngineOptions
from tests.bart_opt.evaluate.poison import MemorySink, comparable, hostile_records, load_poisoned

GEN = {"num_beams": 2, "max_length": 12, "min_length": 3}


@pytest.fixture
def engine(demo_checkpoint):
    """An engine on the poisoned demo model (see tests.bart_opt.evaluate.poison), started and loaded."""
    engine = Engine(Settings(model=demo_checkpoint, device="cpu", max_batch_size=3), Metrics(),
                    load=lambda settings: load_poisoned(settings.engine_options()))
    engine.start()
    assert engine.wait_ready(60), engine.worker.load_error
    yield engine
    engine.stop()


def outcome(executor, records) -> tuple[dict, dict, dict]:
    """Rows (without timing and memory), metrics and baselines of `records` on `executor`."""
    sink = MemorySink()
    evaluate_records(ListSource(records), sink, executor, executor.generation_spec(GEN))
    unique = list({record.id: record for record in reversed(records)}.values())[::-1]
    metrics = metrics_from_rows((sink.rows[record.id] for record in unique), model=executor.model, generation={})
    machine = ("runtime_s", "seconds_per_sample", "memory", "padding")
    baselines = score_baselines(["lead-3"], [r for r in unique if r.id != "bad"], executor.model.scorer)
    return (comparable(sink.rows), {k: v for k, v in metrics.items() if k not in machine},
            {name: {k: v for k, v in b.items() if k not in machine} for name, b in baselines.items()})


def test_the_same_records_give_the_same_rows_metrics_and_baselines_on_every_executor(engine, ray_cluster,
                                                                                     demo_checkpoint):
    from bart_opt.distributed import ClusterOptions, ReplicaPool

    records = hostile_records()
    options = EngineOptions(model=demo_checkpoint, device="cpu", max_batch_size=3)
    local = outcome(SummarizerExecutor(load_poisoned(options)), records)
    worker = outcome(SummarizerExecutor(engine.summarizer, device=lambda control: WorkerDevice(engine, control)),
                     records)
    ray = outcome(ReplicaPool(options, ClusterOptions(address=ray_cluster, replicas=1), load=load_poisoned),
                  records)
    rows, metrics, baselines = local
    assert sorted(rows) == sorted(["r0", "r1", "r2", "r3", "r4", "r5", "bad", "oom"])  # the repeated r0 ran once
    assert rows["bad"]["error"].startswith("text: character 7 (U+D800) is a lone surrogate")
    assert rows["oom"]["error"].startswith("out of memory on this input even in a batch of one")
    assert (metrics["n_obs"], metrics["n_errors"], metrics["n_scored"]) == (8, 2, 6)
    assert worker == local
    assert ray == local


def test_a_job_device_holds_one_call_and_a_stop_drops_the_queued_one(engine):
    control = RunControl()
    device = WorkerDevice(engine, control)
    release, entered = threading.Event(), threading.Event()

    def blocking():
        entered.set()
        release.wait(30)
        return "done"

    running = device.submit(blocking)
    assert entered.wait(30)
    queued = device.submit(lambda: "never")
    assert engine.queue_length(Kind.JOB) == 1
    control.stop()  # the queued call is dropped, the running one finishes
    release.set()
    assert running.result(30) == "done" and queued.cancelled()
    assert device.submit(lambda: "late").cancelled()  # a stopping run starts nothing new
