"""Memory and timing logs that are exact, cheap and work on CPU as well as CUDA.

Three pieces, from the bottom up:

- :class:`LiveTensorCounter` counts the bytes of tensor storages created while it
  is active and still alive, and their true peak. It is how memory is measured on
  CPU, where no allocator keeps statistics.
- :class:`MemoryLog` takes rows (``log_mem``) and phases (``phase``) with time,
  process RSS, device memory now and the true device-memory peak since the
  previous row. Where the device numbers come from (``peak_source``):

  * ``"cuda_allocator"`` on a CUDA device: ``torch.cuda.memory_allocated`` for
    memory now, ``torch.cuda.max_memory_allocated`` for the peak, with
    ``torch.cuda.reset_peak_memory_stats`` after every reading. The allocator has one
    peak counter per device, so the logs open on a device share each reading
    (:class:`_SharedCudaPeak`): nested or concurrent logs never lose each other's
    peaks. Times are taken after ``torch.cuda.synchronize``, so a phase's seconds
    include the kernels it queued;
  * ``"live_tensors"`` elsewhere: a :class:`LiveTensorCounter` owned by the log,
    counting only tensors created while the log is active (weights loaded before
    are not included);
  * ``"none"`` with ``count_cpu_tensors=False`` (time and RSS only; device
    numbers are 0), for when the counter's per-op cost is not wanted.

- :class:`LoggingMixin` lets every module of an ``nn.Module`` tree write to one
  shared log with ``self.log_mem(msg)`` and ``with self.log_phase(name):``; both
  cost one attribute check when no log is attached.

:func:`measure` wraps a block in an active log and yields it; its ``report()`` is
the per-call report the pipeline and the service hand out.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import resource
import threading
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "LiveTensorCounter", "LoggingMixin", "MemoryLog", "format_bytes", "measure", "peak_rss_bytes", "reset_peak_rss",
    "rss_bytes",
]

ROW_FIELDS = ("msg", "t", "cpu_mem_bytes", "mem_bytes", "mem_peak_bytes")
_PRINTED_ROWS = 20  # printing a log shows this many rows from each end
MAX_REPORT_ROWS = 256  # rows a `MemoryLog.report` carries at most (evenly thinned beyond)


class LiveTensorCounter(TorchDispatchMode):
    """Counts the bytes of live tensor storages created while the mode is active.

    Every aten op run on this thread inside ``with LiveTensorCounter() as c:`` is
    seen after it ran: each output storage that is neither counted already nor
    the storage of one of the op's inputs is a new allocation and is counted
    once, however many views of it exist; a weak reference subtracts it again
    when the storage is freed, even after the block has ended. Storages grown in
    place (``resize_``, ``out=``) are re-measured. ``peak_bytes`` is the true
    maximum of ``current_bytes`` since the start or the last ``reset_peak()``,
    updated at every allocation, not a sampled value.

    Not counted: storages created before the block (weights), scratch memory an
    op allocates and frees internally, and tensors made on other threads.
    Meta tensors and non-strided layouts are ignored.

    Cost: PyTorch routes every op through Python while a dispatch mode is
    active, about 10-20 microseconds per op on CPU; negligible next to the
    matrix products of a real model, large for a tiny one. The first use in a
    process also imports ``torch._dynamo`` (PyTorch wraps every dispatch mode
    with it), a one-off of a few seconds.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        # storage key -> (nbytes, weak reference whose callback releases it)
        self._live: dict[int, tuple[int, weakref.ref]] = {}
        self._aliasing: dict[object, bool] = {}

    def reset_peak(self) -> None:
        """Start a new peak window at the current live size."""
        self.peak_bytes = self.current_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        may_alias = self._aliasing.get(func)
        if may_alias is None:
            may_alias = any(ret.alias_info is not None for ret in func._schema.returns)
            self._aliasing[func] = may_alias
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        for tensor in outputs:
            if isinstance(tensor, torch.Tensor) and tensor.layout is torch.strided and not tensor.is_meta:
                self._see(tensor.untyped_storage(), may_alias and func is not _LIFT_FRESH, args, kwargs)
        return out

    def _see(self, storage: torch.UntypedStorage, may_alias: bool, args, kwargs) -> None:
        key = storage._cdata
        entry = self._live.get(key)
        if entry is not None:
            # An in-place resize_ or an out= op may have grown a counted storage.
            grown = storage.nbytes() - entry[0]
            if grown:
                self._live[key] = (entry[0] + grown, entry[1])
                self._add(grown)
            return
        # Views, in-place and out= ops return an input's storage; "may alias" ops
        # such as contiguous() sometimes return a new one instead.
        if may_alias and _storage_in(key, args, kwargs):
            return
        nbytes = storage.nbytes()
        self._live[key] = (nbytes, weakref.ref(storage, lambda _ref, k=key: self._release(k)))
        self._add(nbytes)

    def _add(self, nbytes: int) -> None:
        self.current_bytes += nbytes
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes

    def _release(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.current_bytes -= entry[0]


_LIFT_FRESH = torch.ops.aten.lift_fresh.default  # torch.tensor(data): made outside dispatch, but new


def _storage_in(key: int, args, kwargs) -> bool:
    """Whether a tensor among the op's arguments (or in a list argument) has storage `key`."""
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, (list, tuple)):
            if any(isinstance(a, torch.Tensor) and a.untyped_storage()._cdata == key for a in arg):
                return True
        elif isinstance(arg, torch.Tensor) and arg.layout is torch.strided and arg.untyped_storage()._cdata == key:
            return True
    return False


class _SharedCudaPeak:
    """One CUDA device's allocator peak counter, shared by every log open on that device.

    ``torch.cuda.reset_peak_memory_stats`` is global to the device: a log that resets it
    would erase the peak another log (an outer phase, a request on another thread) has
    not read yet. Every reading here is folded into the pending window of each log
    registered on the device before the counter is reset, and a log takes only its own
    window.
    """

    _lock = threading.Lock()
    _devices: dict[torch.device, _SharedCudaPeak] = {}

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # log -> peak since its last take

    @classmethod
    def of(cls, device: torch.device) -> _SharedCudaPeak:
        with cls._lock:
            return cls._devices.setdefault(device, cls(device))

    def take(self, log: object) -> int:
        """The device's true peak since `log` last took it (registering `log` on first use)."""
        with self._lock:
            peak = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            for other, window in list(self._windows.items()):
                self._windows[other] = max(window, peak)
            mine = self._windows.get(log, peak)
            self._windows[log] = 0
            return mine


_statm_fd: int | None = None


def rss_bytes() -> int:
    """Resident set size of this process in bytes.

    Read from ``/proc/self/statm`` through a file descriptor kept open (a few
    microseconds). Where that file does not exist (not Linux), the peak RSS from
    ``resource.getrusage`` is returned instead.
    """
    global _statm_fd
    try:
        if _statm_fd is None:
            _statm_fd = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(_statm_fd, 128, 0).split()[1]) * _PAGE_SIZE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def peak_rss_bytes() -> int:
    """The kernel's high-water mark of this process's resident set (``VmHWM``), in bytes.

    Exact, not sampled: the kernel updates it on every page fault. It covers everything the
    process holds, whichever library allocated it (torch, CTranslate2, the Python heap), since the
    process started or since the last :func:`reset_peak_rss`. Falls back to ``getrusage``'s
    ``ru_maxrss`` (never reset) where ``/proc/self/status`` does not exist.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Start a new :func:`peak_rss_bytes` window at the current RSS; False where the kernel cannot.

    Writes ``5`` to ``/proc/self/clear_refs`` (Linux 4.0 and later).
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def format_bytes(nbytes: float) -> str:
    """Human-readable size with binary units: ``format_bytes(3 * 2**20) == '3.00 MiB'``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, exp = float(nbytes), 0
    while abs(value) >= 1024 and exp < len(units) - 1:
        value /= 1024
        exp += 1
    return f"{value:.0f} B" if exp == 0 else f"{value:.2f} {units[exp]}"


class _Phase:
    """Context manager returned by :meth:`MemoryLog.phase`."""

    __slots__ = ("_log", "_name", "_start", "peak")

    def __init__(self, log: MemoryLog, name: str) -> None:
        self._log = log
        self._name = name

    def __enter__(self) -> _Phase:
        t, mem = self._log._sample()
        self._start = t
        self.peak = mem
        self._log._open.append(self)
        return self

    def __exit__(self, *exc) -> None:
        t, mem = self._log._sample()
        self._log._open.remove(self)
        self._log._phases.append(
            {"name": self._name, "start_t": self._start, "seconds": t - self._start, "peak_bytes": self.peak,
             "end_bytes": mem}
        )


class MemoryLog:
    """Rows and phases of time, RSS and device memory for one device.

    ``log_mem(msg)`` appends a row ``{"msg", "t", "cpu_mem_bytes", "mem_bytes",
    "mem_peak_bytes"}``: ``t`` is seconds since the log started, ``cpu_mem_bytes``
    the process RSS (:func:`rss_bytes`), ``mem_bytes`` the device memory now and
    ``mem_peak_bytes`` the true device peak since the previous row (or the start),
    both read from ``peak_source`` (see the module docstring). Byte numbers in
    rows, phases and :meth:`summary` are absolute readings of that source;
    :meth:`report` gives them relative to the start of the log.

    On CPU the tensor counter only runs while the log is active: use it as a
    context manager (``with MemoryLog("cpu") as log:``), call :meth:`start` /
    :meth:`stop`, or use :func:`measure`. On CUDA the log reads the allocator
    whether active or not; starting it only sets the baselines.
    """

    def __init__(self, device: str | torch.device | None = "cpu", *, count_cpu_tensors: bool = True) -> None:
        device = torch.device(device if device is not None else "cpu")
        self._cuda = device.type == "cuda"
        if self._cuda and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._counter = LiveTensorCounter() if count_cpu_tensors and not self._cuda else None
        if self._cuda:
            self._cuda_peak = _SharedCudaPeak.of(device)
            self.peak_source = "cuda_allocator"
        else:
            self.peak_source = "live_tensors" if self._counter is not None else "none"
        self._active = False
        self.reset()

    def reset(self) -> None:
        """Clear rows and phases and take new baselines (time, RSS, device memory) now."""
        self._rows: list[dict] = []
        self._phases: list[dict] = []
        self._open: list[_Phase] = []
        if self._cuda:
            torch.cuda.synchronize(self.device)
        self._t0 = time.perf_counter()
        self._start_mem = self._read_mem()
        self._read_peak()
        self._start_rss = rss_bytes()
        self._last = (0.0, self._start_mem, self._start_rss)
        self._peak = self._start_mem
        self._row_peak = self._start_mem

    def start(self) -> MemoryLog:
        """Activate the log (enters the CPU tensor counter) and reset it."""
        if not self._active:
            if self._counter is not None:
                self._counter.__enter__()
            self._active = True
        self.reset()
        return self

    def stop(self) -> None:
        """Take a last reading and deactivate the log; rows and summary stay readable."""
        if not self._active:
            return
        self._sample()
        self._active = False
        if self._counter is not None:
            self._counter.__exit__(None, None, None)

    def __enter__(self) -> MemoryLog:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _read_mem(self) -> int:
        if self._cuda:
            return torch.cuda.memory_allocated(self.device)
        return self._counter.current_bytes if self._counter is not None else 0

    def _read_peak(self) -> int:
        """True peak since the previous reading; starts a new window."""
        if self._cuda:
            return self._cuda_peak.take(self)
        if self._counter is None:
            return 0
        peak = self._counter.peak_bytes
        self._counter.reset_peak()
        return peak

    def _sample(self) -> tuple[float, int]:
        """Read time, memory and the peak window; fold the peak into every open window."""
        if self._cuda:
            torch.cuda.synchronize(self.device)  # the time of the work queued so far, not of its launch
        t = time.perf_counter() - self._t0
        mem = self._read_mem()
        peak = max(self._read_peak(), mem)
        if peak > self._peak:
            self._peak = peak
        if peak > self._row_peak:
            self._row_peak = peak
        for phase in self._open:
            if peak > phase.peak:
                phase.peak = peak
        self._last = (t, mem, self._last[2])
        return t, mem

    def log_mem(self, msg: str) -> None:
        """Append a row for `msg` (costs a few microseconds on CPU)."""
        t, mem = self._sample()
        rss = rss_bytes()
        self._last = (t, mem, rss)
        self._rows.append(
            {"msg": msg, "t": t, "cpu_mem_bytes": rss, "mem_bytes": mem, "mem_peak_bytes": self._row_peak}
        )
        self._row_peak = mem

    def phase(self, name: str) -> _Phase:
        """Context manager recording a phase ``{"name", "start_t", "seconds", "peak_bytes", "end_bytes"}``.

        ``start_t`` is seconds since the log started, like a row's ``t``;
        ``peak_bytes`` is the true device peak inside the phase. Phases may nest.
        """
        return _Phase(self, name)

    def rows(self) -> list[dict]:
        """A copy of the rows, oldest first."""
        return [dict(row) for row in self._rows]

    def phases(self) -> list[dict]:
        """A copy of the finished phases, in the order they ended."""
        return [dict(phase) for phase in self._phases]

    def _refresh(self) -> None:
        if self._active:
            self._sample()
            self._last = (self._last[0], self._last[1], rss_bytes())

    def summary(self) -> dict:
        """The seed's summary: ``{"device", "time_s", "cpu_mem_bytes", "mem_chg_bytes", "mem_peak_bytes"}``.

        ``time_s``: seconds from the start to the last reading; ``cpu_mem_bytes``:
        change of RSS over that time; ``mem_chg_bytes``: change of device memory;
        ``mem_peak_bytes``: true device peak over the whole log (absolute). An
        active log takes a fresh reading first.
        """
        self._refresh()
        t, mem, rss = self._last
        return {
            "device": str(self.device),
            "time_s": t,
            "cpu_mem_bytes": rss - self._start_rss,
            "mem_chg_bytes": mem - self._start_mem,
            "mem_peak_bytes": self._peak,
        }

    def report(self) -> dict:
        """Per-call report: device memory peak and change above the start, RSS, seconds, phases.

        ``{"device", "peak_bytes", "change_bytes", "rss_bytes", "seconds", "phases",
        "rows", "peak_source"}``. ``peak_bytes`` is what the logged work needed on top of
        what was allocated when the log started; ``rss_bytes`` is the process RSS
        at the last reading. ``phases`` aggregates phases by name, in order of first
        appearance: ``{"name", "count", "seconds" (total), "peak_bytes" (max, above
        the start)}``. ``rows`` are the `log_mem` readings (`Bart` logs one per decoder
        step) as ``{"t", "mem_bytes", "peak_bytes"}`` above the start, evenly thinned to at
        most `MAX_REPORT_ROWS` so that a report stays small whatever the call's length.
        """
        self._refresh()
        t, mem, rss = self._last
        by_name: dict[str, dict] = {}
        for phase in self._phases:
            name = phase["name"]
            agg = by_name.setdefault(name, {"name": name, "count": 0, "seconds": 0.0, "peak_bytes": 0})
            agg["count"] += 1
            agg["seconds"] += phase["seconds"]
            agg["peak_bytes"] = max(agg["peak_bytes"], phase["peak_bytes"] - self._start_mem)
        return {
            "device": str(self.device),
            "peak_bytes": self._peak - self._start_mem,
            "change_bytes": mem - self._start_mem,
            "rss_bytes": rss,
            "seconds": t,
            "phases": list(by_name.values()),
            "rows": self._report_rows(),
            "peak_source": self.peak_source,
        }

    def _report_rows(self) -> list[dict]:
        """The rows for `report`: every k-th, k chosen to keep at most `MAX_REPORT_ROWS`."""
        stride = max(1, math.ceil(len(self._rows) / MAX_REPORT_ROWS))
        return [{"t": row["t"], "mem_bytes": row["mem_bytes"] - self._start_mem,
                 "peak_bytes": row["mem_peak_bytes"] - self._start_mem} for row in self._rows[::stride]]

    def to_csv(self, path: str | Path) -> Path:
        """Write the rows as CSV with the header ``msg,t,cpu_mem_bytes,mem_bytes,mem_peak_bytes``."""
        path = Path(path)
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=ROW_FIELDS)
            writer.writeheader()
            writer.writerows(self._rows)
        return path

    def __str__(self) -> str:
        s = self.summary()
        lines = [
            f"MemoryLog on {s['device']} (device memory: {self.peak_source})",
            f"{'cpu_mem':<14}{format_bytes(s['cpu_mem_bytes']):>12}",
            f"{'time':<14}{s['time_s']:>12.4f}",
            f"{'mem_chg':<14}{format_bytes(s['mem_chg_bytes']):>12}",
            f"{'mem_peak':<14}{format_bytes(s['mem_peak_bytes']):>12}",
        ]
        if self._rows:
            lines.append("")
            lines.append(f"{'t (s)':>9} {'mem':>12} {'peak':>12} {'rss':>12}  msg")
            rows = self._rows
            if len(rows) > 2 * _PRINTED_ROWS:
                rows = [*rows[:_PRINTED_ROWS], None, *rows[-_PRINTED_ROWS:]]
            for row in rows:
                if row is None:
                    lines.append(f"{'...':>9}  ({len(self._rows) - 2 * _PRINTED_ROWS} rows not shown)")
                    continue
                lines.append(
                    f"{row['t']:>9.4f} {format_bytes(row['mem_bytes']):>12} "
                    f"{format_bytes(row['mem_peak_bytes']):>12} {format_bytes(row['cpu_mem_bytes']):>12}  {row['msg']}"
                )
        return "\n".join(lines)


_DETACHED = contextlib.nullcontext()


class LoggingMixin:
    """Mix into ``nn.Module``s so any module of a tree can write to one shared :class:`MemoryLog`.

    ``model.attach_log(log)`` hands the log to every ``LoggingMixin`` module in
    the tree; inside the modules, ``self.log_mem("after encoder %s", shape)`` and
    ``with self.log_phase("encode"):`` write to it. With no log attached both are
    a single attribute check (the message is not even formatted), so they can
    stay in hot loops.
    """

    _memory_log: MemoryLog | None = None

    def attach_log(self, log: MemoryLog | None) -> MemoryLog | None:
        """Share `log` with this module and every LoggingMixin module below it (None detaches)."""
        modules = self.modules() if isinstance(self, torch.nn.Module) else (self,)
        for module in modules:
            if isinstance(module, LoggingMixin):
                object.__setattr__(module, "_memory_log", log)
        return log

    @property
    def memory_log(self) -> MemoryLog | None:
        """The attached log, or None."""
        return self._memory_log

    def log_mem(self, msg: str, *args) -> None:
        """Append a row to the attached log; `msg % args` is only formatted when one is attached."""
        log = self._memory_log
        if log is not None:
            log.log_mem(msg % args if args else msg)

    def log_phase(self, name: str):
        """Context manager timing phase `name` in the attached log; a shared no-op when detached."""
        log = self._memory_log
        if log is None:
            return _DETACHED
        return log.phase(name)

    @property
    def summary(self) -> dict:
        """The attached log's :meth:`MemoryLog.summary` (rows from the whole tree), or {} when detached."""
        log = self._memory_log
        return log.summary() if log is not None else {}

    def reset_logs(self) -> None:
        """Clear the attached log's rows and phases and take new baselines."""
        if self._memory_log is not None:
            self._memory_log.reset()


@contextlib.contextmanager
def measure(device: str | torch.device | None = "cpu", *, count_cpu_tensors: bool = True):
    """Run a block under an active :class:`MemoryLog` and yield it.

    >>> with measure("cpu") as log:
    ...     y = model.generate(x)
    >>> log.report()["peak_bytes"]
    """
    with MemoryLog(device, count_cpu_tensors=count_cpu_tensors) as log:
        yield log
