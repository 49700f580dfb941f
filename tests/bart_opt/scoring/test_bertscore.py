"""BERTScoreMetric against the bert-score library on a tiny random BERT made here, and its refusals."""

from __future__ import annotations

import shutil

import bert_score
import pytest

from bart_opt.errors import InvalidRequest
from bart_opt.engine.fingerprint import fingerprint
from bart_opt.scoring.base import Example, aggregate
from bart_opt.scoring.bertscore import BertScoreMetric
from tests.bart_opt.scoring.tiny import bert_folder

LAYERS = 3
EXAMPLES = [
    Example("the cat sat on the mat.", "a cat sat on the red mat."),
    Example("police found a car in the river.", ("the police found two cars.", "a car was found in a river.")),
    Example("the team won the game today.", "the team lost the game yesterday, she said."),
    Example("rain and sun in the city.", ("it was rain in the old city.", "the sun is big.", "a new house.")),
    Example("he ran to the house.", "the man went to a blue house."),
]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> str:
    return str(bert_folder(tmp_path_factory.mktemp("bertscore") / "tiny-bert", layers=LAYERS, init_std=0.2))


def library(folder: str, layer: int, idf: bool, examples=EXAMPLES, batch_size: int = 64):
    """bert_score.score's P, R, F1 on the examples (references as lists), each a list of floats on 0-100."""
    refs = [[e.reference] if isinstance(e.reference, str) else list(e.reference) for e in examples]
    p, r, f = bert_score.score([e.prediction for e in examples], refs, model_type=folder, num_layers=layer,
                               idf=idf, batch_size=batch_size, device="cpu")
    return [[100.0 * float(v) for v in values] for values in (p, r, f)]


@pytest.mark.parametrize("idf", [False, True])
@pytest.mark.parametrize("layer", [2, LAYERS])
def test_scores_equal_the_librarys(encoder, layer, idf):
    """The same model, layer and idf: the library's own precision, recall and F1, digit for digit
    (the same batches run through the same library function), several references included."""
    metric = BertScoreMetric(encoder, layer=layer, idf=idf)
    ours = metric.score(EXAMPLES)
    p, r, f = library(encoder, layer, idf)
    assert [s["precision"] for s in ours] == p
    assert [s["recall"] for s in ours] == r
    assert [s["f1"] for s in ours] == f
    assert len({round(v, 3) for v in f}) == len(EXAMPLES)  # the examples do score differently
    assert metric.cost["batches"] == 1 and metric.cost["peak_bytes"] > 0


def test_small_batches_bound_memory_and_keep_the_scores(encoder):
    """Two examples at a time (three batches): the library's scores of the whole set, to float rounding
    (padding to another length changes the sums' rounding in the last bits, not more)."""
    metric = BertScoreMetric(encoder, layer=2, batch_size=2)
    ours = metric.score(EXAMPLES)
    _, _, f = library(encoder, 2, False)
    assert metric.cost["batches"] == 3
    assert [s["f1"] for s in ours] == pytest.approx(f, abs=1e-4)  # 1e-6 on the library's 0-1 scale


def test_idf_weights_change_the_scores(encoder):
    plain = BertScoreMetric(encoder, layer=2).score(EXAMPLES)
    weighted = BertScoreMetric(encoder, layer=2, idf=True).score(EXAMPLES)
    assert all(abs(a["f1"] - b["f1"]) > 1e-3 for a, b in zip(plain, weighted))


def test_signature_and_defaults(encoder):
    """A local folder's default layer is its last; the signature names model, fingerprint, layer, idf,
    no rescaling, the versions and bert-score's own hash."""
    metric = BertScoreMetric(encoder)
    signature = metric.signature()
    assert metric.name == "bertscore" and metric.needs_model
    assert signature["layer"] == LAYERS and signature["idf"] is False and signature["rescale_with_baseline"] is False
    assert signature["model"] == encoder
    assert signature["fingerprint"] == str(fingerprint(encoder, "model.safetensors", cache=None))
    assert signature["bert_score"] and signature["transformers"]
    assert signature["hash"].startswith(f"{encoder}_L{LAYERS}_no-idf_version=")
    assert BertScoreMetric(encoder, layer=1, idf=True).signature()["hash"].startswith(f"{encoder}_L1_idf_")
    scores = metric.score(EXAMPLES)
    corpus = aggregate(scores)
    assert set(corpus) == {"precision", "recall", "f1"}
    assert corpus["f1"]["low"] <= corpus["f1"]["mid"] <= corpus["f1"]["high"] <= 100


def test_incomplete_or_unknown_checkpoints_are_refused(encoder, tmp_path, monkeypatch):
    no_tokenizer = shutil.copytree(encoder, tmp_path / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink()
    with pytest.raises(InvalidRequest, match="tokenizer files are missing") as refused:
        BertScoreMetric(str(no_tokenizer))
    assert refused.value.field == "bertscore_model"
    no_weights = shutil.copytree(encoder, tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(InvalidRequest, match="no weights") as refused:
        BertScoreMetric(str(no_weights))
    assert refused.value.field == "bertscore_model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InvalidRequest, match="^bertscore_model: nobody/no-such-bert: no such checkpoint"):
        BertScoreMetric("nobody/no-such-bert")
    with pytest.raises(InvalidRequest, match="has layers 0 to 3, not 4") as refused:
        BertScoreMetric(encoder, layer=LAYERS + 1)
    assert refused.value.field == "bertscore_layer"


def test_examples_need_a_reference(encoder):
    with pytest.raises(InvalidRequest, match="no reference") as refused:
        BertScoreMetric(encoder, layer=1).score([EXAMPLES[0], Example("a cat.", ())])
    assert refused.value.field == "examples[1].reference"


def test_a_path_bert_score_would_misread_is_refused(encoder, tmp_path):
    """bert-score loads any name holding "t5" with T5's classes: a BERT there is refused, not misread."""
    misleading = shutil.copytree(encoder, tmp_path / "bert-for-t5-comparison")
    with pytest.raises(InvalidRequest, match="would read this bert model as T5") as refused:
        BertScoreMetric(str(misleading))
    assert refused.value.field == "bertscore_model"
