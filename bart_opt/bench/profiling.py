"""Kernel launches, GPU-busy time and the top kernels of one call, from torch.profiler (CUDA only).

- launches: the host's launch calls (`cudaLaunchKernel` and its variants, `cudaGraphLaunch`, and
  the async copies and memsets), what the host spends its time queuing;
- kernels: what ran on the GPU (kernels, copies and memsets, those a graph replayed included);
- GPU-busy seconds: the union of the intervals in which any of them ran, against the call's wall
  time: the rest is the GPU waiting for the host.

Off CUDA there is no GPU timeline: `profile_call` returns None and the benches print "n/a".
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable

import torch

LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                          "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync"})
TOP_KERNELS = 8


def summarize(host_calls: Iterable[str], device_events: Iterable[tuple[str, float, float]], wall_s: float) -> dict:
    """The figures from the host's runtime calls (names) and the GPU's events (name, start, end in µs)."""
    launches = Counter(name for name in host_calls if name in LAUNCH_CALLS)
    spans = sorted((start, end) for _, start, end in device_events)
    busy_us, reach = 0.0, float("-inf")
    for start, end in spans:  # the union of the intervals
        if end > reach:
            busy_us += end - max(start, reach)
            reach = end
    per_kernel: Counter = Counter()
    for name, start, end in device_events:
        per_kernel[name] += end - start
    return {
        "launches": sum(launches.values()), "launch_calls": dict(launches), "kernels": len(spans),
        "gpu_busy_s": busy_us / 1e6, "wall_s": wall_s, "gpu_busy_fraction": busy_us / 1e6 / wall_s if wall_s else None,
        "top_kernels": [{"name": name[:120], "seconds": us / 1e6} for name, us in per_kernel.most_common(TOP_KERNELS)],
    }


def profile_call(fn: Callable[[], object], device: torch.device) -> dict | None:
    """`summarize` of one call of `fn` on a CUDA `device`, profiled; None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        wall_s = time.perf_counter() - start
    events = prof.events()
    host = [e.name for e in events if e.device_type == DeviceType.CPU]
    gpu = [(e.name, e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA]
    return summarize(host, gpu, wall_s)
