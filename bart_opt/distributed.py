"""Evaluation past one machine: replicas of the `Summarizer` on a Ray cluster, fed by Ray Data.

`ReplicaPool` is an executor of the evaluation core (`bart_opt.evaluate.core`): `run(source,
spec, control)` maps a Ray Dataset of the source's records through
``map_batches(Replica, compute=ActorPoolStrategy(size=N))``: a fixed pool of N Ray actors, each
of which loads the model once (`Replica.__init__`) and runs every call's records through the
same executor as one process (`SummarizerExecutor.run_window`: refused rows, token-budget
batches, padding trim, failure splitting, ROUGE). Ray Data distributes the calls, applies
backpressure and retries; nothing here schedules. The driver gets the `RowBatch`es of a call
once the replica call returns (a call is at most `MAX_RECORDS_PER_CALL` records, and about a
`CALLS_PER_REPLICA`-th of each replica's share on small runs: the unit of progress, and of what
an interrupted run redoes), in whatever order; the core decides where the rows go.

The dataset comes from the source: a source with a ``ray_dataset(replicas)`` method (the
service's jobs read their records from the jobs database in Ray read tasks) gives its own; any
other is read on the driver, longest records first. `ReplicaPool` also describes the model for
the metrics without loading the weights on the driver (``name``, ``scorer``, ``device``,
``count_cpu_tensors``, ``generation_spec``).

The options (`bart_opt.cluster.ClusterOptions`, re-exported here) are defined, with their flags and
settings, in `bart_opt.cluster`, which imports no Ray.

Resources: a replica asks Ray for ``gpus_per_replica`` GPUs and ``threads_per_replica`` CPUs
(its torch threads), so a 2-CPU machine holds two one-thread replicas; records in driver memory
need no read tasks, and a source read on the driver's node (the service's jobs) asks for no CPU.

Faults and bounds:

- a replica that dies (its process killed, its node lost) is restarted by Ray and the call it
  was running is run again, up to ``task_retries`` times per call; a call that a replica dies on
  every time fails the run. Rows of a re-run call may arrive twice: the consumer keeps the first
  (the driver dedupes by id);
- `ReplicaPool.start` refuses at once, with `ClusterError`, a cluster that cannot be reached or
  cannot hold the replicas asked for (no GPU, too few CPUs);
- while no node has room for even one replica (the GPUs are busy), the pool waits at most
  ``start_timeout_s``, saying so through ``on_status``; once running, a pipeline with no progress
  for ``stall_timeout_s`` fails (Ray Data's no-progress guard). Either way a `ClusterError` says
  what happened in words a client may see; the cause (Ray's own error) is chained for the log.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import pyarrow as pa
import ray
import ray.data
import torch

from bart_opt.cluster import LOCAL, ClusterOptions
from bart_opt.pipeline.data import Record
from bart_opt.evaluate.core import Pending, RunControl, Source, SummarizerExecutor, screened
from bart_opt.evaluate.rows import RowBatch
from bart_opt.engine.fingerprint import check_fingerprint
from bart_opt.engine.fingerprint import fingerprint as checkpoint_fingerprint
from bart_opt.engine.loading import resolve_checkpoint, weights_file
from bart_opt.engine.options import EngineOptions
from bart_opt.pipeline.rouge import RougeScorer, RougeSettings
from bart_opt.engine.spec import GenerationSpec
from bart_opt.pipeline.summarizer import Summarizer

logger = logging.getLogger("bart_opt.distributed")

MAX_RECORDS_PER_CALL = 256  # records one replica call plans into batches, at most
CALLS_PER_REPLICA = 4  # fewer records per call on small runs, so that every replica gets some
ROOM_POLL_S = 1.0
Loader = Callable[[EngineOptions], Summarizer]  # what a replica loads its model with (picklable)
FEED_DEPTH = 4  # finished calls' rows waiting for the consumer, at most
FEED_POLL_S = 0.2  # how often a consumer waiting for rows looks at its run's control
SHUTDOWN_TIMEOUT_S = 30.0  # how long `disconnect` waits for Ray to shut down


class ClusterError(RuntimeError):
    """The cluster cannot be reached or cannot hold the replicas, the replicas made no progress,
    or a replica failed. The message is fit for a client; Ray's own error is the ``__cause__``."""


@dataclass(frozen=True)
class Placement:
    """What the pool asks of the cluster: replicas, and the CPUs and GPUs of each."""

    replicas: int
    cpus: float
    gpus: float

    def describe(self) -> str:
        gpus = f" and {self.gpus:g} GPU" + ("s" if self.gpus != 1 else "") if self.gpus else ""
        return f"{self.replicas} replica{'s' if self.replicas != 1 else ''} of {self.cpus:g} CPU{gpus} each"


def connect(options: ClusterOptions) -> None:
    """Join (or start) the Ray cluster of `options`, once per process; raises `ClusterError`.

    A ``HOST:PORT`` address is first tried with a plain TCP connection, so an unreachable
    cluster is reported within ``connect_timeout_s`` (Ray itself keeps retrying for minutes).
    """
    if ray.is_initialized():
        return
    address = options.address
    if address not in (LOCAL, "auto") and not address.startswith("ray://"):
        _probe(address, options.connect_timeout_s)
    settings: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address == LOCAL:
        settings["include_dashboard"] = False
    try:
        ray.init(address=None if address == LOCAL else address, **settings)
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise ClusterError(f"could not join the Ray cluster at {address!r} ({_first_line(error)})") from error


def disconnect(timeout_s: float | None = None) -> bool:
    """Leave the Ray cluster (``ray.shutdown``; a Ray instance this process started stops with it),
    waiting at most `timeout_s` (default `SHUTDOWN_TIMEOUT_S`).

    Returns False when Ray's shutdown had not returned by then: it goes on in a daemon thread
    and holds Ray's lock, so only ``os._exit`` is safe afterwards (see `exit_process`). Ray's
    shutdown can hang for good (a known class of Ray bugs; once in our CI, after a driver of the
    same cluster was killed).
    """
    if not ray.is_initialized():
        return True
    leaving = threading.Thread(target=ray.shutdown, name="ray-shutdown", daemon=True)
    leaving.start()
    leaving.join(SHUTDOWN_TIMEOUT_S if timeout_s is None else timeout_s)
    return not leaving.is_alive()


def exit_process(code: int, program: str) -> NoReturn:
    """End a process that joined Ray with exit status `code`: leave the cluster within
    `SHUTDOWN_TIMEOUT_S` (`disconnect`), flush stdout and stderr, then ``os._exit``.

    The interpreter's exit handlers are skipped, Ray's own included, which would wait on a hung
    shutdown for good. Ctrl-C or SIGTERM during the wait ends it at once with the same exit.
    """
    try:
        left = disconnect()
    except (KeyboardInterrupt, SystemExit):
        left = False
    if not left:
        _say(f"{program}: Ray did not shut down within {SHUTDOWN_TIMEOUT_S:g} s; exiting without it")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`), a closed stream
            pass
    os._exit(code)


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):
        pass


def _probe(address: str, timeout: float) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"the Ray address {address!r} is not HOST:PORT, 'auto' or '{LOCAL}'")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ClusterError(f"no Ray cluster answers at {address} ({reason.lower()}); start one with "
                           "`ray start --head` or check the address") from error


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def place(options: ClusterOptions, nodes: Sequence[Mapping[str, float]]) -> Placement:
    """The replicas to ask for, given each live node's total resources (``{"CPU": 8, "GPU": 2}``).

    Raises `ClusterError` when no node could hold one replica, or the cluster could not hold
    as many as `options.replicas` at once.
    """
    cpus, gpus = float(options.threads_per_replica), float(options.gpus_per_replica)
    fits = sum(_fits(node, cpus, gpus) for node in nodes)
    need = f"{cpus:g} CPU" + (f" and {gpus:g} GPU" if gpus else "")
    total_cpus = sum(node.get("CPU", 0) for node in nodes)
    total_gpus = sum(node.get("GPU", 0) for node in nodes)
    has = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}, {total_cpus:g} CPUs, {total_gpus:g} GPUs in all"
    if fits == 0:
        raise ClusterError(f"no node of the Ray cluster can hold a replica: each needs {need} ({has})")
    replicas = options.replicas or fits
    if replicas > fits:
        raise ClusterError(f"the Ray cluster holds {fits} replica{'s' if fits != 1 else ''} of {need}, not "
                           f"{replicas} ({has}); ask for fewer replicas, threads or GPUs per replica")
    return Placement(replicas=replicas, cpus=cpus, gpus=gpus)


def _fits(resources: Mapping[str, float], cpus: float, gpus: float) -> int:
    """How many replicas of `cpus` CPUs and `gpus` GPUs fit in `resources`."""
    count = math.floor(resources.get("CPU", 0) / cpus + 1e-9)
    if gpus:
        count = min(count, math.floor(resources.get("GPU", 0) / gpus + 1e-9))
    return count


def records_per_call(records: int, replicas: int) -> int:
    """Records one replica call takes: up to `MAX_RECORDS_PER_CALL`, and few enough that each
    replica gets about `CALLS_PER_REPLICA` calls of a small run."""
    return max(1, min(MAX_RECORDS_PER_CALL, math.ceil(records / (replicas * CALLS_PER_REPLICA))))


class Replica:
    """One model replica: the callable class Ray Data runs in each actor of the pool.

    Input columns: ``position``, ``id``, ``text``, ``reference`` (null without one) and
    ``error`` (null, or why the record was refused before the model: it gets an error row).
    Output: one row per `RowBatch` of the call: ``rows`` and ``positions`` (JSON lists), ``kind``,
    ``peak_bytes``, ``seconds``, ``call_started_at``, ``finished_at``, ``model_call``, ``replica``.
    """

    def __init__(self, engine: EngineOptions, spec: GenerationSpec, fingerprint: str | None = None,
                 load: Loader = Summarizer.from_options, rouge: RougeSettings | None = None):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.summarizer = load(engine)
        if fingerprint is not None:  # the driver's: a replica on a node with other files must not run
            check_fingerprint(fingerprint, self.summarizer.fingerprint, "this run")
        self.executor = SummarizerExecutor(self.summarizer)
        self.spec = spec
        self.rouge = rouge
        self.name = f"{ray.util.get_node_ip_address()}:{os.getpid()}"

    def __call__(self, batch: pa.Table) -> pa.Table:
        started = time.time()
        out: dict[str, list] = {key: [] for key in _COLUMNS}
        # nulls stay None here (a NumPy batch would make an all-null column NaN)
        window = [Pending(item["position"], Record(item["id"], item["text"], item["reference"]), item["error"])
                  for item in batch.to_pylist()]
        for done in self.executor.run_window(window, self.spec, rouge=self.rouge):
            for key, value in (("rows", json.dumps(done.rows, ensure_ascii=False)), ("positions", json.dumps(done.positions)),
                               ("kind", done.kind), ("peak_bytes", done.peak_bytes), ("seconds", done.seconds),
                               ("call_started_at", started), ("finished_at", time.time()),
                               ("model_call", done.model_call), ("replica", self.name)):
                out[key].append(value)
        return pa.table(out)


_COLUMNS = ("rows", "positions", "kind", "peak_bytes", "seconds", "call_started_at", "finished_at", "model_call",
            "replica")


@dataclass
class ReplicaPool:
    """Replicas of one checkpoint on a Ray cluster (see the module docstring).

    `engine` is what each replica loads (`EngineOptions`; the pool sets its device, threads and an absolute
    checkpoint path). `name` is how results name the model (default: ``engine.model`` as given). `on_status(message)` hears
    what the pool is waiting for ("waiting for room ...", "starting ..."); `load(engine)` is what each
    replica loads its model with (default `Summarizer.from_options`; picklable); `timings` collects
    ``connect_s`` (joining or starting Ray) and ``first_result_s`` (of the last run: from its
    start to its first finished batch, replicas' start and model loading included).
    """

    engine: EngineOptions
    options: ClusterOptions = field(default_factory=ClusterOptions)
    name: str = ""
    on_status: Callable[[str], None] = lambda message: None
    scorer: RougeScorer = field(default_factory=RougeScorer)
    timings: dict[str, float] = field(default_factory=dict)
    load: Loader = Summarizer.from_options

    def __post_init__(self) -> None:
        self.name = self.name or self.engine.model
        # Replicas start in other folders, on their own devices and threads.
        self.engine = replace(self.engine.portable(), device="cuda" if self.options.gpus_per_replica > 0 else "cpu",
                              torch_threads=self.options.threads_per_replica)
        # Refused here, before Ray starts (int8 on GPU replicas); each replica checks its own machine as it loads.
        self.engine.validate(here=False)
        self.placement: Placement | None = None
        self._configs = None
        self._fingerprint: str | None = None

    # ---- what run_evaluation asks of its model -------------------------------------------

    @property
    def device(self) -> torch.device:
        """The replicas' device type (``cuda`` when they have GPUs)."""
        return torch.device(self.engine.device)

    @property
    def count_cpu_tensors(self) -> bool:
        return self.engine.count_cpu_tensors

    def generation_spec(self, overrides: Mapping[str, Any] | None = None) -> GenerationSpec:
        """`overrides` resolved over the checkpoint's generation config, read on the driver without
        the weights (as `Summarizer.generation_spec` resolves them). Raises `InvalidRequest`."""
        if self._configs is None:
            from transformers import BartConfig

            from bart_opt.engine.loading import load_generation_config

            folder = resolve_checkpoint(self.engine.model)
            config = BartConfig.from_pretrained(str(folder))
            self._configs = (config, load_generation_config(folder, config))
        return GenerationSpec.resolve(*self._configs, overrides, max_beams=self.engine.max_beams)

    # ---- running -----------------------------------------------------------------------------

    def start(self) -> Placement:
        """Join the cluster and decide the placement; raises `ClusterError` (see `place`)."""
        if self.placement is None:
            tick = time.perf_counter()
            connect(self.options)
            self.timings["connect_s"] = time.perf_counter() - tick
            nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
            self.placement = place(self.options, nodes)
        return self.placement

    in_process = False  # the model calls run in the replicas

    @property
    def model(self) -> ReplicaPool:
        return self

    def identity(self) -> dict[str, Any]:
        """What a resumed run must match: the model's name."""
        return {"model": self.name}

    def engine_record(self) -> dict[str, Any]:
        """The replicas' engine as each resolves it (`bart_opt.evaluate.record.engine_record`), without loading it here."""
        from bart_opt.evaluate.record import engine_record

        e = self.engine
        dtype = str(e.torch_dtype(self.device)).removeprefix("torch.")
        return engine_record(dtype=dtype, mode="exact" if e.exact else "fast" if e.fast else "default", static=e.static,
                             el_attention=e.el_attention, quantize=e.quantize, device=self.device.type,
                             max_batch_tokens=e.max_batch_tokens, max_batch_size=e.max_batch_size)

    def processor(self) -> dict[str, Any]:
        """What runs the replicas: a Ray cluster's ``cpu`` or ``cuda`` replicas (each node's own processor)."""
        return {"ray": self.device.type}

    @property
    def fingerprint(self) -> str:
        """The checkpoint's content digest, hashed on the driver (each replica checks that it loaded the same)."""
        if self._fingerprint is None:
            folder = resolve_checkpoint(self.engine.model)
            self._fingerprint = str(checkpoint_fingerprint(folder, weights_file(folder).name))
        return self._fingerprint

    def run(self, source: Source, spec: GenerationSpec, control: RunControl,
            rouge: RougeSettings | None = None) -> Iterator[RowBatch]:
        """The row batches of `source`'s records (see the module docstring), as their calls return; each
        replica scores with `rouge`'s scorer (None: the pool's `scorer`'s settings).

        Closing the generator (or leaving the loop) shuts the pipeline down and frees the replicas;
        so does `control` stopping, which also ends the wait for room (nothing is yielded then).
        What the run waits for goes to ``on_status`` and ``control.status``. Raises `ClusterError`.
        """
        def status(message: str) -> None:
            self.on_status(message)
            control.status(message)

        placement = self.start()
        dataset, records = source.ray_dataset(placement.replicas) if hasattr(source, "ray_dataset") else \
            _dataset_of(source, records_per_call, placement.replicas)
        if not records or not self._wait_for_room(placement, lambda: control.stopping, status):
            return
        status(f"starting {placement.describe()} (each loads the model)")
        started = time.perf_counter()
        rouge = rouge or self.scorer.settings
        feed = _Feed(_translated(iter(self._pipeline(dataset, spec, placement, records, rouge).iter_rows()),
                                 self.options))
        first = True
        try:
            while (item := feed.get(control)) is not None:
                if first:
                    first = False
                    self.timings["first_result_s"] = time.perf_counter() - started
                    status(f"running on {placement.describe()}")
                yield RowBatch(rows=json.loads(item["rows"]), positions=json.loads(item["positions"]),
                               kind=str(item["kind"]), peak_bytes=int(item["peak_bytes"]),
                               seconds=float(item["seconds"]), replica=str(item["replica"]),
                               started_at=float(item["call_started_at"]), finished_at=float(item["finished_at"]))
        finally:
            feed.close()

    def _pipeline(self, dataset: ray.data.Dataset, spec: GenerationSpec, placement: Placement,
                  records: int, rouge: RougeSettings) -> ray.data.Dataset:
        per_call = records_per_call(records, placement.replicas)
        with warnings.catch_warnings():
            # Ray 2.60 moves extra remote options behind named parameters, but none exists yet
            # for the retry bounds; passing them is still supported (until Ray 2.64).
            warnings.simplefilter("ignore", DeprecationWarning)
            pipeline = dataset.map_batches(
                Replica,
                fn_constructor_kwargs={"engine": self.engine, "spec": spec, "fingerprint": self.fingerprint,
                                       "load": self.load, "rouge": rouge},
                batch_size=per_call,
                batch_format="pyarrow",
                # No more replicas than calls: each would load the model for nothing.
                compute=ray.data.ActorPoolStrategy(size=min(placement.replicas, math.ceil(records / per_call))),
                num_cpus=placement.cpus,
                num_gpus=placement.gpus or None,
                max_restarts=-1,
                max_task_retries=self.options.task_retries,
            )
        context = pipeline.context
        context.execution_no_progress_timeout_s = self.options.stall_timeout_s
        context.enable_progress_bars = False  # the caller reports progress
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # "progress bars disabled"
        return pipeline

    def _wait_for_room(self, placement: Placement, stopped: Callable[[], bool],
                       status: Callable[[str], None]) -> bool:
        """Wait until the free resources hold one replica; False when `stopped()` first."""
        deadline = time.monotonic() + self.options.start_timeout_s
        announced = False
        while not stopped():
            free = ray.available_resources()
            if _fits(free, placement.cpus, placement.gpus) >= 1:
                return True
            if time.monotonic() >= deadline:
                raise ClusterError(f"no room on the Ray cluster for a replica ({_room(placement, free)}) for "
                                   f"{self.options.start_timeout_s:g} s; try again when it is less busy")
            if not announced:
                status(f"waiting for room on the Ray cluster: {_room(placement, free)}")
                announced = True
            time.sleep(ROOM_POLL_S)
        return False


def _dataset_of(source: Source, per_call: Callable[[int, int], int], replicas: int) -> tuple[ray.data.Dataset, int]:
    """The records of `source`'s windows in driver memory as a dataset of the `Replica` columns,
    longest first (by characters: each call holds inputs of similar length and an input that
    runs out of memory shows up early, as in one process), and how many there are."""
    items = [{"position": p.position, "id": p.record.id, "text": p.record.text, "reference": p.record.reference,
              "error": p.refused} for window in source.windows() for p in map(screened, window)]
    items.sort(key=lambda item: -len(item["text"]))
    blocks = math.ceil(len(items) / per_call(len(items), replicas)) if items else 1
    return ray.data.from_items(items, override_num_blocks=blocks), len(items)


def _room(placement: Placement, free: Mapping[str, float]) -> str:
    need = f"{placement.cpus:g} CPU" + (f" and {placement.gpus:g} GPU" if placement.gpus else "")
    have = f"{free.get('CPU', 0):g} CPU" + (f" and {free.get('GPU', 0):g} GPU" if placement.gpus else "")
    return f"a replica needs {need}, {have} free"


def _translated(results: Iterator[dict], options: ClusterOptions) -> Iterator[dict]:
    """`results`, with Ray's failures turned into `ClusterError`s that say what happened."""
    from ray.data.exceptions import ExecutionTimeoutError

    try:
        yield from results
    except ExecutionTimeoutError as error:
        raise ClusterError(f"the Ray replicas made no progress for {options.stall_timeout_s:g} s (starting, "
                           "loading the model or running a batch); the cluster may be short of resources") from error
    except ray.exceptions.ActorDiedError as error:
        raise ClusterError("a Ray replica died and could not be replaced (the model may fail to load on a node, or "
                           f"a batch kill its replica on all {options.task_retries + 1} tries)") from error
    except ray.exceptions.RayError as error:
        raise ClusterError(f"a Ray replica failed: {_first_line(error)}") from error


class _Feed:
    """Rows of a pipeline pulled by a thread of their own into a small queue, so that the consumer
    sees a stop or a cancel at once rather than after the call it waits for. `close` stops
    pulling: that thread then shuts the pipeline down (its replicas freed) once the call it
    waits for has returned."""

    _END = object()

    def __init__(self, results: Iterator[dict]):
        self._queue: queue.Queue = queue.Queue(maxsize=FEED_DEPTH)
        self._closed = threading.Event()
        threading.Thread(target=self._pull, args=(results,), name="bart-opt-ray-feed", daemon=True).start()

    def get(self, control: RunControl) -> dict | None:
        """The next row; None at the end or once `control` stops; raises the pipeline's `ClusterError`."""
        while not control.stopping:
            try:
                item = self._queue.get(timeout=FEED_POLL_S)
            except queue.Empty:
                continue
            if item is _Feed._END:
                return None
            if isinstance(item, BaseException):
                raise item
            return item
        return None

    def close(self) -> None:
        self._closed.set()

    def _pull(self, results: Iterator[dict]) -> None:
        end: object = _Feed._END
        try:
            for item in results:
                if not self._put(item):
                    return
        except ClusterError as error:
            end = error
        except Exception as error:  # noqa: BLE001 - handed to the consumer, which fails its run with it
            logger.exception("the Ray pipeline failed")
            end = ClusterError("the Ray pipeline failed (the server log has the details)")
            end.__cause__ = error
        finally:
            results.close()
        self._put(end)

    def _put(self, item: object) -> bool:
        """Queue `item` when there is room; False when closed first."""
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=FEED_POLL_S)
            except queue.Full:
                continue
            return True
        return False


__all__ = ["ClusterError", "ClusterOptions", "Placement", "Replica", "ReplicaPool",
           "connect", "disconnect", "exit_process", "place", "records_per_call"]
