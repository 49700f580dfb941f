"""Agreement with transformers as the suite asserts it, on any processor (docs/fidelity.md, "The test policy").

Exact mode: transformers' ids bit for bit. Every other mode: each output equal to transformers' for the
same batch, or differing only by near-ties under transformers' own scoring (`bart_opt.bench.near_ties`):
how many are equal depends on the processor, and is measured and published, never asserted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import BartForConditionalGeneration

from bart_opt.bench.fidelity import Workload, make_inputs, padded
from bart_opt.bench.near_ties import BeamTrace, Report, check_greedy
from tests.bart_opt.reference import reference_model

WORK = Workload()


def arithmetic(model) -> str:
    """The arithmetic `model` computes in, as `bart_opt.bench.near_ties.token_bound` names it."""
    return "int8" if model.vocab_int8 is not None else str(model.dtype).removeprefix("torch.")


def rows(ids: torch.Tensor, pad: int) -> list[tuple[int, ...]]:
    """Each generated row without its trailing padding."""
    out = []
    for row in ids.tolist():
        while row and row[-1] == pad:
            row.pop()
        out.append(tuple(row))
    return out


def sources(ids: torch.Tensor, mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Each input's ids without its padding."""
    return [row if mask is None else row[m.bool()] for row, m in zip(ids, mask)]


def near_tie_report(model, ids, mask, got: list[tuple[int, ...]], trace: BeamTrace | None, spec,
                    reference: BartForConditionalGeneration, only: list[int] | None = None) -> Report:
    """The near-tie check of `got` (beam search: of the `trace` of the call that made it) against `reference`."""
    inputs = sources(ids, mask)
    if spec.num_beams > 1:
        return trace.check(reference, inputs, spec, arithmetic(model))
    return check_greedy(reference, inputs, got, spec, arithmetic(model), only=only)


def assert_agrees(model, ids: torch.Tensor, mask: torch.Tensor | None, got: torch.Tensor, reference, *,
                  trace: BeamTrace | None = None, expected: torch.Tensor | None = None, compare: list[int] | None = None,
                  **kwargs) -> None:
    """Hold `got` (`model`'s ids for `ids`, `mask` under the generation options `kwargs`) to transformers' under
    the policy above. `reference`: a checkpoint folder or a transformers model (float32 for an int8 `model`, else
    in `model`'s dtype); `trace`: the `BeamTrace` of the call that made `got` (needed for beam search);
    `expected`: transformers' ids when the caller has them; `compare`: only these rows are held (the caller
    checks the others, e.g. cancelled ones)."""
    hf = reference_model(reference, model.dtype if arithmetic(model) != "int8" else torch.float32) \
        if isinstance(reference, str) else reference
    spec = model.generation_spec(kwargs)
    if expected is None:
        with torch.inference_mode():
            expected = hf.generate(input_ids=ids, attention_mask=mask, **kwargs)
    pad = model.config.pad_token_id
    a, b = rows(expected, pad), rows(got, pad)
    keep = list(range(len(a))) if compare is None else compare
    differing = [i for i in keep if a[i] != b[i]]
    if model.exact:
        assert not differing, f"exact mode differs from transformers in rows {differing}"
    elif differing:
        assert trace is not None or spec.num_beams == 1, "beam search outputs differ and no trace was recorded"
        near_tie_report(model, ids, mask, b, trace, spec, hf, only=differing).assert_holds(
            f"{model.mode} mode, rows {differing} differ from transformers")


def generate_agreeing(model, ids: torch.Tensor, mask: torch.Tensor | None, reference, *,
                      expected: torch.Tensor | None = None, compare: list[int] | None = None, **kwargs) -> torch.Tensor:
    """`model.generate(ids, mask, **kwargs)`, held to transformers' by `assert_agrees`, and returned."""
    with BeamTrace() as trace:
        got = model.generate(ids, mask, **kwargs)
    assert_agrees(model, ids, mask, got, reference, trace=trace, expected=expected, compare=compare, **kwargs)
    return got


@dataclass
class Outcome:
    """One mode's outputs for the published batch, beside transformers', and the near-tie check's report."""

    outputs: list[tuple[int, ...]]
    expected: list[tuple[int, ...]]
    report: Report

    @property
    def identical(self) -> int:
        """Outputs equal to transformers' (a figure: `bart_opt.bench.fidelity` measures and publishes it)."""
        return sum(a == b for a, b in zip(self.outputs, self.expected))


class PublishedBatch:
    """The first padded batch of 8 of the published fidelity workload (`bart_opt.bench.fidelity.Workload`: d_model
    256, inputs of 8-120 tokens, 40 new tokens, 4 beams, length_penalty 2.0, no_repeat_ngram_size 3) in one dtype,
    with transformers' outputs greedy and beam, computed once and shared by every agreement test of the session."""

    def __init__(self, path: str, dtype: str):
        self.path, self.dtype = path, dtype
        self.hf = BartForConditionalGeneration.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        self.inputs = make_inputs(self.hf.config, WORK)[: WORK.batch_size]
        self.ids, self.mask = padded(self.inputs, self.hf.config.pad_token_id)
        self._expected: dict[tuple, list[tuple[int, ...]]] = {}

    @staticmethod
    def settings(search: str) -> dict:
        return WORK.settings(WORK.num_beams if search == "beam" else 1)

    def expected(self, search: str, hf: BartForConditionalGeneration | None = None) -> list[tuple[int, ...]]:
        """transformers' outputs (`hf`, else this batch's dtype) for `search`, cached."""
        hf = hf or self.hf
        key = (search, id(hf))
        if key not in self._expected:
            with torch.inference_mode():
                got = hf.generate(input_ids=self.ids, attention_mask=self.mask, **self.settings(search))
            assert got.shape[1] == 1 + WORK.new_tokens, "outputs run to the full 40 new tokens"
            self._expected[key] = rows(got, hf.config.pad_token_id)
        return self._expected[key]

    def run(self, model, search: str, reference: BartForConditionalGeneration | None = None) -> Outcome:
        """`model`'s outputs for `search`, and the near-tie check of every one of them (not only those that
        differ) against `reference` (default: transformers in this batch's dtype)."""
        hf = reference or self.hf
        settings = self.settings(search)
        with BeamTrace() as trace:
            got = rows(model.generate(self.ids, self.mask, **settings), model.config.pad_token_id)
        spec = model.generation_spec(settings)
        report = near_tie_report(model, self.ids, self.mask, got, trace, spec, hf)
        return Outcome(got, self.expected(search, hf), report)
