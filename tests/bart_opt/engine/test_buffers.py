"""The static search's buffers (`bart_opt.engine.buffers`): persistent blocks whose views keep their address from call
to call, grow only (telling whoever recorded the old address), and the eager kind that keeps nothing."""

from __future__ import annotations

import torch

from bart_opt.engine.buffers import FreshBuffers, StaticBuffers, from_host


def test_a_name_keeps_its_address_and_shapes_share_the_block():
    grown = []
    buffers = StaticBuffers(torch.device("cpu"), on_grow=grown.append)
    first = buffers.place("x", torch.arange(12.0).view(3, 4))
    again = buffers.place("x", torch.ones(3, 4))
    smaller = buffers.empty("x", (2, 4), torch.float32)
    assert first.data_ptr() == again.data_ptr() == smaller.data_ptr() and torch.equal(first, torch.ones(3, 4))
    as_ints = buffers.zeros("x", (6,), torch.int16)  # another dtype over the same bytes
    assert as_ints.data_ptr() == first.data_ptr() and grown == []
    assert buffers.nbytes() == 48
    larger = buffers.place("x", torch.full((4, 4), 2.0))
    assert grown == ["x"] and torch.equal(larger, torch.full((4, 4), 2.0)) and buffers.nbytes() == 64
    buffers.place("y", torch.zeros(2, dtype=torch.long))
    assert buffers.nbytes() == 80
    buffers.clear()
    assert buffers.nbytes() == 0


def test_fresh_buffers_hand_tensors_back():
    t = torch.arange(3)
    fresh = FreshBuffers()
    assert fresh.place("x", t) is t and fresh.zeros("x", (2,), torch.float32, torch.device("cpu")).sum() == 0
    assert not fresh.persistent and StaticBuffers(torch.device("cpu")).persistent


def test_from_host_makes_a_device_tensor_of_python_values_or_a_cpu_tensor():
    assert from_host([1, 2], torch.long, torch.device("cpu")).tolist() == [1, 2]
    assert from_host(torch.tensor([0.5]), torch.float16, torch.device("meta")).dtype == torch.float16
