"""Logits processing for BART generation, applied in transformers' order:
no-repeat n-gram, minimum length, forced BOS, forced EOS."""

from __future__ import annotations

import functools

import torch

from bart_opt.engine import hardware  # `host_reads_are_free` read through the module: the dispatch bench forces it
from bart_opt.engine.buffers import FreshBuffers, from_host


def ban_repeated_ngrams(seqs: torch.Tensor, scores: torch.Tensor, n: int) -> torch.Tensor:
    """Forbid tokens that would complete an n-gram already present in `seqs` (N, T); scores (N, V),
    changed in place.

    Only the banned entries are written. Building a (N, V) mask of them and filling the scores through
    it cost two passes over the scores per step, for the same result: 2.4 ms of a beam step at the
    CNN settings on one CPU thread, against 0.05 ms."""
    cur_len = seqs.shape[1]
    if cur_len < n:
        return scores
    prefix = seqs[:, cur_len + 1 - n :]  # (N, n-1) the n-gram the next token would complete
    windows = seqs.unfold(1, n, 1)  # (N, W, n) every n-gram so far
    last = windows[..., -1]  # (N, W) the token that completed each n-gram
    matches = (windows[..., :-1] == prefix[:, None, :]).all(dim=-1)  # (N, W)
    rows, at = matches.nonzero(as_tuple=True)  # (K,) each
    scores[rows, last[rows, at]] = -float("inf")
    return scores


@functools.lru_cache(maxsize=64)
def device_ids(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """(len(ids),) long on `device`, made once per ids and device: indexing with the Python list (or
    `torch.tensor(ids, device=...)` at every step) is a blocking copy from the host on a GPU."""
    return from_host(list(ids), torch.long, device)


def force_token(scores: torch.Tensor, token_ids) -> torch.Tensor:
    """Every token -inf except `token_ids` (an id, or several as a list or tuple), which get 0; scores
    (N, V), overwritten in place."""
    scores.fill_(-float("inf"))
    if isinstance(token_ids, int):
        scores[:, token_ids] = 0
    else:
        scores.index_fill_(1, device_ids(tuple(token_ids), scores.device), 0)
    return scores


def process_scores(seqs: torch.Tensor, scores: torch.Tensor, s) -> torch.Tensor:
    """Apply the processors `s` (a `GenerationSpec`) asks for to next-token scores (N, V).

    `scores` is changed in place (the caller passes scores it owns): at the CNN settings a
    (48, 50,265) float32 copy per processor and step is a fresh 9.6 MB allocation, paid in page
    faults, for the same numbers."""
    cur_len = seqs.shape[1]
    if s.no_repeat_ngram_size > 0:
        if hardware.host_reads_are_free(scores.device):  # only the banned entries written (a `nonzero`)
            scores = ban_repeated_ngrams(seqs, scores, s.no_repeat_ngram_size)
        else:  # the same scores with no read of the device
            length = torch.full((1,), cur_len, dtype=torch.long, device=seqs.device)  # (1,)
            scores = ban_repeated_ngrams_dense(seqs, length, scores, s.no_repeat_ngram_size)
    if s.eos_token_id is not None and s.min_length > 0 and cur_len < s.min_length:
        scores.index_fill_(1, device_ids(s.eos_token_id, scores.device), -float("inf"))
    if s.forced_bos_token_id is not None and cur_len == 1:
        scores = force_token(scores, s.forced_bos_token_id)
    if s.forced_eos_token_id is not None and cur_len == s.max_length - 1:
        scores = force_token(scores, s.forced_eos_token_id)
    return scores


def ban_repeated_ngrams_dense(seqs: torch.Tensor, cur_len: torch.Tensor, scores: torch.Tensor, n: int) -> torch.Tensor:
    """`ban_repeated_ngrams` at fixed shapes, with no `nonzero` (no host sync): `seqs` (N, L) holds
    `cur_len` (1,) tokens so far and anything after them; scores (N, V), changed in place.

    Every n-gram window of the whole buffer is compared with the prefix the next token would
    complete; windows past `cur_len` are masked out. The token completing each window gets
    -inf (a match) or 0 added by one scatter over the (N, L - n + 1) windows: adding 0 leaves a
    score as it is, and -inf wins whatever else lands on the same entry, in any order."""
    if seqs.shape[1] < n:  # no n-gram fits the buffer
        return scores
    windows = seqs.unfold(1, n, 1)  # (N, W, n) every n-gram of the buffer
    prefix_at = (cur_len + torch.arange(1 - n, 0, device=seqs.device)).clamp_(min=0)  # (n-1,) positions
    prefix = seqs.index_select(1, prefix_at)  # (N, n-1) the n-gram the next token would complete
    written = torch.arange(windows.shape[1], device=seqs.device) <= cur_len - n  # (W,) windows inside cur_len
    matches = (windows[..., :-1] == prefix[:, None, :]).all(dim=-1) & written  # (N, W)
    banned = torch.zeros(matches.shape, dtype=scores.dtype, device=scores.device).masked_fill_(matches, -torch.inf)
    return scores.scatter_add_(1, windows[..., -1].clamp(min=0), banned)  # a masked window may hold padding (-1)


class DeviceProcessors:
    """`process_scores` at fixed shapes with every condition on the device, for the static search.

    What `process_scores` decides on the host from the current length (the minimum length, the
    forced first and last tokens) is decided here by tensors on the device, and everything that
    does not change during a call (EOS ids, the forced rows of scores) is built once, here, rather
    than at every step. The scores are the same bit for bit.
    """

    def __init__(self, spec, vocab: int, device, buffers=None):
        b = buffers if buffers is not None else FreshBuffers()
        self.spec = spec
        self.eos = None if spec.eos_token_id is None else b.place(
            "procs.eos", device_ids(spec.eos_token_id, device))  # (E,)
        self.min_length = spec.eos_token_id is not None and spec.min_length > 0
        forced = {}  # cur_len at which a row is forced -> the ids forced
        for at, ids in ((1, spec.forced_bos_token_id), (spec.max_length - 1, spec.forced_eos_token_id)):
            if ids is not None:  # a later entry overrides an earlier one at the same length, as in `process_scores`
                forced[at] = ids
        self.forced = bool(forced)
        if forced:
            # Row k + 1 of the table: 0 at the ids forced at length ats[k], -inf elsewhere; row 0 unused.
            table = torch.zeros(len(forced) + 1, vocab, dtype=torch.float32, device=device)  # (F+1, V)
            for k, ids in enumerate(forced.values()):
                force_token(table[k + 1 : k + 2], ids)
            self.table = b.place("procs.forced", table)
            self.ats = b.place("procs.forced_at", from_host(list(forced), torch.long, device))  # (F,)
            self.order = b.place("procs.forced_order", torch.arange(1, len(forced) + 1, device=device))  # (F,)

    def __call__(self, seqs: torch.Tensor, cur_len: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Processed scores (N, V) for next tokens after `seqs` (N, L) at length `cur_len` (1,);
        `scores` is changed in place, the result may be another tensor."""
        s = self.spec
        if s.no_repeat_ngram_size > 0:
            scores = ban_repeated_ngrams_dense(seqs, cur_len, scores, s.no_repeat_ngram_size)
        if self.min_length:
            short = cur_len < s.min_length  # (1,)
            scores.index_copy_(1, self.eos, scores.index_select(1, self.eos).masked_fill_(short, -torch.inf))
        if self.forced:  # one pass over the scores, whichever row (if any) this length forces
            pick = torch.where(self.ats == cur_len, self.order, 0).amax(0, keepdim=True)  # (1,) 0: none
            scores = torch.where(pick[:, None] > 0, self.table.index_select(0, pick), scores)  # (N, V)
        return scores
