"""Baselines that every summarization score is read against, computed on the CPU with no model.

``lead-3``: the first three sentences of the article, split by the same sentence splitter
rougeLsum uses (`bart_opt.pipeline.rouge.split_sentences`) and written one per line. On CNN/DailyMail
it scores about 40.4 / 17.6 / 36.7 ROUGE-1/2/L, the number published systems are compared to.

Public API, for the CLI and the service's evaluation jobs:

- `BASELINES`, `is_baseline(name)`, `check_baselines(names)`: which names exist;
- `baseline_summary(name, text)`: one summary.

Scoring them is the evaluation core's (`bart_opt.evaluate`: `baseline_rows`, `score_baselines`,
with the same aggregation and bootstrap intervals as a model's metrics, and
`run_baseline_evaluation`, the run folder ``bart-opt evaluate --model lead-3`` writes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from bart_opt.pipeline.rouge_text import split_sentences


def lead(text: str, n: int, lang: str = "en") -> str:
    """The first `n` sentences of `text`, one per line (rougeLsum's sentence splitter for `lang`)."""
    return "\n".join(split_sentences(text, lang)[:n])


def lead_3(text: str, lang: str = "en") -> str:
    """The first three sentences of `text`, one per line."""
    return lead(text, 3, lang)


BASELINES: dict[str, Callable[[str, str], str]] = {"lead-3": lead_3}  # (text, language) -> summary


class UnknownBaselineError(ValueError):
    """A baseline name that does not exist; `.name` is the one asked for, `.available` those that do."""

    def __init__(self, name: object):
        self.name = name
        self.available = sorted(BASELINES)
        super().__init__(f"unknown baseline {name!r}; available: {', '.join(self.available)}")


def is_baseline(name: str) -> bool:
    """Whether `name` names a baseline rather than a checkpoint."""
    return name in BASELINES


def check_baselines(names: Iterable[str]) -> tuple[str, ...]:
    """The names in order, duplicates dropped; raises UnknownBaselineError at the first unknown one."""
    checked: list[str] = []
    for name in names:
        if not isinstance(name, str) or name not in BASELINES:
            raise UnknownBaselineError(name)
        if name not in checked:
            checked.append(name)
    return tuple(checked)


def baseline_summary(name: str, text: str, lang: str = "en") -> str:
    """The summary baseline `name` writes for `text` (in language `lang`: its sentence splitter)."""
    (name,) = check_baselines([name])
    return BASELINES[name](text, lang)
