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
  is then reported for that input only; asked to, it isolates any other failure the same
  way, input by input (the one failure-split policy of the pipeline and the service).
- `pipelined` runs planned batches on a `Device` (this thread, `InlineDevice`, or the
  service's device worker) and finishes each (decode, score) on another thread while the
  next ones are on the device: the one overlap of model work with the rest.
"""

from __future__ import annotations

import functools
import re
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import CancelledError, Executor, Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

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


def fits_budget(longest: int, size: int, num_beams: int, *, max_batch_tokens: int, max_batch_size: int) -> bool:
    """The token budget of one model call: ``size <= max_batch_size`` and
    ``longest * size * num_beams <= max_batch_tokens`` (`longest`: the longest input's tokens)."""
    return size <= max_batch_size and longest * size * num_beams <= max_batch_tokens


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
        fits = fits_budget(longest, len(current) + 1, num_beams, max_batch_tokens=max_batch_tokens,
                           max_batch_size=max_batch_size)
        if current and not fits:
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
    maps input position -> message for inputs out of memory even alone; `failures` maps input
    position -> the exception of an input that failed alone otherwise (with ``isolate``);
    `skipped` lists the inputs `skip` withdrew; `calls` holds the positions of every call that
    succeeded; `splits` counts halvings.
    """

    results: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    failures: dict[int, BaseException] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)
    calls: list[list[int]] = field(default_factory=list)
    splits: int = 0

    @property
    def failed(self) -> bool:
        """Whether some input failed alone (out of memory or otherwise)."""
        return bool(self.errors or self.failures)


def run_with_oom_split(
    batch_fn: Callable[[list[int]], Sequence[Any]],
    positions: Sequence[int],
    *,
    oom_errors: tuple[type[BaseException], ...] = DEFAULT_OOM_ERRORS,
    on_oom: Callable[[list[int], BaseException], None] | None = None,
    isolate: bool = False,
    skip: Callable[[], Iterable[int]] | None = None,
) -> SplitOutcome:
    """Run ``batch_fn(positions)``; on an out-of-memory error split in half and retry.

    `batch_fn` returns one result per position, in order. Halving goes down to one
    input; an input that still runs out of memory gets a one-line error message in
    ``outcome.errors`` while every other input succeeds. Out of memory means one of
    `oom_errors` (the injection point for CPU tests: pass your own exception type) or
    a RuntimeError saying so (`is_out_of_memory`). Before the retry, the failed call's
    frames are cleared so its tensors are freed, and only then is `on_oom(positions,
    message)` called (the pipeline returns cached CUDA blocks there).

    Any other exception propagates, unless `isolate`: then the batch is retried one input at a
    time, and an input that fails alone is kept in ``outcome.failures`` while the others run.
    `skip()` names inputs no longer wanted: each call drops them before it runs.
    """
    outcome = SplitOutcome()
    pending: list[list[int]] = [list(positions)]
    while pending:
        batch = pending.pop(0)
        if skip is not None:
            withdrawn = set(skip())
            outcome.skipped += [p for p in batch if p in withdrawn]
            batch = [p for p in batch if p not in withdrawn]
            if not batch:
                continue
        try:
            results = batch_fn(batch)
        except (Exception, *oom_errors) as error:
            if not (is_out_of_memory(error, oom_errors) or (isolate and isinstance(error, Exception))):
                raise
            # The traceback holds the failed call's frames and, through them, its tensors.
            traceback.clear_frames(error.__traceback__)
            failure: str | BaseException = oom_message(error) if is_out_of_memory(error, oom_errors) else error
        else:
            if len(results) != len(batch):
                raise RuntimeError(f"batch function returned {len(results)} results for {len(batch)} inputs")
            outcome.results.update(zip(batch, results))
            outcome.calls.append(batch)
            continue
        # Outside the except block: an out-of-memory error and its frames are gone (only its message is left).
        pending[:0] = _retries(outcome, batch, failure, on_oom)
    return outcome


def _retries(outcome: SplitOutcome, batch: list[int], failure: str | BaseException,
             on_oom: Callable[[list[int], str], None] | None) -> list[list[int]]:
    """The calls to try after `batch` failed (halves after running out of memory, else single
    inputs), or none when it held one input: its failure is then noted in `outcome`."""
    if isinstance(failure, str):
        if on_oom is not None:
            on_oom(batch, failure)
        if len(batch) == 1:
            outcome.errors[batch[0]] = f"out of memory on this input even in a batch of one ({failure})"
            return []
        outcome.splits += 1
        half = len(batch) // 2
        return [batch[:half], batch[half:]]
    if len(batch) == 1:
        outcome.failures[batch[0]] = failure
        return []
    return [[p] for p in batch]


T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")


class Device(Protocol):
    """Where model calls run: `submit(call)` runs ``call()`` there and returns its future.

    `depth`: calls it holds at most (running and queued); `finishes`: a batch is also finished
    there, right after its model call (else on the pipeline's finisher thread); `stopping`: no new
    call should start; `cancel(future)`: drop a call that has not started.
    """

    depth: int
    finishes: bool

    @property
    def stopping(self) -> bool: ...

    def submit(self, call: Callable[[], T]) -> Future[T]: ...

    def cancel(self, future: Future) -> None: ...


class InlineDevice:
    """Model calls on the calling thread, one at a time (`submit` returns once the call is done)."""

    depth = 1
    finishes = False
    stopping = False

    def submit(self, call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(call())
        except BaseException as error:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(error)
        return future

    def cancel(self, future: Future) -> None:
        """Nothing waits here: a call is done once submitted."""


def pipelined(plans: Iterable[P], generate: Callable[[P], T], finish: Callable[[T], R], *, device: Device,
              finisher: Executor, failed: Callable[[T], bool] = lambda generated: False) -> Iterator[R]:
    """``finish(generate(plan))`` of each plan, in order, with the model work overlapped.

    `generate` runs on `device` (up to ``device.depth`` plans there at once), `finish` on
    `finisher`: plan k is finished while plan k+1 is on the device, and yielded once the device
    has the next plans (so a consumer writing plan k's results never holds the device up). A
    device that ``finishes`` runs `finish` too, after `generate`, and the next plan goes to it
    as soon as one is done (its thread decodes and scores; the consumer's work overlaps). After
    a plan for which `failed(generated)` holds, plans go one at a time until one has no failure
    (a run of failures stops its caller before more work is wasted). No plan starts once
    ``device.stopping``; a plan the device cancelled ends the run. Closing the generator cancels
    the plans not started.
    """
    plans = iter(plans)
    on_device: deque[Future[tuple[T, R | None]]] = deque()
    state = {"exhausted": False, "serial": False}

    def top_up() -> None:
        room = 1 if state["serial"] else device.depth
        while not state["exhausted"] and len(on_device) < room and not device.stopping:
            plan = next(plans, None)
            if plan is None:
                state["exhausted"] = True
                return
            on_device.append(device.submit(functools.partial(_generated, generate, finish if device.finishes else None,
                                                             plan)))

    try:
        top_up()
        while on_device:
            try:
                generated, finished = on_device.popleft().result()
            except CancelledError:
                return
            finishing = finisher.submit(finish, generated) if finished is None else _done(finished)
            state["serial"] = failed(generated)
            if not state["serial"]:
                top_up()
            yield finishing.result()
            top_up()
    finally:
        for future in on_device:
            device.cancel(future)


def _generated(generate: Callable[[P], T], finish: Callable[[T], R] | None, plan: P) -> tuple[T, R | None]:
    """What a device call gives back: the generated batch, and it finished when the device finishes."""
    generated = generate(plan)
    return generated, (finish(generated) if finish is not None else None)


def _done(value: R) -> Future[R]:
    future: Future[R] = Future()
    future.set_result(value)
    return future
