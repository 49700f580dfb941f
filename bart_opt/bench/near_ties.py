"""The near-tie test of agreement: what every mode but exact must satisfy against the reference, on any processor.

The default, fast, static, EL-attention and int8 modes compute the same function as transformers with
other kernels, so their log-probs differ from the reference's by rounding, and a search decision may
go the other way where two candidates are that close. How often that happens is a property of the
processor (which kernels run, how they block a sum), so identical-output counts are figures to measure
and publish (`bart_opt.bench.fidelity`), never floors. What holds everywhere is the property below,
checked against the reference's own scoring (transformers in the run's dtype, teacher-forced on the
mode's own hypotheses, the logits processors applied as the search applies them):

* **Beam search** (`BeamTrace`): at every step, for every running hypothesis of every input, the
  processed log-probs the mode handed to the beam bookkeeping (`bart_opt.engine.generation.beam_step`, shared
  by the default and the static search and held bit for bit to transformers' by exact mode) are within
  the rounding budget `token_bound` of the reference's for that prefix, on each token either ranks among
  its 2 x beams best; and the tokens either bans (-inf) are the same. Then every choice the mode made
  differently from the reference was between candidates whose reference scores lie within two budgets
  per token: a near-tie, and nothing else.
* **Greedy search** (`check_greedy`): every token of the mode's output is within two budgets of the
  reference's best token for its prefix (the mode took its own argmax, which the reference scores at
  most two budgets below its own).

The budget, written once (`token_bound`): ``scale * (STORAGE * u(dtype) + ACCUMULATION * u(float32))``,
where ``u`` is the unit roundoff of the run's dtype (int8: half a step of 7-bit activations) and
``scale`` the largest |logit| of the reference's row. A logit is a sum of products whose size is the
logits' scale; every rounding on the way reaches it in proportion, amplified by the network:

* ``STORAGE = 128``: in half precision the values are stored rounded to the dtype at every layer, and
  that dominates. Between two engines on the d256 checkpoint (`SHAPES["d256"]`, init_std 0.2) the largest
  difference measured was 3.6 u * scale (AMD EPYC, AVX2); transformers' own half-precision log-probs
  differ from float64 arithmetic on the same rounded weights by up to 89 u * scale. 128 covers an engine
  anywhere between the two arithmetics.
* ``ACCUMULATION = 4096``: in float32 the storage rounding is negligible and the order of accumulation
  (oneDNN's blocking against MKL's, a fused bias) is what differs: up to 1,049 u32 * scale measured between
  two engines, and 850 between transformers and float64. 4096 leaves a factor of four.

So in float32 a budget is about 4e-3 nats at a logits scale of 15, and a choice of a second-best token
whose reference score is further below than twice that is caught (`tests/bart_opt/test_near_ties.py`
shows a mutant caught). In half precision a budget is 1 nat (float16) or 8 nats (bfloat16) at that
scale: honest about how far apart two correct half-precision engines can be at this width; what it
catches there is a wrong computation (NaN, a mask or bias lost, another input's state), not a single
swapped token.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from bart_opt.engine.processors import process_scores

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "int8": 2.0**-7}
"""u per arithmetic: half the distance between 1 and the next representable number; for int8, half a step
of the activations' 7-bit dynamic quantization (AVX2's range; AVX-512 VNNI's 8 bits round finer)."""
STORAGE = 128
ACCUMULATION = 4096


def token_bound(arithmetic: str, scale: float) -> float:
    """The rounding budget of one token's log-prob (nats) for a mode computing in `arithmetic` (a key of
    `UNIT_ROUNDOFF`) where the reference's logits reach |`scale`| (see the module docstring)."""
    return scale * (STORAGE * UNIT_ROUNDOFF[arithmetic] + ACCUMULATION * UNIT_ROUNDOFF["float32"])


@dataclass
class Violation:
    """One place where a mode is further from the reference than rounding explains."""

    input: int
    position: int  # tokens in the prefix (the start token included)
    what: str

    def __str__(self) -> str:
        return f"input {self.input}, after {self.position} tokens: {self.what}"


@dataclass
class Report:
    """The outcome of a check: rows compared, the largest discrepancy as a share of its budget, and violations."""

    rows: int = 0
    worst: float = 0.0  # max over rows of |discrepancy| / budget (below 1 everywhere when it holds)
    violations: list[Violation] = field(default_factory=list)

    def assert_holds(self, label: str = "") -> None:
        """Raise AssertionError listing the first violations, if any."""
        assert self.rows > 0, f"{label}: nothing was checked"
        if self.violations:
            shown = "; ".join(str(v) for v in self.violations[:5])
            raise AssertionError(f"{label}: {len(self.violations)} of {self.rows} rows are no near-tie: {shown}")


def _cache_argument(hf) -> str:
    """The name transformers' forward takes its cache by: `cache` since 5.24 (`past_key_values` before)."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


def _replay(hf, sources: list[torch.Tensor], steps: list[list[list[tuple[int, ...]]]], spec) -> list[list[list]]:
    """The reference's processed next-token log-probs (V,) float32 and largest |logit| for every prefix of
    `steps`: per input (ids `sources[i]`), per decoder step, its running prefixes (start token first; each
    step's extend the step before's; the same count at every step). All inputs decode together,
    incrementally, with the reference's own cache reordered as the mode's beams were (as its own beam
    search does): the cost of one generate. An input out of steps is fed padding, its outputs unused."""
    device = next(hf.parameters()).device
    pad = hf.config.pad_token_id
    rows = len(steps[0][0]) if steps and steps[0] else 1  # prefixes per input and step
    width = max(len(x) for x in sources)
    ids = torch.full((len(sources), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, x in enumerate(sources):
        ids[i, : len(x)], mask[i, : len(x)] = x, 1
    out: list[list[list]] = [[] for _ in sources]
    with torch.inference_mode():
        memory = hf.get_encoder()(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
        memory, mask = memory.repeat_interleave(rows, dim=0), mask.repeat_interleave(rows, dim=0).to(device)
        past = None
        for t in range(max(len(s) for s in steps)):
            tokens, parents = [], []
            for i, s in enumerate(steps):
                if t >= len(s):  # this input is done: keep its rows, feed padding
                    tokens += [[pad]] * rows
                    parents += [i * rows + j for j in range(rows)]
                    continue
                tokens += [list(p) if t == 0 else [p[-1]] for p in s[t]]
                parents += [i * rows + (s[t - 1].index(p[:-1]) if t else j) for j, p in enumerate(s[t])]
            if past is not None:
                past.reorder_cache(torch.tensor(parents, device=device))
            step = hf(encoder_outputs=(memory,), attention_mask=mask, decoder_input_ids=torch.tensor(tokens, device=device),
                      use_cache=True, **{_cache_argument(hf): past})
            past = step.past_key_values
            z = step.logits[:, -1].float().cpu()  # (B*rows, V)
            for i, s in enumerate(steps):
                if t < len(s):
                    block = z[i * rows : (i + 1) * rows]  # (rows, V)
                    lp = process_scores(torch.tensor(s[t]), F.log_softmax(block, dim=-1), spec)
                    out[i].append([(lp[j], float(block[j].abs().max())) for j in range(rows)])
    return out


class BeamTrace(contextlib.AbstractContextManager):
    """Records, inside its ``with`` block, every beam step of one generate call (the default's or the
    static search's): each working input's running hypotheses and the processed log-probs the mode scored
    them with. `check` then holds them to the reference (see the module docstring)."""

    def __init__(self):
        self.steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (items, prefixes, log_probs)
        self.calls = 0
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        import bart_opt.engine.generation as generation
        import bart_opt.engine.static_generation as static_generation

        original = generation.beam_step

        def recording(st, log_probs, length, s):
            cur = int(torch.as_tensor(length.value).reshape(-1)[0])
            self.calls += cur == 1  # a call's first step
            a, nb = st.running.shape[:2]
            self.steps.append((st.items.clone().cpu(), st.running[:, :, :cur].clone().cpu(),
                               log_probs.view(a, nb, -1).float().clone().cpu()))
            return original(st, log_probs, length, s)

        self._stack.enter_context(_patched([(generation, "beam_step", recording),
                                            (static_generation, "beam_step", recording)]))
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False

    def check(self, hf, inputs: list[torch.Tensor], spec, arithmetic: str) -> Report:
        """Hold every recorded step to `hf` (the reference, in the run's dtype; float32 for int8) for the
        given `inputs` (each input's ids, unpadded, in the batch's order)."""
        assert self.calls == 1, f"a trace holds one beam-search call; this one recorded {self.calls}"
        report = Report()
        per_input: dict[int, list[tuple[list[tuple[int, ...]], torch.Tensor]]] = {}
        for items, prefixes, log_probs in self.steps:
            for a, item in enumerate(items.tolist()):
                rows = [tuple(p) for p in prefixes[a].tolist()]
                per_input.setdefault(item, []).append((rows, log_probs[a]))
        k = 2 * spec.num_beams
        items = sorted(per_input)
        replayed = _replay(hf, [inputs[i] for i in items], [[rows for rows, _ in per_input[i]] for i in items], spec)
        for item, reference in zip(items, replayed):
            for (rows, got), expected in zip(per_input[item], reference):
                for prefix, mine, (theirs, scale) in zip(rows, got, expected):
                    report.rows += 1
                    problem, share = _compare_row(mine, theirs, token_bound(arithmetic, scale), k)
                    report.worst = max(report.worst, share)
                    if problem:
                        report.violations.append(Violation(item, len(prefix), problem))
        return report


def _compare_row(got: torch.Tensor, expected: torch.Tensor, bound: float, k: int) -> tuple[str | None, float]:
    """A mode's processed log-probs (V,) against the reference's on the tokens either ranks among its `k` best:
    (what is wrong or None, the largest |difference| / `bound`)."""
    tokens = torch.cat([got.topk(k).indices, expected.topk(k).indices]).unique()
    a, b = got[tokens], expected[tokens]
    if not torch.isfinite(a).any():
        return "the mode's log-probs are not finite", float("inf")
    banned = torch.isinf(a) != torch.isinf(b)
    if bool(banned.any()):
        return f"token {int(tokens[banned][0])} is banned by one and not the other", float("inf")
    finite = torch.isfinite(a)
    diff = (a[finite] - b[finite]).abs()
    share = float(diff.max()) / bound
    if share > 1:
        worst = int(diff.argmax())
        return (f"token {int(tokens[finite][worst])}: log-prob {float(a[finite][worst]):.6g} against the reference's "
                f"{float(b[finite][worst]):.6g}, beyond the budget {bound:.3g}"), share
    return None, share


def check_greedy(hf, inputs: list[torch.Tensor], outputs: list[tuple[int, ...]], spec, arithmetic: str,
                 only: list[int] | None = None) -> Report:
    """Every token of each greedy output (start token first, no padding) within two budgets of the reference's
    best token for its prefix, and each output ending in EOS or at the maximum length; `only`: these outputs."""
    report = Report()
    eos = set(spec.eos_token_id or ())
    chosen = list(range(len(outputs))) if only is None else only
    for i in chosen:
        if not (outputs[i][-1] in eos or len(outputs[i]) >= spec.max_length):
            report.violations.append(Violation(i, len(outputs[i]), "the output ends with neither EOS nor the maximum length"))
    replayed = _replay(hf, [inputs[i] for i in chosen],
                       [[[outputs[i][:t]] for t in range(1, len(outputs[i]))] for i in chosen], spec)
    for i, reference in zip(chosen, replayed):
        out = outputs[i]
        for t, [(lp, scale)] in enumerate(reference, start=1):
            report.rows += 1
            margin = float(lp.max()) - float(lp[out[t]])
            bound = 2 * token_bound(arithmetic, scale)
            report.worst = max(report.worst, margin / bound)
            if not margin <= bound:  # also catches a banned (-inf) or NaN choice
                report.violations.append(Violation(i, t, (
                    f"token {out[t]} scores {margin:.4g} below the reference's best {int(lp.argmax())}, "
                    f"beyond two budgets ({bound:.3g})")))
    return report


@contextlib.contextmanager
def _patched(targets):
    """Set each (module, name, value) for the block, restoring the originals after."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in targets]
    for module, name, value in targets:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)

