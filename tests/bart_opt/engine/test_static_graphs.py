"""The static search's graphs live as long as the model (`bart_opt.engine.graphs.StepGraphs`), shown on the CPU
with a stubbed CUDA graph: a capture records the step's ATen ops and the very tensors they read and
wrote (and runs nothing, as a CUDA capture runs nothing), a replay runs the recorded ops again on those
tensors. A replay therefore computes on the addresses the capture saw, as a CUDA graph does: a later
call is right only if it copied its inputs into the same persistent buffers and its step rebinds
nothing."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bart_opt import Bart
from bart_opt.engine import graphs
from bart_opt.bench.dispatch import tensors_of, is_alias
from bart_opt.engine.buffers import StaticBuffers
from bart_opt.engine.cache import LENGTH_BUCKET
from bart_opt.engine.static_generation import length_span, source_bucket, start_bucket
from tests.bart_opt.reference import batch
from tests.bart_opt.engine.test_generation import CHECKPOINTS


class _Recorder(TorchDispatchMode):
    def __init__(self, ops: list):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not is_alias(func, args, out):  # a view aliases its input, which the ops keep by reference
            self.ops.append((func, args, kwargs, out))
        return out


class RecordedGraph:
    """A stubbed `torch.cuda.CUDAGraph`: the recorded ops, replayed on the recorded tensors."""

    def __init__(self):
        self.ops: list = []
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for func, args, kwargs, out in self.ops:
            fresh = func(*args, **kwargs)
            for recorded, got in zip(tensors_of(out), tensors_of(fresh)):
                if got is not recorded:  # a new tensor: the kernel writes where the capture's output was
                    recorded.copy_(got)


class StubGraphs:
    """`StepGraphs`' backend with the stubbed graph: warm-up runs the step; capture records it on a snapshot
    of the persistent buffers and puts them back (a capture runs nothing); replay replays."""

    pool_bytes = 0

    def __init__(self):
        self.captured: list[RecordedGraph] = []
        self.buffers: StaticBuffers | None = None

    def warm_up(self, step) -> None:
        step()

    def capture(self, step) -> RecordedGraph:
        graph = RecordedGraph()
        saved = [(block, block.clone()) for block in self.buffers._blocks.values()]
        with _Recorder(graph.ops):
            step()
        for block, copy in saved:
            block.copy_(copy)
        self.captured.append(graph)
        return graph

    def replay(self, graph: RecordedGraph, step) -> None:
        graph.replay()

    def reset(self) -> None:
        pass


def stubbed(model: Bart) -> StubGraphs:
    """Give `model` persistent graphs with the stubbed backend (on the CPU, where it takes none)."""
    stub = StubGraphs()
    model._step_graphs = graphs.StepGraphs(model.device, backend=stub)
    stub.buffers = model._step_graphs.buffers
    return stub


@pytest.fixture(scope="module")
def path(make_checkpoint):
    return make_checkpoint(**CHECKPOINTS["base"])


def eager_static(path: str, ids, mask, **options) -> torch.Tensor:
    """The eager static search's ids (a CPU captures no graphs): the same operations on the same shapes as the
    stub's replays, so the same bits (its agreement with transformers: test_static_generation.py)."""
    return Bart.from_pretrained(path, static=True).generate(ids, mask, **options)


LENGTHS = (1, 6, 2, 5, 1, 4, 3, 2)  # 8 inputs of uneven length: they settle at different steps


@pytest.mark.parametrize("beams", [1, 4])
def test_a_repeat_call_captures_nothing_and_its_replays_give_its_own_ids(path, beams):
    model = Bart.from_pretrained(path, static=True)
    stub = stubbed(model)
    options = dict(num_beams=beams, min_length=0, max_length=20)  # one length bucket (19 positions)
    first_ids, first_mask = batch(path, LENGTHS, seed=3)
    first = model.generate(first_ids, first_mask, **options)
    call = model.graph_stats["last_call"]
    assert 2 <= call["captures"] <= math.ceil(math.log2(len(LENGTHS))) + 1, call  # 8, 4, 2, 1 at most
    assert len({key[2] for key in call["keys"]}) == call["captures"], "one graph per row bucket"
    assert torch.equal(first, eager_static(path, first_ids, first_mask, **options))

    ids, mask = batch(path, LENGTHS, seed=4)  # other documents of the same lengths: the same shapes
    before = len(stub.captured)
    got = model.generate(ids, mask, **options)
    call = model.graph_stats["last_call"]
    assert call["captures"] == 0 and len(stub.captured) == before and call["replays"] > 0, call
    assert sum(graph.replays for graph in stub.captured) >= call["replays"]
    expected = eager_static(path, ids, mask, **options)
    assert torch.equal(got, expected), "the replays read this call's inputs from the persistent buffers"
    model._step_graphs = None
    assert torch.equal(model.generate(ids, mask, **options), got), "the eager static search's ids"


def test_a_long_call_adds_a_graph_per_length_bucket_it_reaches(path):
    model = Bart.from_pretrained(path, static=True)
    stubbed(model)
    options = dict(num_beams=2, min_length=70, max_length=80)  # 79 positions: buckets of 32, 64, 80
    ids, mask = batch(path, (3, 5, 2, 4), seed=5)
    got = model.generate(ids, mask, **options)
    call = model.graph_stats["last_call"]
    spans = [key[4] for key in call["keys"]]
    assert spans == sorted(spans) and set(spans) == {32, 64, 80}, spans
    rows = {key[2] for key in call["keys"]}
    assert call["captures"] == len(set(call["keys"])) <= len(rows) + len(set(spans)) - 1
    assert torch.equal(got, eager_static(path, ids, mask, **options))
    assert model.generate(ids, mask, **options).equal(got) and model.graph_stats["last_call"]["captures"] == 0


def test_calls_of_other_sizes_pad_to_the_shared_buckets(path):
    """5 and 6 inputs share the first bucket (6) and the source bucket; the padding rows and positions
    change no real input's ids."""
    model = Bart.from_pretrained(path, static=True)
    stubbed(model)
    options = dict(num_beams=3, min_length=0, max_length=16)
    five = batch(path, (1, 6, 2, 5, 3), seed=6)
    six = batch(path, (6, 2, 5, 1, 4, 3), seed=7)
    assert start_bucket(5) == start_bucket(6) == 6 and source_bucket(five[0].shape[1]) == source_bucket(six[0].shape[1])
    for ids, mask in (five, six):
        got = model.generate(ids, mask, **options)
        assert got.shape[0] == ids.shape[0]
        assert torch.equal(got, eager_static(path, ids, mask, **options))
    first_keys = {key[2] for key in model.graph_stats["last_call"]["keys"]}
    assert 6 in first_keys and model.graph_stats["graphs"] >= 2
    stats = model.graph_stats
    assert stats["buffers_bytes"] > 0 and stats["captures"] == stats["graphs"]


def test_a_buffer_that_grows_drops_the_graphs_that_read_it(path):
    model = Bart.from_pretrained(path, static=True)
    stubbed(model)
    options = dict(num_beams=2, min_length=0, max_length=12)
    small = batch(path, (2, 3), seed=1)
    model.generate(*small, **options)
    assert model.graph_stats["graphs"] > 0
    large = batch(path, (2, 3, 4, 5, 1, 6, 2, 3, 4), seed=2)  # 9 inputs: bucket 12, larger buffers
    got = model.generate(*large, **options)
    assert torch.equal(got, eager_static(path, *large, **options))
    assert all(key[2] <= 12 for key in model._step_graphs._graphs), "the old buckets' graphs went with the old buffers"
    model.release_graphs()
    assert model.graph_stats is None


def test_the_graph_count_is_bounded(path):
    model = Bart.from_pretrained(path, static=True)
    stubbed(model)
    model._step_graphs.max_graphs = 2
    model.generate(*batch(path, LENGTHS, seed=3), num_beams=2, min_length=0, max_length=20)
    assert model.graph_stats["graphs"] == 2 and model.graph_stats["captures"] > 2


def test_buckets():
    assert [start_bucket(n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 33, 48, 49, 100, 128)] == \
        [1, 2, 3, 4, 6, 6, 8, 8, 12, 48, 48, 64, 128, 128]
    assert [source_bucket(n) for n in (1, 16, 17, 33, 48, 49, 65, 700, 1024)] == [16, 16, 32, 48, 48, 64, 96, 768, 1024]
    assert all(source_bucket(n) % 16 == 0 for n in range(1, 1025))
    assert [length_span(t, 144) for t in (1, 32, 33, 64, 129, 141)] == [32, 32, 64, 64, 144, 144]
    assert LENGTH_BUCKET % 16 == 0
