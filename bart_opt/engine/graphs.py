"""CUDA graphs of the static search's decoder step, kept for the model's life (`StepGraphs`).

A decoder step at bart-large shape is a few hundred kernels; launched one by one from Python, the
host takes longer to queue them than the GPU to run them at small and medium batches. A CUDA graph
records a step's kernels once and replays them with one launch. The static search
(`bart_opt.engine.static_generation`) reads and writes only device tensors in place in its step, so its
step can be captured; `StepGraphs` keeps the graphs of one model from call to call:

* one graph per key: the generation settings, whether EL-attention is on, the row bucket (inputs
  in the working batch), the source-length bucket and the self-attention length bucket
  (`bart_opt.engine.cache.LENGTH_BUCKET`); the search pads a call's inputs up to its buckets, so calls of
  other sizes share graphs;
* every tensor a step reads lives in persistent buffers (`bart_opt.engine.buffers.StaticBuffers`, owned
  here): a call copies its inputs in, and a graph captured in an earlier call replays against the
  same addresses. A repeat call with shapes already seen captures nothing;
* a key's first step runs eagerly on the capture stream (the warm-up: libraries create their
  handles, workspaces and lazily loaded kernels there, outside the capture; it is a real step of the
  search) and is captured right after (a capture runs nothing); every later step in that shape, in
  this call or any later one, replays. So a first call captures every shape it visits, and a repeat
  call with shapes already seen captures none;
* bounded: at most `MAX_GRAPHS` graphs (the least recently used goes), all in one memory pool (they
  replay one after another, never together, and write nothing that outlives a step outside the
  persistent buffers, so each reuses the memory the others use); a buffer that has to grow drops
  every graph (they recorded its old address);
* the attention backend is pinned while warming up and capturing (`PINNED_ATTENTION`): the
  memory-efficient kernel, which takes an additive mask, with the math one as its fallback;
* inside `strict_replays()`, warm-ups and replays run under `torch.cuda.set_sync_debug_mode("error")`:
  a step that reads the device from the host raises instead of stalling (the device check uses it).

`stats()` reports the graphs, their pool and the buffers (`/metrics` and the memory log show them);
`last_call` what the latest call did (captures, keys, capture seconds).

Off CUDA there is nothing to capture: the search runs its step eagerly on tensors of its own
(`uses_graphs`), unless a test hands `StepGraphs` a backend of its own (`backend=`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextvars import ContextVar

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bart_opt.engine.buffers import StaticBuffers

PINNED_ATTENTION = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
MAX_GRAPHS = 64
"""Graphs one model keeps (least recently used first out). A call visits at most one per (row bucket,
length bucket) pair it passes through: about 12 for 128 inputs at the CNN settings."""
_STRICT: ContextVar[bool] = ContextVar("bart_opt_strict_replays", default=False)


def uses_graphs(device: torch.device) -> bool:
    """Whether the static search captures its step in CUDA graphs on `device`: on CUDA."""
    return device.type == "cuda"


@contextlib.contextmanager
def strict_replays() -> Iterator[None]:
    """Within the block, a static search's steps on CUDA (warm-ups and graph replays) raise on any host sync."""
    token = _STRICT.set(True)
    try:
        yield
    finally:
        _STRICT.reset(token)


@contextlib.contextmanager
def _sync_debug() -> Iterator[None]:
    """`torch.cuda.set_sync_debug_mode("error")` for the block, inside `strict_replays()`."""
    if not _STRICT.get() or not torch.cuda.is_available():
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


class CudaGraphs:
    """The CUDA side of `StepGraphs`: warm-up and capture on a side stream, one pool for every graph."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()
        self.pool_bytes = 0  # memory the captures reserved for the pool

    def warm_up(self, step: Callable[[], None]) -> None:
        """One real step, eagerly, on the capture stream."""
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream), sdpa_kernel(PINNED_ATTENTION), _sync_debug():
            step()
        current.wait_stream(self.stream)

    def capture(self, step: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """Record the step (capturing runs nothing: the caller replays it right after)."""
        graph = torch.cuda.CUDAGraph()
        before = torch.cuda.memory_reserved(self.device)
        # "thread_local": other threads of a service may use CUDA meanwhile; only this one must not.
        with sdpa_kernel(PINNED_ATTENTION), torch.cuda.graph(graph, pool=self.pool, stream=self.stream,
                                                             capture_error_mode="thread_local"):
            step()
        self.pool_bytes += max(0, torch.cuda.memory_reserved(self.device) - before)
        return graph

    def replay(self, graph: torch.cuda.CUDAGraph, step: Callable[[], None]) -> None:
        with _sync_debug():
            graph.replay()

    def reset(self) -> None:
        """A new pool for the graphs to come (the old one goes with the last graph that used it)."""
        self.pool = torch.cuda.graph_pool_handle()
        self.pool_bytes = 0
        torch.cuda.empty_cache()


class EagerSteps:
    """A backend that captures nothing: every step runs eagerly, in the graphs' shapes and buffers, with
    the attention backend the graphs pin. What the graphs must equal bit for bit (the device check's
    first gate), and the path a CPU takes through `StepGraphs` in tests."""

    pool_bytes = 0

    def warm_up(self, step: Callable[[], None]) -> None:
        with sdpa_kernel(PINNED_ATTENTION):
            step()

    def capture(self, step: Callable[[], None]) -> None:
        return None

    def replay(self, graph: None, step: Callable[[], None]) -> None:
        self.warm_up(step)

    def reset(self) -> None:
        pass


class StepGraphs:
    """One model's static-step graphs and the persistent buffers they read (see the module docstring).

    `run(key, step)` runs one step of the search in shape `key` (hashable): warms up, captures or
    replays. `lock` is held by a call for its whole length: the buffers serve one call at a time.
    """

    def __init__(self, device: torch.device, max_graphs: int = MAX_GRAPHS, backend=None):
        self.device = device
        self.max_graphs = max_graphs
        self.backend = backend if backend is not None else CudaGraphs(device)
        self.buffers = StaticBuffers(device, on_grow=lambda name: self.clear())
        self.lock = threading.Lock()
        self._graphs: OrderedDict[Hashable, object] = OrderedDict()  # key -> graph, least recently used first
        self.captures = 0
        self.capture_seconds = 0.0
        self.last_call: dict = {}

    def begin_call(self) -> None:
        """Start counting what one generate call does (`last_call`)."""
        self.last_call = {"captures": 0, "capture_s": 0.0, "replays": 0, "keys": []}

    def run(self, key: Hashable, step: Callable[[], None]) -> None:
        """One step in shape `key`: the first ever in that shape runs eagerly (the warm-up, a real step) and
        is captured right after (capturing runs nothing: the capture is replayed from the next step on);
        every later one, in this call or any later, replays."""
        call = self.last_call
        keys = call.setdefault("keys", [])
        if not keys or keys[-1] != key:
            keys.append(key)
        if key not in self._graphs:
            self.backend.warm_up(step)
            start = time.perf_counter()
            self._graphs[key] = self.backend.capture(step)
            seconds = time.perf_counter() - start
            self.captures += 1
            self.capture_seconds += seconds
            call["captures"] = call.get("captures", 0) + 1
            call["capture_s"] = call.get("capture_s", 0.0) + seconds
            self._bound()
            return
        self._graphs.move_to_end(key)
        self.backend.replay(self._graphs[key], step)
        call["replays"] = call.get("replays", 0) + 1

    def _bound(self) -> None:
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)

    @property
    def graphs(self) -> int:
        """Graphs held (captured, not evicted)."""
        return len(self._graphs)

    def clear(self) -> None:
        """Drop every graph (and with them their pool)."""
        self._graphs.clear()
        self.backend.reset()

    def release(self) -> None:
        """Drop every graph and free the buffers (the next call starts over)."""
        self.clear()
        self.buffers.clear()

    def stats(self) -> dict:
        """`{"graphs", "captures", "capture_s", "pool_bytes", "buffers_bytes"}` for this model's life."""
        return {"graphs": self.graphs, "captures": self.captures, "capture_s": self.capture_seconds,
                "pool_bytes": self.backend.pool_bytes, "buffers_bytes": self.buffers.nbytes()}


def step_graphs(model) -> StepGraphs | None:
    """The model's `StepGraphs` (made on first use; a test or the device check may set its own as
    `model._step_graphs`), or None where its device takes no graphs."""
    graphs = getattr(model, "_step_graphs", None)
    if graphs is None and uses_graphs(model.device):
        graphs = model._step_graphs = StepGraphs(model.device)
    return graphs
