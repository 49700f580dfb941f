"""The profile summary (`bart_opt.bench.profiling`): launches counted, GPU-busy time as a union of intervals."""

from __future__ import annotations

import torch

from bart_opt.bench.profiling import profile_call, summarize


def test_busy_time_is_the_union_of_the_kernels_intervals():
    host = ["cudaLaunchKernel", "aten::mm", "cudaGraphLaunch", "cudaLaunchKernel", "cudaStreamSynchronize"]
    device = [("gemm", 0.0, 10.0), ("softmax", 5.0, 12.0), ("gemm", 20.0, 30.0), ("copy", 29.0, 29.5)]
    s = summarize(host, device, wall_s=100e-6)
    assert s["launches"] == 3 and s["launch_calls"] == {"cudaLaunchKernel": 2, "cudaGraphLaunch": 1}
    assert s["kernels"] == 4
    assert abs(s["gpu_busy_s"] - 22e-6) < 1e-12 and abs(s["gpu_busy_fraction"] - 0.22) < 1e-9
    assert [k["name"] for k in s["top_kernels"]] == ["gemm", "softmax", "copy"]
    assert abs(s["top_kernels"][0]["seconds"] - 20e-6) < 1e-12


def test_off_cuda_there_is_no_profile():
    assert profile_call(lambda: torch.ones(3).sum(), torch.device("cpu")) is None
