"""Helpers shared by the engine tests: transformers' model as the reference, and test batches."""

from __future__ import annotations

import functools
import random

import torch
from transformers import AutoTokenizer, BartForConditionalGeneration

from bart_opt.demo import random_article


@functools.lru_cache(maxsize=None)
def reference_model(path: str, dtype: torch.dtype = torch.float32) -> BartForConditionalGeneration:
    """transformers' BART loaded from the same folder (cached per folder and dtype)."""
    return BartForConditionalGeneration.from_pretrained(path, dtype=dtype).eval()


@functools.lru_cache(maxsize=None)
def tokenizer(path: str):
    return AutoTokenizer.from_pretrained(path)


def batch(path: str, sizes: tuple[int, ...], seed: int = 0):
    """Tokenized articles of `sizes` sentences each, padded to the longest: (input_ids, attention_mask)."""
    rng = random.Random(seed)
    texts = [random_article(rng, n) for n in sizes]
    enc = tokenizer(path)(texts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]
