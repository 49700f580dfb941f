"""CUDA graphs of the static search's decoder step: one graph per row bucket.

A decoder step at bart-large shape is a few hundred kernels; launched one by one from Python, the
host takes longer to queue them than the GPU to run them at small and medium batches. A CUDA graph
records a step's kernels once and replays them with one launch. `StepGraphs` does so for the static
search (`bart_opt.static_generation`), whose step reads and writes only device tensors in place:

* one graph per row bucket, captured when the search first runs a step in that bucket: the
  largest (the call's batch) first, then smaller ones as inputs settle and the batch is compacted;
  a bucket's graph is dropped when the batch moves to a smaller one (it never grows back);
* every graph of a call allocates from one memory pool: they replay one after another, never
  together, so each reuses what the ones before it freed;
* the step before a capture runs eagerly on the capture stream (the warm-up: libraries create
  their handles and workspaces there, outside the capture); it is a real step of the search;
* the attention backend is pinned while warming up and capturing (`PINNED_ATTENTION`): the
  memory-efficient kernel, which takes an additive mask, with the math one as its fallback; the
  kernel a graph replays is the one the warm-up ran;
* inside `strict_replays()`, warm-ups and replays run under `torch.cuda.set_sync_debug_mode("error")`:
  a step that reads the device from the host raises instead of stalling (the device check uses it).

Off CUDA there is nothing to capture: the step runs eagerly (`uses_graphs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

PINNED_ATTENTION = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
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
    if not _STRICT.get():
        yield
        return
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


class StepGraphs:
    """Runs `step` (a function of no arguments that updates device tensors in place) once per `run`:
    eagerly off CUDA; on CUDA as the replay of the current bucket's graph.

    `run(bucket)` names the bucket the step's tensors belong to; a new bucket means new tensors
    (the search compacted its batch), so its first step warms up and its second is captured.
    """

    def __init__(self, step: Callable[[], None], device: torch.device):
        self.step, self.device = step, device
        self.graphs = uses_graphs(device)
        self.bucket: int | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.captures = 0
        if self.graphs:
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream(device)

    def run(self, bucket: int) -> None:
        """Run one step of the search in row bucket `bucket`."""
        if not self.graphs:
            self.step()
        elif bucket != self.bucket:
            self.bucket, self.graph = bucket, None  # the previous bucket's graph is never replayed again
            self._warm_up()
        else:
            if self.graph is None:
                self._capture()
            with _sync_debug():
                self.graph.replay()

    def _warm_up(self) -> None:
        """One real step, eagerly, on the capture stream."""
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream), sdpa_kernel(PINNED_ATTENTION), _sync_debug():
            self.step()
        current.wait_stream(self.stream)

    def _capture(self) -> None:
        """Record the step (capturing runs nothing: the step is replayed right after)."""
        graph = torch.cuda.CUDAGraph()
        # "thread_local": other threads of a service may use CUDA meanwhile; only this one must not.
        with sdpa_kernel(PINNED_ATTENTION), torch.cuda.graph(graph, pool=self.pool, stream=self.stream,
                                                             capture_error_mode="thread_local"):
            self.step()
        self.graph = graph
        self.captures += 1
