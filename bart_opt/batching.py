"""Batch planning, padding trim and out-of-memory splitting for the summarization pipeline.

Everything here is pure PyTorch/Python and knows nothing about the model, so it is
tested on CPU without one.

- `plan_batches` sorts inputs by length (longest first, so an out-of-memory batch
  shows up at the start of a run, not hours in) and fills each batch up to a token
  budget that counts beams: ``padded_len * batch_size * num_beams <= max_batch_tokens``,
  where ``padded_len`` is the longest input of the batch. An input that alone exceeds
  the budget still gets a batch of its own.
- `collate` pads token lists into one ``(B, T)`` tensor and `trim_pad_columns` drops
  the columns that are padding in every row (the seed's trim, transformers PR #3400),
  counting the padding that was computed and the padding that was avoided.
- `run_with_oom_split` runs a batch function and, when it raises an out-of-memory
  error, splits the batch in half and retries down to a single input, whose failure
  is then reported for that input only.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

DEFAULT_OOM_ERRORS: tuple[type[BaseException], ...] = (torch.cuda.OutOfMemoryError,)
# Allocation failures that surface as plain RuntimeErrors: cuBLAS / cuDNN workspaces
# ("CUBLAS_STATUS_ALLOC_FAILED"), "CUDA error: out of memory" from a kernel launch, the CPU allocator.
_OOM_MESSAGES = ("out of memory", "alloc_failed", "can't allocate memory")


def is_out_of_memory(error: BaseException, oom_errors: tuple[type[BaseException], ...] = DEFAULT_OOM_ERRORS) -> bool:
    """Whether `error` means a device (or the host) ran out of memory."""
    if isinstance(error, oom_errors):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error).lower() for m in _OOM_MESSAGES)


def oom_message(error: BaseException) -> str:
    """The first two sentences of an out-of-memory error on one line (CUDA's run to a paragraph)."""
    text = " ".join(str(error).split()) or type(error).__name__
    short = " ".join(re.split(r"(?<=\.) ", text)[:2])
    return short if len(short) <= 200 else short[:197] + "..."


def plan_batches(
    lengths: Sequence[int],
    *,
    max_batch_tokens: int,
    max_batch_size: int,
    num_beams: int = 1,
) -> list[list[int]]:
    """Group input positions into batches, longest inputs first.

    Each batch obeys ``len(batch) <= max_batch_size`` and
    ``max(lengths[i] for i in batch) * len(batch) * num_beams <= max_batch_tokens``
    (a single input over the budget forms a batch of one). Ties keep input order, so
    the plan is deterministic. Callers restore input order from the returned positions.
    """
    if max_batch_tokens < 1 or max_batch_size < 1 or num_beams < 1:
        raise ValueError(
            f"max_batch_tokens, max_batch_size and num_beams must be >= 1, got "
            f"{max_batch_tokens}, {max_batch_size}, {num_beams}"
        )
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    padded_len = 0
    for i in order:
        longest = max(padded_len, lengths[i])
        fits = (len(current) + 1) * longest * num_beams <= max_batch_tokens
        if current and (len(current) >= max_batch_size or not fits):
            batches.append(current)
            current, longest = [], lengths[i]
        current.append(i)
        padded_len = longest
    if current:
        batches.append(current)
    return batches


def fixed_batches(n: int, batch_size: int) -> list[list[int]]:
    """The seed's baseline plan: consecutive batches of `batch_size` in input order."""
    return [list(range(start, min(start + batch_size, n))) for start in range(0, n, batch_size)]


def collate(token_lists: Sequence[Sequence[int]], pad_id: int, pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists into ``input_ids`` and ``attention_mask``, both ``(B, T)`` int64.

    ``T`` is `pad_to` when given (the seed padded every batch to the model's maximum
    length), else the longest list.
    """
    longest = max(len(tokens) for tokens in token_lists)
    width = longest if pad_to is None else pad_to
    if width < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest input ({longest} tokens)")
    input_ids = torch.full((len(token_lists), width), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(token_lists), width), dtype=torch.long)  # (B, T)
    for row, tokens in enumerate(token_lists):
        input_ids[row, : len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
        attention_mask[row, : len(tokens)] = 1
    return input_ids, attention_mask


@dataclass(frozen=True)
class TrimStats:
    """Padding bookkeeping of one trimmed batch (counts are input tokens, beams not counted).

    `padding_computed`: pad positions still fed to the model after the trim;
    `padding_avoided`: pad positions removed by the trim (rows x dropped columns).
    """

    rows: int
    columns_before: int
    columns_after: int
    tokens: int
    padding_computed: int
    padding_avoided: int


def trim_pad_columns(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, TrimStats]:
    """Drop the columns that are padding in every row (the seed's trim).

    A position counts as padding when its attention mask is 0 (or, without a mask,
    when it holds `pad_id`). Returns the trimmed ``(B, T')`` ids and mask and the
    padding counts. With right padding the dropped columns are a suffix, so the
    model's output is unchanged.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = input_ids.ne(pad_id).long()
    elif attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} does not match input_ids {tuple(input_ids.shape)}"
        )
    keep = attention_mask.bool().any(dim=0)  # (T,)
    rows, columns_before = input_ids.shape
    trimmed_ids = input_ids[:, keep]  # (B, T')
    trimmed_mask = attention_mask[:, keep]  # (B, T')
    columns_after = trimmed_ids.shape[1]
    tokens = int(trimmed_mask.sum())
    stats = TrimStats(
        rows=rows,
        columns_before=columns_before,
        columns_after=columns_after,
        tokens=tokens,
        padding_computed=rows * columns_after - tokens,
        padding_avoided=rows * (columns_before - columns_after),
    )
    return trimmed_ids, trimmed_mask, stats


@dataclass
class SplitOutcome:
    """What `run_with_oom_split` did with one batch.

    `results` maps input position -> the batch function's result for it; `errors`
    maps input position -> message for inputs that failed even alone; `calls` holds
    the positions of every call that succeeded; `splits` counts halvings.
    """

    results: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    calls: list[list[int]] = field(default_factory=list)
    splits: int = 0


def run_with_oom_split(
    batch_fn: Callable[[list[int]], Sequence[Any]],
    positions: Sequence[int],
    *,
    oom_errors: tuple[type[BaseException], ...] = DEFAULT_OOM_ERRORS,
    on_oom: Callable[[list[int], BaseException], None] | None = None,
) -> SplitOutcome:
    """Run ``batch_fn(positions)``; on an out-of-memory error split in half and retry.

    `batch_fn` returns one result per position, in order. Halving goes down to one
    input; an input that still runs out of memory gets a one-line error message in
    ``outcome.errors`` while every other input succeeds. Out of memory means one of
    `oom_errors` (the injection point for CPU tests: pass your own exception type) or
    a RuntimeError saying so (`is_out_of_memory`). Before the retry, the failed call's
    frames are cleared so its tensors are freed, and only then is `on_oom(positions,
    message)` called (the pipeline returns cached CUDA blocks there).
    """
    outcome = SplitOutcome()
    pending: list[list[int]] = [list(positions)]
    while pending:
        batch = pending.pop(0)
        message = None
        try:
            results = batch_fn(batch)
        except (Exception, *oom_errors) as error:
            if not is_out_of_memory(error, oom_errors):
                raise
            # The traceback holds the failed call's frames and, through them, its tensors.
            traceback.clear_frames(error.__traceback__)
            message = oom_message(error)
        if message is not None:  # outside the except block: the error and its frames are gone
            if on_oom is not None:
                on_oom(batch, message)
            if len(batch) == 1:
                outcome.errors[batch[0]] = f"out of memory on this input even in a batch of one ({message})"
                continue
            half = len(batch) // 2
            pending[:0] = [batch[:half], batch[half:]]
            outcome.splits += 1
            continue
        if len(results) != len(batch):
            raise RuntimeError(f"batch function returned {len(results)} results for {len(batch)} inputs")
        outcome.results.update(zip(batch, results))
        outcome.calls.append(batch)
    return outcome
