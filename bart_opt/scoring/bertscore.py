"""BERTScore (Zhang et al., 2020) through the `bert-score` library, its model opened offline-safe.

The numbers are the library's own: the model and tokenizer are loaded by ``bert_score.utils``
(`get_model` keeps the first `layer` layers, `get_tokenizer` reads the tokenizer the library
would) and every batch is scored by ``bert_score.utils.bert_cos_score_idf``, the function
``bert_score.score`` calls. What bart-opt adds around it:

* the checkpoint is a folder or a hub id opened by `bart_opt.scoring.models` (found in the hub
  cache with ``HF_HUB_OFFLINE=1``, fingerprinted, refused when incomplete, naming
  ``bertscore_model``) rather than whatever ``AutoModel`` finds;
* the layer defaults to bert-score's tuned layer for a hub id it knows (``roberta-large``: 17,
  its English default) and to the model's last layer for any other id or a local folder
  (bert-score has no default there: pass `layer` to match a known model copied into a folder);
* examples are scored `batch_size` at a time, so memory is bounded however many a call holds
  (``bert_score.score`` holds every embedding of its whole input at once);
* scores are on bart-opt's 0-100 scale, as ROUGE's are: 100 x the library's raw precision,
  recall and F1, never rescaled with a baseline.

idf weights, when on, come from the references of one `score` call, as ``bert_score.score``
computes them from its `refs`: to weight by a whole corpus, score the corpus in one call.
With several references, each of precision, recall and F1 is its best over the references,
as ``bert_score.score`` takes it (so the three may come from different references).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from bart_opt.errors import InvalidRequest
from bart_opt.engine.memory import measure
from bart_opt.scoring.base import Example
from bart_opt.scoring.models import call_cost, input_limit, load_checked, open_checkpoint

FIELD = "bertscore_model"
SCALE = 100.0  # bart-opt's 0-100, as ROUGE


class BertScoreMetric:
    """BERTScore precision, recall and F1 of each prediction against its reference(s), 0-100.

    model: a checkpoint folder or hub id of an encoder bert-score supports (BERT, RoBERTa,
      DeBERTa, ...), e.g. ``roberta-large`` in the hub cache.
    layer: the hidden layer whose embeddings are compared (see the module docstring for the default).
    idf: weight tokens by inverse document frequency over the references of a `score` call.
    batch_size: examples scored at a time, and sentences the model encodes at a time.
    device: where the model runs (``cpu``, ``cuda``, ``cuda:1``).

    Raises `InvalidRequest` for a checkpoint that cannot be used (field ``bertscore_model``),
    a layer the model does not have (``bertscore_layer``) or a batch size below 1.
    """

    name = "bertscore"
    needs_model = True

    def __init__(self, model: str, *, layer: int | None = None, idf: bool = False, batch_size: int = 32,
                 device: str = "cpu") -> None:
        from bert_score.utils import get_model, get_tokenizer, model2layers
        from transformers import AutoConfig

        if batch_size < 1:
            raise InvalidRequest("bertscore_batch_size", f"must be at least 1, got {batch_size}")
        self.checkpoint = open_checkpoint(model, FIELD)
        config = load_checked(self.checkpoint, lambda folder: AutoConfig.from_pretrained(str(folder)))
        # bert-score picks a model class by the name it is given: T5's encoder for any name holding "t5",
        # a SciBERT download for a name starting "scibert". An absolute path never starts so; a path
        # holding "t5" would load another model's weights into T5's classes, silently.
        path = str(self.checkpoint.folder.resolve())
        if "t5" in path and "t5" not in config.model_type:
            raise self.checkpoint.refuse(f"bert-score would read this {config.model_type} model as T5, because its "
                                         "folder's path holds 't5'; move or link it to a path without 't5'")
        layers = config.num_hidden_layers
        if layer is None:
            layer = model2layers.get(self.checkpoint.name, layers)
        if not 0 <= layer <= layers:
            raise InvalidRequest("bertscore_layer", f"{self.checkpoint.name} has layers 0 to {layers}, not {layer}")
        self.layer, self.idf, self.batch_size, self.device = layer, bool(idf), batch_size, device
        self.tokenizer, self.model = load_checked(
            self.checkpoint, lambda folder: (get_tokenizer(path), get_model(path, layer)))
        input_limit(self.checkpoint, self.tokenizer)  # bert-score truncates to it
        self.model.to(device)
        self.cost: dict[str, Any] = {}

    def signature(self) -> dict[str, Any]:
        """The model (as named, and its fingerprint), layer, idf, scale, versions, and bert-score's own hash."""
        from bert_score.utils import get_hash

        return {
            "model": self.checkpoint.name, "fingerprint": str(self.checkpoint.fingerprint), "layer": self.layer,
            "idf": self.idf, "rescale_with_baseline": False, "scale": "0-100", "references": "best of each score",
            "bert_score": version("bert-score"), "transformers": version("transformers"),
            "hash": get_hash(self.checkpoint.name, self.layer, self.idf, False, use_custom_baseline=False,
                             use_fast_tokenizer=False),
        }

    def score(self, examples: Sequence[Example]) -> list[dict[str, float]]:
        """``{"precision", "recall", "f1"}`` (0-100) per example, in order.

        Sets `cost`: ``{"batches", "seconds", "peak_bytes", "peak_source"}`` of this call, the
        peak being device memory on CUDA and the tensors made during the call on CPU.
        """
        from bert_score.utils import bert_cos_score_idf

        groups = [_references(example, i) for i, example in enumerate(examples)]
        weights = self._idf_weights([ref for group in groups for ref in group])
        scores: list[dict[str, float]] = []
        with measure(self.device) as log:
            for start in range(0, len(examples), self.batch_size):
                batch = range(start, min(start + self.batch_size, len(examples)))
                hyps = [examples[i].prediction for i in batch for _ in groups[i]]
                refs = [ref for i in batch for ref in groups[i]]
                with log.phase("bertscore"):
                    pairs = bert_cos_score_idf(self.model, refs, hyps, self.tokenizer, weights,
                                               batch_size=self.batch_size, device=self.device).cpu()  # (pairs, 3)
                offset = 0
                for i in batch:
                    best = pairs[offset:offset + len(groups[i])].max(dim=0).values  # (3,): P, R, F1
                    offset += len(groups[i])
                    precision, recall, f1 = (SCALE * float(value) for value in best)
                    scores.append({"precision": precision, "recall": recall, "f1": f1})
        self.cost = call_cost(log, -(-len(examples) // self.batch_size))
        return scores

    def _idf_weights(self, references: list[str]) -> dict[int, float]:
        """Token id -> weight: bert-score's idf over `references`, or 1 for every token but the
        [CLS] and [SEP] framing (0), as ``bert_score.score`` weighs without idf."""
        from bert_score.utils import get_idf_dict

        if self.idf:
            return get_idf_dict(references, self.tokenizer, nthreads=0)  # no process pool inside a service
        weights: dict[int, float] = defaultdict(lambda: 1.0)
        weights[self.tokenizer.sep_token_id] = 0.0
        weights[self.tokenizer.cls_token_id] = 0.0
        return weights


def _references(example: Example, index: int) -> tuple[str, ...]:
    """The example's references as a tuple (one or more); `InvalidRequest` for none."""
    references = (example.reference,) if isinstance(example.reference, str) else tuple(example.reference)
    if not references:
        raise InvalidRequest(f"examples[{index}].reference", "has no reference to score against")
    return references


__all__ = ["BertScoreMetric"]
