"""Greedy and beam search with transformers' generation semantics, on bart_opt's memory layout.

The bookkeeping mirrors transformers 5's vectorized beam search step for step (the same
top-k candidates, the same -1e9 masks, the same length-penalty expressions), so the chosen
tokens are identical whenever the logits are. What changes is the state it runs on:
cross-attention keys/values are kept once per input, beam reordering touches only the
self-attention cache, and an input whose result can no longer change leaves the working batch.
Exact mode (`model.exact`) keeps it in the batch, as transformers does: a matrix product's
rounding can depend on its row count, so the other inputs' logits would change in the last bits.

The same mechanism serves cancellation: a caller may pass ``cancelled``, polled between decoder
steps, and the inputs it names stop at that step: they leave the working batch, or in exact
mode stay in it with their result dropped, so that the others' ids remain transformers'.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from bart_opt.errors import InvalidRequest
from bart_opt.engine.inputs import check_inputs
from bart_opt.engine.buffers import from_host
from bart_opt.engine.processors import device_ids, process_scores
from bart_opt.engine.spec import GenerationSpec

Cancelled = Callable[[], Collection[int]]
"""Returns the batch rows (indices into ``input_ids``) whose result is no longer wanted."""


@torch.inference_mode()
def generate(model, input_ids, attention_mask=None, spec: GenerationSpec | None = None, *,
             cancelled: Cancelled | None = None, **kwargs) -> torch.Tensor:
    """Token ids (B, L) as transformers' `generate` returns them for the same weights: bit for bit in
    exact mode (`model.exact`), up to near-ties resolved differently in the default mode.

    Settings come from `spec` when given (then no keyword options are allowed), else they are
    resolved from `kwargs` over the checkpoint's generation config (`Bart.generation_spec`).
    `cancelled`, when given, is called after every decoder step; the rows it returns stop
    there (a row cancelled before it finished comes back as the decoder start token and
    padding) and every other row's ids are the ones an uncancelled call gives (bit for bit in
    exact mode, where cancelled rows stay in the batch; up to near-ties in the default mode,
    where they leave it and the row count of every matrix product changes).
    """
    spec, ids, mask = prepare(model, input_ids, attention_mask, spec, kwargs)
    memory = model.encode(ids, mask)
    cross = model.cross_attention(memory, mask, beams=spec.num_beams)
    del memory  # only the per-layer keys/values are needed from here on
    if spec.num_beams == 1:
        return _greedy(model, ids.shape[0], cross, spec, cancelled)
    return _beam_search(model, ids.shape[0], cross, spec, cancelled)


def prepare(model, input_ids, attention_mask, spec: GenerationSpec | None, kwargs: dict):
    """The call's spec (`spec`, else `kwargs` resolved over the checkpoint's config) and its checked
    inputs: (spec, ids (B, S), mask (B, S) or None). Shared by the default and the static search."""
    if spec is None:
        spec = model.generation_spec(kwargs)
    elif kwargs:
        raise InvalidRequest(sorted(kwargs)[0], "give generation options either as a spec or as keywords, not both")
    ids, mask = check_inputs(model, input_ids, attention_mask)
    return spec, ids, mask


def _cancelled_rows(cancelled: Cancelled | None, items: torch.Tensor) -> torch.Tensor | None:
    """(A,) bool: which working inputs (original rows `items` (A,)) the caller cancelled; None if none."""
    rows = cancelled() if cancelled is not None else ()
    if not rows:
        return None
    return torch.isin(items, from_host(sorted(rows), items.dtype, items.device))


def _stop_hits(tokens: torch.Tensor, cur_len: int, s: GenerationSpec) -> torch.Tensor:
    """Whether appending `tokens` at position `cur_len` ends a sequence (max length or EOS)."""
    hits = torch.full_like(tokens, cur_len + 1 >= s.max_length, dtype=torch.bool)
    if s.eos_token_id is not None:
        hits |= torch.isin(tokens, device_ids(s.eos_token_id, tokens.device))
    return hits


def _unsettled_first(settled: torch.Tensor, left: int) -> torch.Tensor:
    """(left,) the indices of the `left` False entries of `settled` (A,) bool, in order: what
    `(~settled).nonzero()` gives, with the count the host already read instead of a read of its own."""
    return torch.argsort(settled.to(torch.uint8), stable=True)[:left]


def _greedy(model, batch: int, cross, s: GenerationSpec, cancelled: Cancelled | None) -> torch.Tensor:
    device = model.device
    fill = s.pad_token_id if s.pad_token_id is not None else -1
    out = torch.full((batch, s.max_length), fill, dtype=torch.long, device=device)  # (B, L)
    out[:, 0] = s.decoder_start_token_id
    active = torch.arange(batch, device=device)  # (A,) rows of `out` in the working batch
    ended = torch.zeros(batch, dtype=torch.bool, device=device)  # (A,) finished or cancelled (kept in exact mode)
    seqs = out[:, :1].clone()  # (A, cur_len) tokens of the working rows
    cache = model.new_cache(batch, s.max_length - 1)
    cur_len = 1
    while True:
        logits = model.decode_step(seqs[:, -1:], cross, cache)  # (A, V)
        scores = process_scores(seqs, logits, s)
        tokens = scores.argmax(dim=-1)  # (A,)
        out[active, cur_len] = tokens.masked_fill(ended, fill)  # an ended row's output stays padded
        seqs = torch.cat([seqs, tokens[:, None]], dim=1)
        ended |= _stop_hits(tokens, cur_len, s)
        cur_len += 1
        model.log_mem("greedy step %d", cur_len - 1)
        dropped = _cancelled_rows(cancelled, active)
        if dropped is not None:
            rows = out.index_select(0, active)  # (A, L)
            rows[:, 1:].masked_fill_((dropped & ~ended)[:, None], fill)  # cut before they finished
            out.index_copy_(0, active, rows)
            ended |= dropped
        left = int((~ended).sum())  # the step's one read of the device
        if left == 0:
            return out[:, :cur_len]
        if not model.exact and left < ended.shape[0]:
            keep = _unsettled_first(ended, left)  # (A',)
            active, seqs, ended = active[keep], seqs[keep], ended[keep]
            cross.keep(keep)
            cache.keep(keep)


@dataclass
class BeamState:
    """Beam-search state of the A inputs still in the working batch (transformers' layout)."""

    items: torch.Tensor  # (A,) original batch index of each working input
    running: torch.Tensor  # (A, nb, L) running sequences
    running_scores: torch.Tensor  # (A, nb) their summed log-probs
    finished: torch.Tensor  # (A, nb, L) best finished hypotheses
    finished_scores: torch.Tensor  # (A, nb) their length-penalized scores (-1e9 = empty slot)
    finished_lengths: torch.Tensor  # (A, nb) generated tokens per finished hypothesis
    is_finished: torch.Tensor  # (A, nb) slot holds a finished hypothesis
    improvable: torch.Tensor  # (A, 1) transformers' early-stop heuristic not yet satisfied

    def select(self, rows: torch.Tensor) -> None:
        for name in ("items", "running", "running_scores", "finished", "finished_scores",
                     "finished_lengths", "is_finished", "improvable"):
            setattr(self, name, getattr(self, name)[rows])


def init_beams(batch: int, nb: int, s: GenerationSpec, device) -> BeamState:
    eos = s.eos_token_id
    fill = (s.pad_token_id or eos[0]) if eos is not None else -1
    running = torch.full((batch, nb, s.max_length), fill, dtype=torch.long, device=device)
    running[:, :, 0] = s.decoder_start_token_id
    running_scores = torch.zeros((batch, nb), dtype=torch.float, device=device)
    running_scores[:, 1:] = -1e9
    return BeamState(
        items=torch.arange(batch, device=device),
        running=running,
        running_scores=running_scores,
        finished=running.clone(),
        finished_scores=torch.full((batch, nb), -1e9, dtype=torch.float, device=device),
        finished_lengths=torch.zeros((batch, nb), dtype=torch.long, device=device),
        is_finished=torch.zeros((batch, nb), dtype=torch.bool, device=device),
        improvable=torch.ones((batch, 1), dtype=torch.bool, device=device),
    )


class HostLength:
    """The current length (tokens so far, the start token included) as the default's beam step reads
    it: a Python int. The static search reads it from the device instead
    (`bart_opt.engine.static_generation.DeviceLength`, the same methods), so both run one `beam_step`."""

    def __init__(self, spec: GenerationSpec, value: int = 1):
        self.spec, self.value = spec, value

    def advance(self) -> None:
        self.value += 1

    def write(self, seqs: torch.Tensor, tokens: torch.Tensor) -> None:
        """Put `tokens` (A, K) at the current position of `seqs` (A, K, L)."""
        seqs[:, :, self.value] = tokens

    def stop_hits(self, tokens: torch.Tensor) -> torch.Tensor:
        return _stop_hits(tokens, self.value, self.spec)

    def finished_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """Summed log-probs of hypotheses ending here, length-penalized (cur_len generated tokens)."""
        return scores / (self.value**self.spec.length_penalty)

    def best_running(self, scores: torch.Tensor) -> torch.Tensor:
        """The best running scores (A, 1) penalized as transformers' early-stop heuristic does, after `advance`."""
        s = self.spec
        best_len = s.max_length - 1 if s.early_stopping == "never" and s.length_penalty > 0.0 else self.value - 1
        return scores / (best_len**s.length_penalty)

    def lengths_like(self, tokens: torch.Tensor) -> torch.Tensor:
        """Generated tokens of a hypothesis ending here (cur_len + 1 - the start token), shaped like `tokens`."""
        return torch.full_like(tokens, self.value)


def beam_step(st: BeamState, log_probs: torch.Tensor, length: HostLength, s: GenerationSpec) -> torch.Tensor:
    """Advance `st` by one token from processed log-probs (A*nb, V); returns each new running
    beam's parent beam (A, nb). `length` is a `HostLength` or the static search's `DeviceLength`."""
    nb = s.num_beams
    a, vocab = st.running.shape[0], log_probs.shape[-1]
    n_eos = len(s.eos_token_id) if s.eos_token_id is not None else 0
    keep_k = max(2, 1 + n_eos) * nb
    top_mask = torch.arange(keep_k, device=log_probs.device) < nb  # (K,)

    scores = log_probs.view(a, nb, vocab).add_(st.running_scores[:, :, None]).view(a, nb * vocab)  # in place
    topk_scores, topk_index = torch.topk(scores, k=keep_k)  # (A, K)
    parent = topk_index // vocab  # (A, K)
    tokens = topk_index % vocab  # (A, K)
    cand = torch.take_along_dim(st.running, parent[:, :, None], dim=1)  # (A, K, L)
    length.write(cand, tokens)
    hits = length.stop_hits(tokens)  # (A, K)

    # Running beams for the next step: the best nb candidates that did not just end.
    run_scores = topk_scores + hits.to(torch.float32) * -1.0e9
    next_idx = torch.topk(run_scores, k=nb)[1]  # (A, nb)
    st.running = torch.take_along_dim(cand, next_idx[:, :, None], dim=1)
    st.running_scores = torch.take_along_dim(run_scores, next_idx, dim=1)
    parents = torch.take_along_dim(parent, next_idx, dim=1)  # (A, nb)

    # Finished hypotheses: merge the candidates that ended among the top nb into the kept ones.
    just_finished = hits & top_mask[None, :]
    fin_scores = length.finished_scores(topk_scores)
    full = torch.all(st.is_finished, dim=-1, keepdim=True) & (s.early_stopping is True)
    fin_scores += full.to(torch.float32) * -1.0e9
    fin_scores += (~st.improvable).to(torch.float32) * -1.0e9
    fin_scores += (~just_finished) * -1.0e9
    merged_scores = torch.cat((st.finished_scores, fin_scores), dim=1)  # (A, nb + K)
    best = torch.topk(merged_scores, k=nb)[1]  # (A, nb)
    st.finished = torch.take_along_dim(torch.cat((st.finished, cand), dim=1), best[:, :, None], dim=1)
    st.finished_scores = torch.take_along_dim(merged_scores, best, dim=1)
    lengths = length.lengths_like(tokens)
    st.finished_lengths = torch.take_along_dim(torch.cat((st.finished_lengths, lengths), dim=1), best, dim=1)
    st.is_finished = torch.take_along_dim(torch.cat((st.is_finished, just_finished), dim=1), best, dim=1)
    return parents


def update_improvable(st: BeamState, length: HostLength) -> None:
    """transformers' early-stop heuristic, evaluated after `length` was advanced."""
    best_running = length.best_running(st.running_scores[:, :1])
    worst_finished = torch.where(
        st.is_finished, torch.min(st.finished_scores, dim=1, keepdim=True)[0], -1.0e9
    )
    st.improvable = st.improvable & torch.any(best_running > worst_finished, dim=-1, keepdim=True)


def frozen(st: BeamState, s: GenerationSpec) -> torch.Tensor:
    """(A,) bool: inputs whose result is frozen, no candidate being able to enter their finished set any more."""
    return ~st.improvable[:, 0] | (st.is_finished.all(dim=-1) & (s.early_stopping is True))


class BeamRun:
    """The default beam search over one call: its state, and a step that runs on the device up to the
    step's one read (which the loop, `_beam_search`, makes). `bart_opt.bench.step_bytes` runs one step
    of it at real shapes on the `meta` device."""

    def __init__(self, model, batch: int, s: GenerationSpec):
        self.model, self.s = model, s
        nb, device = s.num_beams, model.device
        self.st = init_beams(batch, nb, s, device)
        self.results = self.st.finished[:, 0].clone()  # (B, L) best hypothesis per input, filled as inputs finish
        self.result_lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.settled = torch.zeros(batch, dtype=torch.bool, device=device)  # (A,) result recorded or cancelled
        self.cache = model.new_cache(batch * nb, s.max_length - 1)
        # Every step's (A*nb, V) float32 scores land in buffers made once: a fresh 9.6 MB tensor per
        # step (at the CNN settings) costs more in page faults than writing it (see `Bart.decode_step`).
        vocab = model.config.vocab_size
        self.log_probs = torch.empty(batch * nb, vocab, dtype=torch.float32, device=device)  # (B*nb, V)
        self.logits = None if model.dtype == torch.float32 else torch.empty_like(self.log_probs)  # (B*nb, V)
        self.length = HostLength(s)

    def step(self, cross, cancelled: Cancelled | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder step and its bookkeeping, with no read of the device: (rows, own), each new beam's
        parent row and its own row (A*nb,) each; the cache is reordered by the caller (`reorder`)."""
        model, s, st, length = self.model, self.s, self.st, self.length
        nb, cur_len = s.num_beams, length.value
        a = st.running.shape[0]
        tokens = st.running[:, :, cur_len - 1].reshape(a * nb, 1)  # (A*nb, 1)
        into = None if self.logits is None else self.logits[: a * nb]
        logits = model.decode_step(tokens, cross, self.cache, out=into)  # (A*nb, V)
        log_probs = torch.log_softmax(logits, dim=-1, out=self.log_probs[: a * nb])
        log_probs = process_scores(st.running.view(a * nb, -1)[:, :cur_len], log_probs, s)
        parents = beam_step(st, log_probs, length, s)
        own = torch.arange(a * nb, device=model.device)  # (A*nb,)
        rows = (own.view(a, nb)[:, :1] + parents).flatten()  # (A*nb,) each new beam's parent row
        length.advance()
        update_improvable(st, length)
        model.log_mem("beam step %d", length.value - 1)
        done = frozen(st, s)
        if length.value >= s.max_length:
            done[:] = True
        newly = done & ~self.settled
        # The inputs that settled now take their best hypothesis, written on the device (no mask index).
        items, results, lengths = st.items, self.results, self.result_lengths
        results.index_copy_(0, items, torch.where(newly[:, None], st.finished[:, 0], results.index_select(0, items)))
        lengths.index_copy_(0, items, torch.where(newly, st.finished_lengths[:, 0], lengths.index_select(0, items)))
        self.settled |= done
        dropped = _cancelled_rows(cancelled, items)
        if dropped is not None:
            self.settled |= dropped  # their `results` rows keep the start token and padding they began with
        return rows, own

    def keep(self, inputs: torch.Tensor, cross) -> None:
        """Shrink to the working inputs `inputs` (A',)."""
        nb = self.s.num_beams
        self.st.select(inputs)
        self.settled = self.settled[inputs]
        cross.keep(inputs)
        self.cache.keep((inputs[:, None] * nb + torch.arange(nb, device=inputs.device)).flatten())


def _beam_search(model, batch: int, cross, s: GenerationSpec, cancelled: Cancelled | None) -> torch.Tensor:
    run = BeamRun(model, batch, s)
    while True:
        rows, own = run.step(cross, cancelled)
        # The step's one read of the device: how many cache rows moved, how many inputs are left.
        moved, left = torch.stack(((rows != own).sum(), (~run.settled).sum())).tolist()
        run.cache.reorder(rows, moved=moved)
        if left == 0:
            return run.results[:, : 1 + int(run.result_lengths.max())]
        if not model.exact and left < run.settled.shape[0]:  # exact mode keeps them running, as transformers does
            run.keep(_unsettled_first(run.settled, left), cross)  # (A',)
