"""Greedy and beam search at fixed shapes, with no host syncs between checks (`Bart.static`).

The default search (`bart_opt.engine.generation`) reads the device once a decoder step (how many cache rows
a beam step moved, how many inputs are left). On a GPU each read stalls the host until the GPU is
idle, and every step's few hundred kernels are launched one by one. The static search keeps
everything a step decides on the device, so that steps can be queued without waiting, and on CUDA
each step is one replay of a CUDA graph the model keeps for its life (`bart_opt.engine.graphs`):

* rows are bucketed: an input that finished stays in the working batch, masked (its result is
  recorded on the device when it settles), until the unsettled inputs fit a smaller bucket (a power
  of two); then the batch is compacted, at a check, where the host reads the device anyway. With
  CUDA graphs a call's inputs are first padded to a shared bucket (`start_bucket`, `source_bucket`:
  padding rows and positions are masked and their outputs dropped) and copied into the model's
  persistent buffers (`bart_opt.engine.buffers`), so that later calls replay the same graphs;
* the current length lives on the device (`DeviceLength`), and with it the positions, the
  min-length and forced-token conditions (`bart_opt.engine.processors.DeviceProcessors`) and the
  length-penalty divisors (a table made once per call); the host keeps its own count of the steps
  it queued, which sets how far a step reads the self-attention cache (`length_span`);
* the self-attention cache reads a beam's history through a table inside attention, as far as it
  is filled rounded up to `bart_opt.engine.cache.LENGTH_BUCKET` (`bart_opt.engine.cache.StaticKVCache`): a beam
  step copies nothing; cross-attention is one call for the batch with an additive mask made once
  (`bart_opt.engine.cross_attention.StaticCrossAttention`; with EL-attention one call over the single copy
  of the encoder output, `bart_opt.engine.el_attention.BatchedELCrossAttention`);
* the n-gram ban is a dense scatter (`bart_opt.engine.processors.ban_repeated_ngrams_dense`);
* whether every input is done is read every `CHECK_EVERY` steps, once EOS is allowed.

The beam bookkeeping is the default's own (`bart_opt.engine.generation.beam_step`, run on a
`DeviceLength`), so the scores are the same expressions. Its layout is the default's off the CPU
(one attention call for the batch, padded keys masked) on every device. What differs from the
default in the arithmetic: self-attention attends over the positions of all of an input's beams
(masked to each beam's own history) and over up to 31 unwritten positions (masked), where the
default attends over the written positions of the row only (the kernel rounds differently in the
last bits), and finished inputs stay in the matrix products until the next bucket. Its ids are the
default's up to near-ties resolved differently (docs/gpu.md publishes how often).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import fields

import torch

from bart_opt.engine.buffers import Buffers, FreshBuffers, from_host
from bart_opt.engine.cache import LENGTH_BUCKET, STATIC_ALIGN, StaticKVCache, round_up
from bart_opt.engine.generation import BeamState, Cancelled, beam_step, frozen, init_beams, prepare, update_improvable
from bart_opt.engine.graphs import StepGraphs, step_graphs
from bart_opt.engine.memory import format_bytes
from bart_opt.engine.processors import DeviceProcessors, device_ids
from bart_opt.engine.spec import GenerationSpec

CHECK_EVERY = 4
"""Decoder steps between two reads of "is every input done" (the static search's only sync in its loop).

Each read drains the GPU's queue: the host waits for the last step, then has to queue the next
one before the GPU has work again, a bubble of one graph launch and the host's bookkeeping (tens
of microseconds). Reading less often wastes steps instead: after the last input settles, up to
k - 1 steps run for nothing, and a bucket change waits up to k - 1 steps. A decoder step at
bart-large shape costs milliseconds on an H200 and a bubble tens of microseconds, so the smallest
k the issue allows wins: 4 (at most 3 wasted steps a call, against ~80 steps of work; docs/gpu.md)."""


class DeviceLength:
    """The current length (tokens so far, the start token included) on the device, (1,) long,
    with `bart_opt.engine.generation.HostLength`'s methods, so that `beam_step` runs on it unchanged.

    The length penalty `t ** length_penalty` is computed for every length once (as the default
    computes it, a Python float, then float32) and divided by as the default's Python-scalar
    division rounds: on a CPU a float32 division; on CUDA, where torch multiplies by the float32
    reciprocal of a scalar divisor, a multiplication by that reciprocal.
    """

    def __init__(self, spec: GenerationSpec, device: torch.device, buffers: Buffers | None = None):
        b = buffers if buffers is not None else FreshBuffers()
        self.spec = spec
        self.value = b.place("length.value", torch.ones(1, dtype=torch.long, device=device))  # (1,)
        lp = spec.length_penalty
        powers = torch.tensor([float(t) ** lp if t else 1.0 for t in range(spec.max_length + 1)]).float()  # (L+1,)
        self._reciprocal = device.type == "cuda"
        divisors = from_host(1.0 / powers if self._reciprocal else powers, torch.float32, device)  # (L+1,)
        self._divisors = b.place("length.divisors", divisors)
        self.eos = None if spec.eos_token_id is None else b.place(
            "length.eos", device_ids(spec.eos_token_id, device))  # (E,)

    def advance(self) -> None:
        self.value += 1

    def write(self, seqs: torch.Tensor, tokens: torch.Tensor) -> None:
        """Put `tokens` (A, K) at the current position of `seqs` (A, K, L)."""
        seqs.index_copy_(2, self.value, tokens[..., None])

    def stop_hits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Whether appending `tokens` (any shape) at the current position ends a sequence (max length or EOS)."""
        hits = (self.value >= self.spec.max_length - 1).expand(tokens.shape)
        if self.eos is None:
            return hits
        return hits | (tokens[..., None] == self.eos).any(dim=-1)

    def _penalized(self, scores: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        divisor = self._divisors.index_select(0, length)  # (1,)
        return scores * divisor if self._reciprocal else scores / divisor

    def finished_scores(self, scores: torch.Tensor) -> torch.Tensor:
        return self._penalized(scores, self.value)

    def best_running(self, scores: torch.Tensor) -> torch.Tensor:
        s = self.spec
        if s.early_stopping == "never" and s.length_penalty > 0.0:  # a constant: the default's own division
            return scores / ((s.max_length - 1) ** s.length_penalty)
        return self._penalized(scores, self.value - 1)

    def lengths_like(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.value.expand(tokens.shape)


def bucket(inputs: int, size: int) -> int:
    """The bucket (working inputs) for `inputs` unsettled ones in a batch of `size` now: the smallest power
    of two that holds them, or `size` itself when that is not smaller."""
    return min(size, 1 << max(inputs - 1, 0).bit_length())


def start_bucket(inputs: int) -> int:
    """The first row bucket of a call of `inputs` inputs with CUDA graphs: the smallest power of two or
    three times one that holds them (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, ...), so that
    calls of every size share a few graphs and the benchmark's 8, 48 and 128 inputs pad nothing; the
    buckets after it are powers of two (`bucket`): at most ceil(log2(inputs)) + 1 in a call."""
    power = 1 << max(inputs - 1, 0).bit_length()
    return 3 * power // 4 if power >= 4 and 3 * power // 4 >= inputs else power


def source_bucket(length: int) -> int:
    """The source length a call of `length` input positions is padded to with CUDA graphs: the smallest of
    16, 32, 48, 64, 96, 128, ... (a power of two or 1.5 times one, a multiple of `STATIC_ALIGN`) that holds it; at most
    1.5x the positions, and one graph set for all lengths within a bucket (1,024 is one)."""
    power = max(STATIC_ALIGN, 1 << max(length - 1, 0).bit_length())
    return 3 * power // 4 if power >= 4 * STATIC_ALIGN and 3 * power // 4 >= length else power


def length_span(cur_len: int, cache_length: int) -> int:
    """Positions a step at `cur_len` tokens reads of a cache of `cache_length`: the filled part (`cur_len`
    positions, the one this step writes included) rounded up to `LENGTH_BUCKET`."""
    return min(cache_length, round_up(cur_len, LENGTH_BUCKET))


class _Search(ABC):
    """What the greedy and beam searches share: the model's decoder state at fixed shapes.

    `step()` runs one decoder step entirely on the device and updates every tensor it reads in
    place (a CUDA graph replays it against the addresses it was captured with); every such tensor
    comes from `buffers` (persistent ones with CUDA graphs, `bart_opt.engine.buffers`). Everything else
    (`at`, `cancel`, `done`, `compact`, `result`) runs between steps, on the host's schedule.

    `batch` inputs are the call's; `size` >= `batch` rows of inputs are in the padded batch (the rows
    past `batch` are padding, settled from the start); `source` is the padded source length.
    """

    beams = 1

    def __init__(self, model, batch: int, size: int, source: int, cross, spec: GenerationSpec, buffers: Buffers):
        self.model, self.cross, self.spec, self.batch, self.buffers = model, cross, spec, batch, buffers
        self.source, self.rows0 = source, size
        device = model.device
        self.items = torch.arange(size, device=device)  # (A,) original batch index of each working input
        self.length = DeviceLength(spec, device, buffers)
        self.procs = DeviceProcessors(spec, model.config.vocab_size, device, buffers)
        c = model.config
        self.cache = StaticKVCache(c.decoder_layers, size * self.beams, c.decoder_attention_heads, spec.max_length - 1,
                                   c.d_model // c.decoder_attention_heads, dtype=model.dtype, device=device,
                                   beams=self.beams, buffers=buffers)
        self._buffers()

    def _buffers(self) -> None:
        """Half-precision logits are widened into one float32 buffer per bucket (see `Bart.decode_step`)."""
        rows = self.items.shape[0] * self.beams
        vocab = self.model.config.vocab_size
        self.logits = None if self.model.dtype == torch.float32 else self.buffers.empty(
            "logits", (rows, vocab), torch.float32, self.model.device)  # (A*nb, V)

    def _done_from_start(self) -> torch.Tensor:
        """(A,) bool: the padding rows (past `batch`), done before the first step."""
        return torch.arange(self.rows0, device=self.model.device) >= self.batch

    @property
    def size(self) -> int:
        """Working inputs (the bucket)."""
        return self.items.shape[0]

    def at(self, cur_len: int):
        """Prepare the step at `cur_len` tokens (the host's count): how far it reads the cache. Returns the
        step's shape, the key of its CUDA graph: everything the step's work depends on."""
        self.cache.span = span_ = length_span(cur_len, self.cache.length)
        return (self.spec, self.model.el_attention, self.size, self.source, span_)

    @abstractmethod
    def step(self) -> None:
        """One decoder step for every working input, on the device."""

    @abstractmethod
    def done(self) -> torch.Tensor:
        """(A,) bool: the working inputs whose result is final (settled, ended or cancelled)."""

    @abstractmethod
    def _select(self, order: torch.Tensor) -> None:
        """Keep the working inputs `order` (A',) in that order: the search's own state."""

    @abstractmethod
    def _cancel(self, dropped: torch.Tensor) -> None:
        """Stop the working inputs `dropped` (A,) bool."""

    @abstractmethod
    def record(self) -> None:
        """Copy the working inputs' results into the call's output (a settled one's is final)."""

    @abstractmethod
    def result(self) -> torch.Tensor:
        """The call's output ids (B, L'), L' as long as the longest result."""

    def _keep(self, name: str, tensor: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        """`tensor`'s rows `order`, in buffer `name`."""
        return self.buffers.place(name, tensor.index_select(0, order))

    def compact(self, size: int, settled: torch.Tensor) -> None:
        """Shrink the working batch to `size` inputs, the unsettled ones (`settled` (A,) False) first;
        the others that fill the bucket are settled, so nothing they compute is recorded."""
        self.record()
        order = torch.argsort(settled.to(torch.uint8), stable=True)[:size]  # (A',) unsettled first: no host read
        self.items = self.items.index_select(0, order)
        self._select(order)
        self.cross.keep(order)
        nb = self.beams
        self.cache.keep((order[:, None] * nb + torch.arange(nb, device=order.device)).flatten())
        self._buffers()

    def cancel(self, rows: set[int]) -> None:
        """Stop the original batch rows `rows` (not yet cancelled) at this step, as the default does."""
        marked = from_host([r in rows for r in range(self.rows0)], torch.bool, self.items.device)  # (B,)
        self._cancel(marked[self.items])  # (A,)


class GreedySearch(_Search):
    """Greedy search at fixed shapes: an ended row keeps decoding, its output masked, until it leaves
    with its bucket; `ended_at` records where the call's output may end."""

    def __init__(self, model, batch: int, size: int, source: int, cross, spec: GenerationSpec, buffers: Buffers):
        super().__init__(model, batch, size, source, cross, spec, buffers)
        device = model.device
        self.fill = spec.pad_token_id if spec.pad_token_id is not None else -1
        self.out = torch.full((size, spec.max_length), self.fill, dtype=torch.long, device=device)  # (B, L)
        self.out[:, 0] = spec.decoder_start_token_id
        b = buffers
        self.seqs = b.place("greedy.seqs", self.out.clone())  # (A, L) the working rows' outputs
        padding = self._done_from_start()
        self.ended = b.place("greedy.ended", padding)  # (A,) finished or cancelled
        self.ended_at = b.place("greedy.ended_at", padding.long())  # (A,) length when it ended (padding: 1)
        self.out_ended_at = torch.zeros(size, dtype=torch.long, device=device)  # (B,)

    def step(self) -> None:
        length = self.length
        tokens = self.seqs.index_select(1, length.value - 1).clamp_(min=0)  # (A, 1); an ended row's padding may be -1
        logits = self.model.decode_step(tokens, self.cross, self.cache, out=self.logits)  # (A, V)
        next_tokens = self.procs(self.seqs, length.value, logits).argmax(dim=-1)  # (A,)
        self.seqs.index_copy_(1, length.value, next_tokens.masked_fill(self.ended, self.fill)[:, None])
        hits = length.stop_hits(next_tokens)  # (A,)
        length.advance()
        torch.where(hits & ~self.ended, length.value, self.ended_at, out=self.ended_at)
        self.ended |= hits

    def done(self) -> torch.Tensor:
        return self.ended

    def _select(self, order: torch.Tensor) -> None:
        self.seqs = self._keep("greedy.seqs", self.seqs, order)
        self.ended = self._keep("greedy.ended", self.ended, order)
        self.ended_at = self._keep("greedy.ended_at", self.ended_at, order)

    def _cancel(self, dropped: torch.Tensor) -> None:
        cut = dropped & ~self.ended  # (A,) rows stopped before they finished: start token and padding
        self.seqs[:, 1:].masked_fill_(cut[:, None], self.fill)
        torch.where(cut, self.length.value, self.ended_at, out=self.ended_at)
        self.ended |= dropped

    def record(self) -> None:
        self.out.index_copy_(0, self.items, self.seqs)
        self.out_ended_at.index_copy_(0, self.items, self.ended_at)

    def result(self) -> torch.Tensor:
        self.record()
        return self.out[: self.batch, : int(self.out_ended_at[: self.batch].max())]


_BEAM_FIELDS = tuple(f.name for f in fields(BeamState) if f.name != "items")
"""The beam state a step reads and writes (`items` is the host's bookkeeping, not the step's)."""


class BeamSearch(_Search):
    """Beam search at fixed shapes: `generation.BeamState` for the working inputs, plus which are
    settled and their results, recorded on the device when they settle."""

    def __init__(self, model, batch: int, size: int, source: int, cross, spec: GenerationSpec, buffers: Buffers):
        self.beams = spec.num_beams
        super().__init__(model, batch, size, source, cross, spec, buffers)
        device = model.device
        b = buffers
        st = init_beams(size, self.beams, spec, device)
        for name in _BEAM_FIELDS:
            setattr(st, name, b.place(f"beam.{name}", getattr(st, name)))
        self.st = st
        self.settled = b.place("beam.settled", self._done_from_start())  # (A,) result recorded or cancelled
        self.results = b.place("beam.results", st.finished[:, 0].clone())  # (A, L) best hypothesis once settled
        self.result_lengths = b.place("beam.result_lengths", torch.zeros(size, dtype=torch.long, device=device))
        self.out, self.out_lengths = self.results.clone(), self.result_lengths.clone()  # (B, L), (B,)

    def _buffers(self) -> None:
        super()._buffers()
        a, nb = self.items.shape[0], self.beams
        device = self.model.device
        self.log_probs = self.buffers.empty("beam.log_probs", (a * nb, self.model.config.vocab_size), torch.float32,
                                            device)  # (A*nb, V)
        self.first_rows = self.buffers.place("beam.first_rows", torch.arange(a, device=device)[:, None] * nb)  # (A, 1)

    def step(self) -> None:
        st, s, length = self.st, self.spec, self.length
        a, nb = st.running.shape[:2]
        seqs = st.running.view(a * nb, -1)  # (A*nb, L)
        tokens = seqs.index_select(1, length.value - 1)  # (A*nb, 1)
        logits = self.model.decode_step(tokens, self.cross, self.cache, out=self.logits)  # (A*nb, V)
        log_probs = torch.log_softmax(logits, dim=-1, out=self.log_probs)
        log_probs = self.procs(seqs, length.value, log_probs)
        work = copy.copy(st)  # `beam_step` rebinds its state's fields; `st`'s tensors take the results in place
        parents = beam_step(work, log_probs, length, s)  # (A, nb)
        self.cache.reorder((self.first_rows + parents).flatten())
        length.advance()
        update_improvable(work, length)
        done = frozen(work, s) | (length.value >= s.max_length)  # (A,)
        newly = done & ~self.settled
        torch.where(newly[:, None], work.finished[:, 0], self.results, out=self.results)
        torch.where(newly, work.finished_lengths[:, 0], self.result_lengths, out=self.result_lengths)
        self.settled |= done
        for name in _BEAM_FIELDS:
            getattr(st, name).copy_(getattr(work, name))

    def done(self) -> torch.Tensor:
        return self.settled

    def _select(self, order: torch.Tensor) -> None:
        for name in _BEAM_FIELDS:
            setattr(self.st, name, self._keep(f"beam.{name}", getattr(self.st, name), order))
        self.settled = self._keep("beam.settled", self.settled, order)
        self.results = self._keep("beam.results", self.results, order)
        self.result_lengths = self._keep("beam.result_lengths", self.result_lengths, order)

    def _cancel(self, dropped: torch.Tensor) -> None:
        self.settled |= dropped  # their results keep the start token and padding they began with

    def record(self) -> None:
        self.out.index_copy_(0, self.items, self.results)
        self.out_lengths.index_copy_(0, self.items, self.result_lengths)

    def result(self) -> torch.Tensor:
        self.record()
        return self.out[: self.batch, : 1 + int(self.out_lengths[: self.batch].max())]


def pad_batch(ids: torch.Tensor, mask: torch.Tensor | None, rows: int, length: int, pad_token_id: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) inputs padded to (rows, length): padded positions masked, padding rows one real token each
    (a pad id at position 0) so that attention over them stays finite; their outputs are dropped."""
    b, s = ids.shape
    out = ids.new_full((rows, length), pad_token_id)  # (rows, length)
    out[:b, :s] = ids
    keep = torch.zeros((rows, length), dtype=torch.long, device=ids.device)
    keep[:b, :s] = 1 if mask is None else mask
    keep[b:, 0] = 1
    return out, keep


@torch.inference_mode()
def generate_static(model, input_ids, attention_mask=None, spec: GenerationSpec | None = None, *,
                    cancelled: Cancelled | None = None, **kwargs) -> torch.Tensor:
    """`bart_opt.engine.generation.generate` through the static search: the same settings, options and
    `cancelled` semantics (polled after every step; the rows it names stop there and come back as
    the start token and padding), the same ids up to near-ties resolved differently.

    On CUDA the steps replay the model's CUDA graphs (`bart_opt.engine.graphs.step_graphs`): the call holds
    their lock, pads its inputs to the graphs' buckets and copies them into the persistent buffers.
    """
    spec, ids, mask = prepare(model, input_ids, attention_mask, spec, kwargs)
    graphs = step_graphs(model)
    if graphs is None:
        return _search(model, ids, mask, spec, cancelled, FreshBuffers(), None)
    with graphs.lock:
        graphs.begin_call()
        try:
            return _search(model, ids, mask, spec, cancelled, graphs.buffers, graphs)
        finally:
            model.log_mem("static graphs: %s", _graph_summary(graphs))


def _graph_summary(graphs: StepGraphs) -> str:
    """The memory log's row after a call with graphs: this call's captures, and what the model holds."""
    stats, call = graphs.stats(), graphs.last_call
    return (f"{call.get('captures', 0)} captured this call ({call.get('capture_s', 0.0):.2f} s, "
            f"{len(call.get('keys', []))} shapes), {stats['graphs']} held, pool {format_bytes(stats['pool_bytes'])}, "
            f"buffers {format_bytes(stats['buffers_bytes'])}")


def _search(model, ids: torch.Tensor, mask: torch.Tensor | None, spec: GenerationSpec, cancelled: Cancelled | None,
            buffers: Buffers, graphs: StepGraphs | None) -> torch.Tensor:
    batch = ids.shape[0]
    if buffers.persistent:
        ids, mask = pad_batch(ids, mask, start_bucket(batch), source_bucket(ids.shape[1]), model.config.pad_token_id)
    memory = model.encode(ids, mask)
    cross = model.cross_attention(memory, mask, beams=spec.num_beams, buffers=buffers)
    del memory  # only the cross-attention state is needed from here on (with EL-attention, a view of it)
    search = (GreedySearch if spec.num_beams == 1 else BeamSearch)(model, batch, ids.shape[0], ids.shape[1], cross,
                                                                     spec, buffers)
    # No input can settle before EOS is allowed: the first check waits for it.
    first_check = spec.min_length + 1 if spec.eos_token_id is not None and spec.min_length > 0 else 2
    stopped: set[int] = set()
    cur_len = 1  # the host's copy of `search.length`: it knows how many steps it queued
    while True:
        key = search.at(cur_len)
        if graphs is None:
            search.step()
        else:
            graphs.run(key, search.step)
        cur_len += 1
        if cancelled is not None:
            rows = {r for r in cancelled() if 0 <= r < batch} - stopped
            if rows:
                search.cancel(rows)
                stopped |= rows
        if cur_len >= spec.max_length or len(stopped) == batch:
            return search.result()
        if cur_len >= first_check and (cur_len - first_check) % CHECK_EVERY == 0:
            model.log_mem("static step %d", cur_len - 1)
            settled = search.done()
            left = int((~settled).sum())  # the loop's one host read, every CHECK_EVERY steps
            if left == 0:
                return search.result()
            size = bucket(left, search.size)
            if size < search.size:
                search.compact(size, settled)
