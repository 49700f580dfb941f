"""Where the static search keeps the tensors its decoder step reads: new ones every call, or persistent
buffers that CUDA graphs captured in an earlier call replay against.

A CUDA graph replays its kernels against the addresses it was captured with. For a graph to serve
later calls, every tensor the step reads and writes must live at the same address in every call:
`StaticBuffers` keeps one block of device memory per name (`"cache.kv.3"`, `"beam.running"`, ...) for
the model's life, and a call's tensors are views of those blocks, filled by copying the call's own
values in (`place`). Two shapes asked under one name share the block's start: the buckets of one
call (48 inputs, then 32, ...) are views of the same memory, and a compaction copies the kept rows
out before writing them into the smaller view. A block only grows, when a call needs more than any
before; the graphs that read the old block are dropped then (`on_grow`).

`FreshBuffers` is the same interface for eager runs (off CUDA): `place` hands the tensor back, so
nothing is copied and nothing outlives the call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


class FreshBuffers:
    """The eager search's buffers: the call's own tensors, nothing kept."""

    persistent = False

    def place(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` itself."""
        return tensor

    def empty(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A new uninitialized tensor."""
        return torch.empty(tuple(shape), dtype=dtype, device=device)

    def zeros(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A new tensor of zeros."""
        return torch.zeros(tuple(shape), dtype=dtype, device=device)


class StaticBuffers:
    """One persistent block of `device` memory per name; tensors handed out are views of the blocks.

    `on_grow(name)` is called before a block is replaced by a larger one (everything that recorded the
    old block's address, the CUDA graphs, must go then).
    """

    persistent = True

    def __init__(self, device: torch.device, on_grow: Callable[[str], None] = lambda name: None):
        self.device = device
        self.on_grow = on_grow
        self._blocks: dict[str, torch.Tensor] = {}  # name -> (bytes,) uint8

    def empty(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device | None = None
              ) -> torch.Tensor:
        """The view `shape` of block `name` in `dtype`, uninitialized (what an earlier call left there)."""
        shape = tuple(shape)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        block = self._blocks.get(name)
        if block is None or block.numel() < nbytes:
            if block is not None:
                self.on_grow(name)
                del self._blocks[name], block  # freed before the larger block is made
            block = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=self.device)
            self._blocks[name] = block
        return block[:nbytes].view(dtype).view(shape)

    def zeros(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device | None = None
              ) -> torch.Tensor:
        """The view `shape` of block `name`, set to zeros."""
        return self.empty(name, shape, dtype).zero_()

    def place(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor`'s values in block `name` (a contiguous view of its shape and dtype)."""
        view = self.empty(name, tensor.shape, tensor.dtype)
        view.copy_(tensor)
        return view

    def nbytes(self) -> int:
        """Device memory the blocks hold."""
        return sum(block.numel() for block in self._blocks.values())

    def clear(self) -> None:
        """Free every block."""
        self._blocks.clear()


Buffers = FreshBuffers | StaticBuffers


def from_host(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of `values` (Python values, or a CPU tensor) on `device`, copied there without the host
    waiting for the device (pinned memory and a non-blocking copy on CUDA, where a pageable copy would
    block the host)."""
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
