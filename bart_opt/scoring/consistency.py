"""Factual consistency with the source, SummaC-ZS style (Laban et al., 2022): sentence-level NLI.

The source and the summary are split into sentences (`bart_opt.pipeline.rouge_text.split_sentences`,
the splitter ROUGE-Lsum uses). An NLI classifier (any ``AutoModelForSequenceClassification``
checkpoint whose config names an ``entailment`` and a ``contradiction`` label) reads every
(source sentence, summary sentence) pair, premise first, giving P(entailment) and
P(contradiction). For each summary sentence j,

    s_j = max_i P(entailment | source_i, summary_j) - max_i P(contradiction | source_i, summary_j)

and the example's ``summac_zs`` is the mean of s_j over the summary's sentences, in [-1, 1]. This is
the reference implementation's default SummaC-ZS reduction (tingofurro/summac, `SummaCZS` with
``op1="max"``, ``op2="mean"``, ``use_ent`` and ``use_con``): the two maxima are taken separately,
so the entailing and the contradicting source sentence need not be the same one. Its sentence
granularity is the one the paper found best for zero-shot scoring.

Bounds: at most `MAX_SOURCE_SENTENCES` source sentences (the first; SummaC's ``max_doc_sents``)
and `MAX_SUMMARY_SENTENCES` summary sentences (the first) are paired, so an example costs at
most 2,000 pairs; each pair is truncated to the tokenizer's ``model_max_length`` (longest part
first), and pairs run `batch_size` at a time. A summary or a source without a sentence scores 0,
as in the reference implementation. Unlike it, short sentences (10 characters or fewer) are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import version
from itertools import islice
from typing import Any

import numpy as np
import torch

from bart_opt.errors import InvalidRequest
from bart_opt.engine.memory import measure
from bart_opt.pipeline.rouge_text import split_sentences, splitter_name
from bart_opt.scoring.base import Example
from bart_opt.scoring.models import ScoringCheckpoint, call_cost, input_limit, load_checked, open_checkpoint

FIELD = "consistency_model"
MAX_SOURCE_SENTENCES = 100
MAX_SUMMARY_SENTENCES = 20
LABELS = ("entailment", "contradiction")


class ConsistencyMetric:
    """SummaC-ZS consistency of each prediction with its source (``{"summac_zs"}`` in [-1, 1]).

    model: a checkpoint folder or hub id of an NLI classifier, e.g. ``roberta-large-mnli`` (the
      reference implementation's ``mnli``) in the hub cache.
    batch_size: sentence pairs the model reads at a time.
    device: where the model runs.

    Raises `InvalidRequest` for a checkpoint that cannot be used or has no entailment and
    contradiction labels (field ``consistency_model``), or a batch size below 1.
    """

    name = "consistency"
    needs_model = True

    def __init__(self, model: str, *, batch_size: int = 16, device: str = "cpu") -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if batch_size < 1:
            raise InvalidRequest("consistency_batch_size", f"must be at least 1, got {batch_size}")
        self.checkpoint = open_checkpoint(model, FIELD)
        self.tokenizer, self.model = load_checked(self.checkpoint, lambda folder: (
            AutoTokenizer.from_pretrained(str(folder)),
            AutoModelForSequenceClassification.from_pretrained(str(folder))))
        self.labels = nli_labels(self.checkpoint, self.model.config.id2label)  # (entailment id, contradiction id)
        self.max_length = input_limit(self.checkpoint, self.tokenizer)
        self.batch_size, self.device = batch_size, device
        self.model.to(device).eval()
        self.cost: dict[str, Any] = {}

    def signature(self) -> dict[str, Any]:
        """The model (as named, its fingerprint, the label ids used), the reduction, the bounds and versions."""
        entailment, contradiction = self.labels
        return {
            "model": self.checkpoint.name, "fingerprint": str(self.checkpoint.fingerprint),
            "labels": {"entailment": entailment, "contradiction": contradiction},
            "score": "summac-zs:sentence|max-e-minus-max-c|mean", "split": splitter_name("en"),
            "max_source_sentences": MAX_SOURCE_SENTENCES, "max_summary_sentences": MAX_SUMMARY_SENTENCES,
            "max_length": self.max_length, "transformers": version("transformers"), "torch": torch.__version__,
        }

    def score(self, examples: Sequence[Example]) -> list[dict[str, float]]:
        """``{"summac_zs"}`` per example, in order; every example needs its source.

        Sets `cost`: ``{"batches", "seconds", "peak_bytes", "peak_source"}`` of this call.
        """
        sources, summaries = [], []
        for i, example in enumerate(examples):
            if example.source is None:
                raise InvalidRequest(f"examples[{i}].source", "consistency is scored against the source text, "
                                     "and this example has none")
            sources.append(split_sentences(example.source)[:MAX_SOURCE_SENTENCES])
            summaries.append(split_sentences(example.prediction)[:MAX_SUMMARY_SENTENCES])
        images = [np.zeros((len(s), len(h), 2)) for s, h in zip(sources, summaries)]  # each (S, H, e/c)
        pairs = ((k, i, j) for k, image in enumerate(images)
                 for i in range(image.shape[0]) for j in range(image.shape[1]))
        batches = 0
        with measure(self.device) as log:
            while batch := list(islice(pairs, self.batch_size)):
                probabilities = self.pair_probabilities([sources[k][i] for k, i, _ in batch],
                                                        [summaries[k][j] for k, _, j in batch])  # (B, 2)
                for (k, i, j), row in zip(batch, probabilities):
                    images[k][i, j] = row
                batches += 1
        self.cost = call_cost(log, batches)
        return [{"summac_zs": summac_zs(image)} for image in images]

    def pair_probabilities(self, premises: list[str], hypotheses: list[str]) -> np.ndarray:
        """P(entailment) and P(contradiction) of each (premise, hypothesis) pair: shape (B, 2), float64."""
        inputs = self.tokenizer(premises, hypotheses, padding=True, truncation=True, max_length=self.max_length,
                                return_tensors="pt").to(self.device)  # each (B, T)
        with torch.inference_mode():
            logits = self.model(**inputs).logits.float()  # (B, labels)
        probabilities = torch.softmax(logits, dim=-1)[:, list(self.labels)]  # (B, 2)
        return probabilities.cpu().double().numpy()


def summac_zs(image: np.ndarray) -> float:
    """The mean over summary sentences of max P(e) - max P(c) over source sentences; 0 for no pair.

    image: (S, H, 2), the probabilities of source sentence i and summary sentence j (entailment, contradiction).
    """
    if image.size == 0:
        return 0.0
    per_sentence = image[:, :, 0].max(axis=0) - image[:, :, 1].max(axis=0)  # (H,)
    return float(per_sentence.mean())


def nli_labels(checkpoint: ScoringCheckpoint, id2label: dict[int, str]) -> tuple[int, int]:
    """The ids of the ``entailment`` and ``contradiction`` labels (names compared case-insensitively).

    Raises `InvalidRequest` naming the checkpoint's field when config.json's id2label lacks either.
    """
    ids = {str(name).lower(): int(i) for i, name in id2label.items()}
    missing = [label for label in LABELS if label not in ids]
    if missing:
        raise checkpoint.refuse(f"config.json's id2label {dict(id2label)} has no {' and no '.join(missing)} label; "
                                "the consistency score needs an NLI classifier that names them")
    return ids["entailment"], ids["contradiction"]


__all__ = ["ConsistencyMetric", "LABELS", "MAX_SOURCE_SENTENCES", "MAX_SUMMARY_SENTENCES", "nli_labels", "summac_zs"]
