"""Benchmarks and the self-check that ship with bart-opt (`bart-opt bench`, `bart-opt check`).

Nothing in the library imports this package; it measures the library from outside:

- `vs_transformers`: memory and speed against transformers (`bart-opt bench`, `python -m bart_opt.bench`);
- `vs_peers`: against other engines, CTranslate2 (`bart-opt bench --peers ctranslate2`), through `engines`;
- `fidelity`: how often each mode's ids equal transformers', and the score gaps where they differ;
- `batching`, `evaluation`, `cluster`: the pipeline's planner, its overlap, and Ray replicas;
- `service_jobs`, `service_load`: the HTTP service's jobs and micro-batching under load;
- `primitive_cache`: the default mode's RSS and speed with oneDNN's primitive caches bounded or not;
- `check`: the offline self-check of a machine (`bart-opt check`);
- `device` (with `device_tasks`, run in processes of their own): the check a lent GPU machine runs in one
  command within one budget (environment, correctness gates, speed, profiles, probes, CUDA tests);
- `dispatch`, `step_bytes`, `cache_read`, `profiling`: the ATen ops, host syncs (hidden ones included)
  and bytes moved per step of each search, the bytes per step at real shapes on the meta device, the
  cache read, and kernel launches and GPU-busy time from torch.profiler;
- `workloads`: the shapes and settings they share.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """`bart-opt bench`: the memory and speed benchmark (see `bart_opt.bench.vs_transformers`)."""
    from bart_opt.bench.vs_transformers import main as bench_main

    return bench_main(argv)
