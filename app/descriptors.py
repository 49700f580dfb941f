"""How many file descriptors the process holds against its limit (``RLIMIT_NOFILE``), for ``/health``.

A process that runs out of descriptors fails every new connection, file and socket at once
(clients see resets and 503s), so ``/health`` reports the use and turns unhealthy once it
reaches ``BART_OPT_FD_UNHEALTHY_FRACTION`` of the soft limit, for the supervisor to restart it
before that happens.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass


@dataclass(frozen=True)
class DescriptorUse:
    """Open descriptors now, and the soft limit (``ulimit -n``)."""

    open: int
    limit: int

    def near_limit(self, fraction: float) -> bool:
        """Whether the use reached `fraction` of the limit."""
        return self.open >= fraction * self.limit


def descriptor_use() -> DescriptorUse | None:
    """This process's descriptor use (None where ``/proc/self/fd`` does not exist: not Linux)."""
    try:
        opened = len(os.listdir("/proc/self/fd")) - 1  # less the one listing the folder
    except OSError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return DescriptorUse(opened, soft if soft != resource.RLIM_INFINITY else 2**31)
