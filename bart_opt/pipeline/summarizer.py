"""Texts in; summaries, ROUGE, memory and timing out.

`Summarizer` pairs a checkpoint's tokenizer with the engine (`bart_opt.Bart`) and runs
the evaluation pipeline the seed ran by hand:

1. tokenize (with the checkpoint's summarization prefix), truncating inputs longer than
   the model's positions and flagging them per item;
2. plan batches by length under a token budget that counts beams (`bart_opt.pipeline.batching`);
3. per model call, pad to the model's maximum length and drop the all-padding columns
   (the seed's trim), counting the padding computed and the padding avoided;
4. generate, halving a batch on out-of-memory down to one input (and, with ``isolate``,
   retrying a failed call input by input: `bart_opt.pipeline.batching.run_with_oom_split`);
5. decode as the reference scripts do and score ROUGE when references are given.

`summarize` returns one `SummaryResult` in input order (`bart_opt.pipeline.results`). `iter_batches`
takes the same arguments and yields the same work one planned batch at a time, its model calls
overlapped with decoding and scoring (`bart_opt.pipeline.batching.pipelined`; the evaluation core,
`bart_opt.evaluate`, builds on it), and `summarize_groups` runs the texts of several requests in
one go and splits the result back per request (the service's micro-batcher). `encode` and
decoding may run on any thread (`bart_opt.pipeline.tokens.TokenizerPool`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from bart_opt.pipeline.batching import (
    DEFAULT_OOM_ERRORS, Device, InlineDevice, SplitOutcome, collate, pipelined, plan_batches, run_with_oom_split,
    trim_pad_columns,
)
from bart_opt.engine.checkpoint import check_embeddable, check_tokenizer, load_tokenizer
from bart_opt.errors import InvalidRequest
from bart_opt.engine.generation import Cancelled
from bart_opt.engine.memory import measure
from bart_opt.pipeline.results import CANCELLED, FAILED, PHASES, BatchOutcome, Encoded, SummaryResult
from bart_opt.engine.options import EngineOptions
from bart_opt.pipeline.rouge import RougeScorer
from bart_opt.engine.spec import GenerationSpec
from bart_opt.pipeline.tokens import TokenizerPool

if TYPE_CHECKING:
    from bart_opt.engine.model import Bart

logger = logging.getLogger("bart_opt.pipeline.summarizer")

DEFAULT_MAX_BATCH_TOKENS = EngineOptions.max_batch_tokens  # the library's (and the CLI's) defaults
DEFAULT_MAX_BATCH_SIZE = EngineOptions.max_batch_size


class Summarizer:
    """A checkpoint's tokenizer plus the memory-optimized BART, with batching and ROUGE.

    Build it with `Summarizer.from_pretrained`. The constructor is for callers that
    already hold a model and tokenizer (tests, the service). `max_beams` caps the
    ``num_beams`` a caller may ask for (None: no cap). `oom_errors` and
    `before_model_call` are injection points: ``before_model_call(positions)`` runs
    before every model call and may raise one of `oom_errors` to simulate running out
    of memory on CPU. `count_cpu_tensors` turns the CPU live-tensor counter of the
    memory report on (exact peaks, some overhead) or off.
    """

    def __init__(
        self,
        model: Bart,
        tokenizer,
        *,
        name: str = "",
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        max_beams: int | None = None,
        scorer: RougeScorer | None = None,
        oom_errors: tuple[type[BaseException], ...] = DEFAULT_OOM_ERRORS,
        before_model_call: Callable[[list[int]], None] | None = None,
        count_cpu_tensors: bool = True,
        dtype_reason: str | None = None,
    ):
        if max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError(f"max_batch_tokens and max_batch_size must be >= 1, got {max_batch_tokens}, {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.tokens = TokenizerPool(tokenizer)  # `encode` and decoding may run on any thread
        self.name = name
        self.dtype_reason = dtype_reason  # why the model runs in its dtype (`bart_opt.engine.hardware.choose_dtype`)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_beams = max_beams
        self.scorer = scorer or RougeScorer()
        self.oom_errors = oom_errors
        self.before_model_call = before_model_call
        self.count_cpu_tensors = count_cpu_tensors
        self.pad_id = model.config.pad_token_id
        tokenizer_max = getattr(tokenizer, "model_max_length", None) or math.inf
        self.max_input_tokens = int(min(model.config.max_position_embeddings, tokenizer_max))
        self.prefix = summarization_prefix(model.config)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        exact: bool = False,
        fast: bool = False,
        **kwargs,
    ) -> Summarizer:
        """Load the tokenizer (AutoTokenizer) and `Bart` from a local folder or hub id, and check
        that they fit together (`bart_opt.engine.checkpoint`: `CheckpointError` otherwise).

        `device` defaults to cuda when available, else cpu; `dtype` to float16 on cuda
        and float32 on cpu. `exact`: summaries equal transformers' for the same batches on
        the same device and dtype; `fast`: the faster half-precision kernels, other summaries
        (see `Bart.from_pretrained`; at most one of the two). Other keyword arguments are
        `bart_opt.engine.options.EngineOptions` fields (``max_beams``, ``count_cpu_tensors`` ...) or go
        to the constructor (see `from_options`).
        """
        names = {f.name for f in dataclasses.fields(EngineOptions)}
        given = {key: kwargs.pop(key) for key in list(kwargs) if key in names}
        options = EngineOptions(
            model=str(name_or_path), device="auto" if device is None else str(device),
            dtype="auto" if dtype is None else str(dtype), max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size, exact=exact, fast=fast, **given,
        )
        return cls.from_options(options, **kwargs)

    @classmethod
    def from_options(cls, options: EngineOptions, **hooks) -> Summarizer:
        """Load what `options` describe (`bart_opt.engine.options.EngineOptions`, validated first: options that
        exclude each other, or a device this machine lacks, are refused before anything is read); `hooks`
        go to the constructor (``scorer``, ``oom_errors``, ``before_model_call``)."""
        from bart_opt.engine.loading import Checkpoint
        from bart_opt.engine.model import Bart

        options.validate()
        if options.torch_threads is not None:
            torch.set_num_threads(options.torch_threads)
        device = options.torch_device()
        checkpoint = Checkpoint.find(options.model)  # found once: the tokenizer and the weights read this folder
        tokenizer = load_tokenizer(checkpoint.folder)
        dtype = options.dtype_choice(device)  # chosen once: the model takes the choice as it is
        model = Bart.from_pretrained(checkpoint, device=device, dtype=dtype, **options.engine_kwargs())
        check_tokenizer(tokenizer, model.config, model.generation_config)
        return cls(model, tokenizer, name=options.model, max_batch_tokens=options.max_batch_tokens,
                   max_batch_size=options.max_batch_size, max_beams=options.max_beams,
                   count_cpu_tensors=options.count_cpu_tensors, dtype_reason=dtype.reason, **hooks)

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return self.model.device

    @property
    def fingerprint(self):
        """The `bart_opt.engine.fingerprint.Fingerprint` of the checkpoint loaded (None for a model not loaded
        from files)."""
        return self.model.fingerprint

    def engine_record(self) -> dict:
        """The engine as loaded, for a run record (`bart_opt.evaluate.record.engine_record`): the dtype, mode,
        static search, EL-attention, quantization and device type the model runs with, and the batch budgets."""
        from bart_opt.evaluate.record import engine_record

        model = self.model
        return engine_record(dtype=str(model.dtype).removeprefix("torch."), mode=model.mode, static=model.static,
                             el_attention=model.el_attention, quantize=model.quantize, device=model.device.type,
                             max_batch_tokens=self.max_batch_tokens, max_batch_size=self.max_batch_size)

    def generation_spec(self, overrides: Mapping[str, Any] | None = None) -> GenerationSpec:
        """Resolve generation overrides over the checkpoint's defaults, once, under this summarizer's
        beam cap. Raises `InvalidRequest` naming the option (see `GenerationSpec.resolve`)."""
        return self.model.generation_spec(overrides, max_beams=self.max_beams)

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Tokenize with the summarization prefix, cutting at the model's positions.

        Inputs longer than `max_input_tokens` are truncated the way the tokenizer does
        (special tokens kept) and flagged. A text that is not a string, cannot be encoded
        as UTF-8 (a lone surrogate) or spells out a token the model has no embedding for
        (`check_embeddable`) raises `InvalidRequest` naming ``texts[i]``. Safe to call from
        several threads (each borrows a tokenizer of `tokens`).
        """
        for i, text in enumerate(texts):
            check_text(text, f"texts[{i}]")
        prefixed = [self.prefix + text for text in texts]
        with self.tokens.borrow() as tokenizer:
            # One token past the limit tells cut inputs apart without a second full pass.
            probe = tokenizer(prefixed, truncation=True, max_length=self.max_input_tokens + 1)["input_ids"]
            check_embeddable(probe, self.model.config.vocab_size, tokenizer)
            long_positions = [i for i, ids in enumerate(probe) if len(ids) > self.max_input_tokens]
            if long_positions:
                cut = tokenizer([prefixed[i] for i in long_positions], truncation=True, max_length=self.max_input_tokens)
                for i, ids in zip(long_positions, cut["input_ids"]):
                    probe[i] = ids
        long_set = set(long_positions)
        return [Encoded(ids=list(ids), truncated=i in long_set) for i, ids in enumerate(probe)]

    def plan(self, encoded: Sequence[Encoded], num_beams: int) -> list[list[int]]:
        """Length-sorted batches of input positions under this summarizer's budgets."""
        return plan_batches(
            [len(e.ids) for e in encoded],
            max_batch_tokens=self.max_batch_tokens,
            max_batch_size=self.max_batch_size,
            num_beams=num_beams,
        )

    def summarize(self, texts: Sequence[str], references: Sequence[str | None] | None = None, *,
                  encoded: Sequence[Encoded] | None = None, generation: GenerationSpec | None = None,
                  cancelled: Cancelled | None = None, isolate: bool = False, **generation_kwargs) -> SummaryResult:
        """Summarize `texts` (and score them against `references` when given).

        Generation settings are `generation` (a resolved `GenerationSpec`) or, without it,
        keyword options over the checkpoint's generation config (`generation_spec`).
        `encoded` (from `encode(texts)`) skips tokenizing again when the caller already did.
        `cancelled()` returns the positions (into `texts`) whose result is no longer wanted; it
        is polled before each model call and between decoder steps, and those inputs stop there
        with an empty summary and the error `CANCELLED` while the others run unchanged.
        `isolate`: a model call that fails (not out of memory) is retried input by input, and an
        input that fails alone gets the error `FAILED` (or its `InvalidRequest`'s message) while
        the others run; otherwise the failure propagates.
        Raises `InvalidRequest` (a ValueError) on bad input.
        """
        start = time.perf_counter()
        texts, references = self._check_call(texts, references)
        spec = self._spec(generation, generation_kwargs)
        with measure(self.device, count_cpu_tensors=self.count_cpu_tensors) as log:
            self.model.attach_log(log)
            try:
                tick = time.perf_counter()
                with log.phase("tokenize"):
                    encoded = self._encoded(texts, encoded)
                tokenize_s = time.perf_counter() - tick
                outcomes = [
                    self._run_batch(plan, encoded, references, spec, cancelled, isolate)
                    for plan in self.plan(encoded, spec.num_beams)
                ]
            finally:
                self.model.attach_log(None)
        result = self._assemble(len(texts), outcomes, references, tokenize_s, spec)
        result.memory = log.report()
        result.timing["total"] = time.perf_counter() - start
        return result

    def iter_batches(self, texts: Sequence[str], references: Sequence[str | None] | None = None, *,
                     encoded: Sequence[Encoded] | None = None, generation: GenerationSpec | None = None,
                     cancelled: Cancelled | None = None, isolate: bool = False, device: Device | None = None,
                     scorer: RougeScorer | None = None, **generation_kwargs) -> Iterator[BatchOutcome]:
        """Summarize like `summarize` (the same arguments), yielding each planned batch as soon as it is done.

        Batches come longest first; every input position appears in exactly one outcome. Each
        outcome carries the memory report of its model calls. Decoding and ROUGE of a batch run
        on a worker thread while the next batch's model call runs, so the device never waits for
        them; a batch is therefore yielded once the next one's model call is over (the last one
        at the end). Nothing else is held between yields, so a consumer may stop at any batch,
        write results, or run other model work in between. `device` is where the model calls run
        (default: this thread; `bart_opt.pipeline.batching.pipelined` has the rules); `scorer` scores the
        references (default: this summarizer's, `scorer`).
        """
        texts, references = self._check_call(texts, references)
        spec = self._spec(generation, generation_kwargs)
        tick = time.perf_counter()
        encoded = self._encoded(texts, encoded)
        tokenize_share = (time.perf_counter() - tick) / len(texts)
        generate = functools.partial(self._measured_batch, encoded=encoded, spec=spec, cancelled=cancelled,
                                     isolate=isolate)
        finish = functools.partial(self._finished, encoded=encoded, references=references,
                                   tokenize_share=tokenize_share, scorer=scorer or self.scorer)
        with ThreadPoolExecutor(1, thread_name_prefix="bart-opt-finish") as finisher:
            yield from pipelined(self.plan(encoded, spec.num_beams), generate, finish, device=device or InlineDevice(),
                                 finisher=finisher, failed=lambda generated: generated[1].failed)

    def _encoded(self, texts: list[str], encoded: Sequence[Encoded] | None) -> list[Encoded]:
        """`encoded` checked against `texts`, or the texts encoded now."""
        if encoded is None:
            return self.encode(texts)
        encoded = list(encoded)
        if len(encoded) != len(texts):
            raise ValueError(f"encoded has {len(encoded)} entries for {len(texts)} texts")
        return encoded

    def _measured_batch(self, plan: list[int], *, encoded: list[Encoded], spec: GenerationSpec,
                        cancelled: Cancelled | None, isolate: bool) -> tuple[BatchOutcome, SplitOutcome]:
        """`_generate_batch` under a memory log of its own (the batch's report in ``outcome.memory``)."""
        with measure(self.device, count_cpu_tensors=self.count_cpu_tensors) as log:
            self.model.attach_log(log)
            try:
                outcome, split = self._generate_batch(plan, encoded, spec, cancelled, isolate)
            finally:
                self.model.attach_log(None)
        outcome.memory = log.report()
        return outcome, split

    def _finished(self, generated: tuple[BatchOutcome, SplitOutcome], *, encoded: list[Encoded], references,
                  tokenize_share: float, scorer: RougeScorer) -> BatchOutcome:
        """`outcome` decoded and scored (off the model's thread), with its share of the tokenize time."""
        outcome, split = generated
        self._finish_batch(outcome, split, encoded, references, log_phases=False, scorer=scorer)
        for item in outcome.items.values():
            item["timing"]["tokenize"] = tokenize_share
        outcome.timing["tokenize"] = tokenize_share * len(outcome.positions)
        return outcome

    def summarize_groups(self, groups: Sequence[tuple[Sequence[str], Sequence[str | None] | None]], *,
                         encoded: Sequence[Encoded] | None = None, generation: GenerationSpec | None = None,
                         cancelled: Cancelled | None = None, **generation_kwargs) -> list[SummaryResult]:
        """Run the texts of several requests in one call and split the result per request.

        `groups` is a list of ``(texts, references_or_None)``. Each returned result has
        its own summaries, items, errors and ROUGE; its timing is the sum of its items'
        shares (total: its share of the call's wall time); `batches` holds the model
        calls that included its texts (``size``, ``tokens`` ... of the whole call;
        ``positions`` and the items' ``call`` renumbered within the request); `memory`
        is the shared call's report with ``"share"``: this request's fraction of the
        call's input tokens. `encoded` holds every group's `encode` output, in order, when
        the caller already tokenized; `cancelled` returns positions into all groups' texts, in
        order (see `summarize`).
        """
        texts: list[str] = []
        references: list[str | None] = []
        bounds = []
        for group_texts, group_refs in groups:
            group_texts = list(group_texts)
            if group_refs is not None and len(group_refs) != len(group_texts):
                raise InvalidRequest("references", f"{len(group_refs)} references for {len(group_texts)} texts")
            bounds.append((len(texts), len(texts) + len(group_texts)))
            texts.extend(group_texts)
            references.extend(group_refs if group_refs is not None else [None] * len(group_texts))
        has_refs = any(refs is not None for _, refs in groups)
        combined = self.summarize(texts, references if has_refs else None, encoded=encoded, generation=generation,
                                  cancelled=cancelled, **generation_kwargs)
        total_tokens = sum(item["input_tokens"] for item in combined.items) or 1
        return [
            self._group_result(combined, lo, hi, group_refs is not None, total_tokens)
            for (lo, hi), (_, group_refs) in zip(bounds, groups)
        ]

    def _group_result(self, combined: SummaryResult, lo: int, hi: int, scored: bool,
                      total_tokens: int) -> SummaryResult:
        """The part of `combined` for positions lo..hi-1, renumbered from 0."""
        calls = sorted({item["call"] for item in combined.items[lo:hi] if item["call"] is not None})
        renumber = {old: new for new, old in enumerate(calls)}
        items = [
            {**item, "call": renumber.get(item["call"]), "timing": dict(item["timing"])}
            for item in combined.items[lo:hi]
        ]
        batches = [
            {**combined.batches[c], "positions": [p - lo for p in combined.batches[c]["positions"] if lo <= p < hi]}
            for c in calls
        ]
        share = sum(item["input_tokens"] for item in items) / total_tokens
        timing = {phase: sum(item["timing"][phase] for item in items) for phase in PHASES}
        timing["total"] = combined.timing["total"] * share
        return SummaryResult(
            summaries=combined.summaries[lo:hi],
            rouge=self._aggregate(items) if scored else None,
            items=items,
            memory={**combined.memory, "share": share},
            timing=timing,
            batches=batches,
            errors=combined.errors[lo:hi],
            generation=combined.generation,
            oom_splits=combined.oom_splits,
        )

    def _check_call(self, texts, references):
        if isinstance(texts, str):
            raise InvalidRequest("texts", "must be a list of strings, got a single string")
        texts = list(texts)
        if not texts:
            raise InvalidRequest("texts", "is empty")
        if references is not None:
            references = list(references)
            if len(references) != len(texts):
                raise InvalidRequest("references", f"{len(references)} references for {len(texts)} texts")
            for i, ref in enumerate(references):
                if ref is not None:
                    check_text(ref, f"references[{i}]")
        return texts, references

    def _spec(self, generation: GenerationSpec | None, generation_kwargs: dict[str, Any]) -> GenerationSpec:
        """The call's spec: the one given, or the keyword options resolved (not both)."""
        if generation is None:
            return self.generation_spec(generation_kwargs)
        if generation_kwargs:
            raise InvalidRequest(sorted(generation_kwargs)[0],
                                 "give generation options either as a spec or as keywords, not both")
        return generation

    def _run_batch(self, plan: list[int], encoded: list[Encoded], references, spec: GenerationSpec,
                   cancelled: Cancelled | None = None, isolate: bool = False) -> BatchOutcome:
        """Generate, decode and score one planned batch, splitting it on out-of-memory."""
        outcome, split = self._generate_batch(plan, encoded, spec, cancelled, isolate)
        self._finish_batch(outcome, split, encoded, references)
        return outcome

    def _generate_batch(self, plan: list[int], encoded: list[Encoded], spec: GenerationSpec,
                        cancelled: Cancelled | None = None, isolate: bool = False) -> tuple[BatchOutcome, SplitOutcome]:
        """The model part of one planned batch: its calls (split on out-of-memory, and on any
        failure with `isolate`) and errors, the sequences still to be decoded in the returned
        `SplitOutcome`.

        Inputs `cancelled` names before a call starts never reach the model; inputs it names
        by the end of their model call are not decoded. Both get the error `CANCELLED`.
        """
        calls: list[dict] = []

        def call(positions: list[int]) -> list[torch.Tensor]:
            sequences, stats = self._generate(positions, encoded, spec, cancelled)
            calls.append(stats)
            return sequences

        split = run_with_oom_split(call, plan, oom_errors=self.oom_errors, on_oom=_free_device_cache,
                                   isolate=isolate, skip=cancelled)
        withdrawn = _positions(cancelled) | set(split.skipped)
        failures = {p: _failure_message(p, error) for p, error in split.failures.items()}
        errors = {**split.errors, **failures, **{p: CANCELLED for p in plan if p in withdrawn}}
        outcome = BatchOutcome(positions=list(plan), summaries={}, items={}, errors=errors,
                               calls=calls, oom_splits=split.splits, timing=dict.fromkeys(PHASES, 0.0))
        return outcome, split

    def _finish_batch(self, outcome: BatchOutcome, split: SplitOutcome, encoded: list[Encoded], references,
                      log_phases: bool = True, scorer: RougeScorer | None = None) -> None:
        """Decode and score what `_generate_batch` produced and fill `outcome`. `log_phases` records
        the phases in the model's memory log (off when this runs beside the next model call)."""
        for index, (positions, stats) in enumerate(zip(split.calls, outcome.calls)):
            kept = [p for p in positions if p not in outcome.errors]
            sequences = [split.results[p] for p in kept]
            self._decode_and_score(outcome, index, stats, kept, sequences, encoded, references, log_phases,
                                   scorer or self.scorer)
        for p, message in outcome.errors.items():
            outcome.summaries[p] = ""
            outcome.items[p] = {
                "input_tokens": len(encoded[p].ids), "truncated": encoded[p].truncated, "output_tokens": 0,
                "rouge": None, "error": message, "padding_computed": 0, "padding_avoided": 0, "call": None,
                "timing": dict.fromkeys(PHASES, 0.0),
            }

    def _generate(self, positions: list[int], encoded: list[Encoded], spec: GenerationSpec,
                  cancelled: Cancelled | None = None) -> tuple[list[torch.Tensor], dict]:
        """One model call: pad to the model's length, trim, generate. Returns rows and call stats."""
        if self.before_model_call is not None:
            self.before_model_call(positions)
        ids, mask = collate([encoded[p].ids for p in positions], self.pad_id, pad_to=self.max_input_tokens)
        ids, mask, trim = trim_pad_columns(ids, mask, self.pad_id)  # (B, T')
        rows_cancelled = None if cancelled is None else functools.partial(_rows_of, cancelled, positions)
        tick = time.perf_counter()
        with torch.inference_mode(), self.model.log_phase("generate"):
            sequences = self.model.generate(ids.to(self.device), attention_mask=mask.to(self.device), spec=spec,
                                            cancelled=rows_cancelled)
        sequences = sequences.cpu()  # (B, L)
        stats = {
            "size": trim.rows, "columns": trim.columns_after, "tokens": trim.tokens,
            "padding_computed": trim.padding_computed, "padding_avoided": trim.padding_avoided,
            "num_beams": spec.num_beams, "budget_tokens": trim.rows * trim.columns_after * spec.num_beams,
            "seconds": time.perf_counter() - tick, "positions": list(positions),
        }
        return list(sequences), stats

    def _decode_and_score(self, outcome: BatchOutcome, call_index: int, stats: dict, positions: list[int],
                          sequences: list[torch.Tensor], encoded: list[Encoded], references,
                          log_phases: bool = True, scorer: RougeScorer | None = None) -> None:
        """Decode one call's rows (`sequences` of `positions`) as the reference scripts do, score them,
        fill `outcome`."""
        def phase(name: str):  # no memory log may be touched from the finishing thread
            return self.model.log_phase(name) if log_phases else contextlib.nullcontext()

        tick = time.perf_counter()
        with phase("detokenize"), self.tokens.borrow() as tokenizer:
            texts = tokenizer.batch_decode(sequences, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        decode_s = time.perf_counter() - tick
        tick = time.perf_counter()
        with phase("score"):
            for p, sequence, text in zip(positions, sequences, texts):
                reference = references[p] if references is not None else None
                outcome.summaries[p] = text
                outcome.items[p] = self._item(encoded[p], stats, call_index, sequence)
                outcome.items[p]["rouge"] = (scorer or self.scorer).score_any(text, reference) \
                    if reference is not None else None
        score_s = time.perf_counter() - tick
        for phase, seconds in (("generate", stats["seconds"]), ("decode", decode_s), ("score", score_s)):
            outcome.timing[phase] += seconds
            for p in positions:
                outcome.items[p]["timing"][phase] = seconds / len(positions)

    def _item(self, encoded: Encoded, stats: dict, call_index: int, sequence: torch.Tensor) -> dict:
        length = len(encoded.ids)
        return {
            "input_tokens": length,
            "truncated": encoded.truncated,
            # Tokens generated after the decoder start token (forced bos and eos included).
            "output_tokens": int(sequence.ne(self.pad_id).sum()) - 1,
            "rouge": None,
            "error": None,
            "padding_computed": stats["columns"] - length,
            "padding_avoided": self.max_input_tokens - stats["columns"],
            "call": call_index,
            "timing": dict.fromkeys(PHASES, 0.0),
        }

    def _assemble(self, n: int, outcomes: list[BatchOutcome], references, tokenize_s: float,
                  spec: GenerationSpec) -> SummaryResult:
        """Merge batch outcomes into one result in input order."""
        summaries: list[str] = [""] * n
        items: list[dict] = [{} for _ in range(n)]
        errors: list[str | None] = [None] * n
        batches: list[dict] = []
        timing = dict.fromkeys(PHASES, 0.0)
        timing["tokenize"] = tokenize_s
        for outcome in outcomes:
            offset = len(batches)
            batches.extend(outcome.calls)
            for p in outcome.positions:
                item = outcome.items[p]
                if item["call"] is not None:
                    item["call"] += offset
                item["timing"]["tokenize"] = tokenize_s / n
                summaries[p], items[p], errors[p] = outcome.summaries[p], item, outcome.errors.get(p)
            for phase in ("generate", "decode", "score"):
                timing[phase] += outcome.timing[phase]
        tick = time.perf_counter()
        rouge = self._aggregate(items) if references is not None else None
        timing["score"] += time.perf_counter() - tick
        return SummaryResult(summaries=summaries, rouge=rouge, items=items, memory={}, timing=timing,
                             batches=batches, errors=errors, generation=spec.to_dict(),
                             oom_splits=sum(o.oom_splits for o in outcomes))

    def _aggregate(self, items: Sequence[dict]) -> dict | None:
        scored = [item["rouge"] for item in items if item.get("rouge") is not None]
        return self.scorer.aggregate(scored) if scored else None


def summarization_prefix(config) -> str:
    """The text the checkpoint wants before each input, as transformers' examples apply it.

    ``config.prefix`` when set, else ``task_specific_params["summarization"]["prefix"]``,
    else "" (the case for BART checkpoints).
    """
    prefix = getattr(config, "prefix", None)
    if prefix:
        return prefix
    task_params = getattr(config, "task_specific_params", None) or {}
    return (task_params.get("summarization") or {}).get("prefix") or ""


def check_text(text, field: str) -> None:
    """Raise `InvalidRequest` naming `field` unless `text` is a string that encodes as UTF-8."""
    if not isinstance(text, str):
        raise InvalidRequest(field, f"must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        raise InvalidRequest(field, f"character {error.start} (U+{code:04X}) is a lone surrogate, not valid "
                                    "Unicode text; send UTF-8") from None


def _positions(cancelled: Cancelled | None) -> set[int]:
    """The positions `cancelled` names now, as a set (empty without a callback)."""
    return set(cancelled()) if cancelled is not None else set()


def _rows_of(cancelled: Cancelled, positions: list[int]) -> list[int]:
    """The rows of a model call over `positions` whose input `cancelled` names now."""
    withdrawn = _positions(cancelled)
    return [row for row, p in enumerate(positions) if p in withdrawn]


def _failure_message(position: int, error: BaseException) -> str:
    """What an input that failed alone is told (its own mistake, or `FAILED`); the log gets the traceback."""
    if isinstance(error, InvalidRequest):
        return error.message
    logger.warning("the model failed on input %d alone", position, exc_info=error)
    return FAILED


def _free_device_cache(positions: list[int], message: str) -> None:
    """After an out-of-memory error (whose tensors are already released), give cached CUDA blocks back."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


__all__ = ["CANCELLED", "FAILED", "BatchOutcome", "Encoded", "SummaryResult", "Summarizer", "check_text",
           "summarization_prefix"]
