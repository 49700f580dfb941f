"""Tiny random BERT checkpoints for the model-based metrics' tests, made offline in a test's folder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

WORDS = ("the a an of on in to and was is are not never it he she they big small red blue old new cat dog "
         "man woman city river house car team game rain sun won lost sat ran went said found police fire "
         "mayor year today yesterday two three million . , ! ?").split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def bert_folder(folder: Path, *, labels: dict[int, str] | None = None, layers: int = 3, seed: int = 0,
                init_std: float = 0.02, words: Sequence[str] = WORDS, max_length: int = 64) -> Path:
    """Write a random BERT (`labels`: a sequence classifier with that id2label) and its WordPiece
    tokenizer (lower-cased, `words`, `max_length` tokens at most) into `folder`; returns `folder`.

    init_std: the weights' initial spread (larger: outputs that vary more from input to input).
    """
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab-source.txt"
    vocab.write_text("\n".join([*SPECIALS, *words]) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(str(vocab), model_max_length=max_length)
    vocab.unlink()
    config = BertConfig(vocab_size=len(SPECIALS) + len(words), hidden_size=32, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=max_length,
                        initializer_range=init_std)
    torch.manual_seed(seed)
    if labels is None:
        model = BertModel(config)
    else:
        config.id2label = dict(labels)
        config.label2id = {name: i for i, name in labels.items()}
        model = BertForSequenceClassification(config)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder
