"""Small random BART checkpoints with a locally trained tokenizer.

Everything here runs offline: the tokenizer is a byte-level BPE trained on
random-word text, the weights are random. The summaries such a model writes are
meaningless; these folders exist so that the engine, the pipeline and the service
can be tested end to end (parity, batching, memory) on models of any shape.
"""

from __future__ import annotations

import random
from pathlib import Path

from bart_opt.demo.tokenizer import train_tokenizer

WORDS = (
    "the a of and to in is was for on that with as by at from his her their it "
    "police said officials president city government report year people state "
    "court family team game season minister company market water school health "
    "attack fire storm election vote study scientists researchers found new old "
    "first last two three million percent monday tuesday friday week month london "
    "washington paris football club player coach match win lost home away world "
    "country national local public private service hospital doctor patient child "
    "children woman man women men police officer arrested charged killed injured"
).split()


def random_sentence(rng: random.Random, min_words: int = 6, max_words: int = 18) -> str:
    """One sentence of random vocabulary words, capitalised and full-stopped."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))]
    return " ".join(words).capitalize() + "."


def random_article(rng: random.Random, sentences: int) -> str:
    """A pseudo news article of `sentences` random sentences."""
    return " ".join(random_sentence(rng) for _ in range(sentences))


def build_tokenizer(out_dir: str | Path, vocab_size: int = 512, seed: int = 0):
    """Train a byte-level BPE on random-word text and save it as a BartTokenizer in `out_dir`."""
    rng = random.Random(seed)
    return train_tokenizer([random_article(rng, 5) for _ in range(400)], out_dir, vocab_size=vocab_size)


def build_checkpoint(
    out_dir: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    d_model: int = 32,
    encoder_layers: int = 2,
    decoder_layers: int = 2,
    encoder_attention_heads: int = 4,
    decoder_attention_heads: int = 4,
    ffn_dim: int = 64,
    max_position_embeddings: int = 1024,
    with_tokenizer: bool = True,
    safe_serialization: bool = True,
    eos_bias: float = 0.0,
    **config_overrides,
) -> Path:
    """Write a random BART checkpoint folder (config, generation config, weights, tokenizer).

    Keyword arguments beyond the named ones go straight into `BartConfig`
    (e.g. `scale_embedding=True`, `activation_function="relu"`).
    Generation defaults follow facebook/bart-large-cnn's scaled-down settings.
    `eos_bias` raises the end-of-sequence logit so that random weights stop at varied lengths.
    """
    import torch
    from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if with_tokenizer:
        tokenizer = build_tokenizer(out, vocab_size=vocab_size, seed=seed)
        vocab_size = max(vocab_size, len(tokenizer))
    settings = dict(
        vocab_size=vocab_size,
        d_model=d_model,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        encoder_attention_heads=encoder_attention_heads,
        decoder_attention_heads=decoder_attention_heads,
        encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim,
        max_position_embeddings=max_position_embeddings,
    )
    config = BartConfig(**{**settings, **config_overrides})
    torch.manual_seed(seed)
    model = BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        # Random init leaves final_logits_bias at zero; give it values so the in-place add is exercised.
        model.final_logits_bias.normal_(0.0, 0.1)
        model.final_logits_bias[0, config.eos_token_id] += eos_bias
    model.generation_config = GenerationConfig(
        num_beams=4,
        length_penalty=2.0,
        max_length=40,
        min_length=8,
        no_repeat_ngram_size=3,
        early_stopping=True,
        forced_bos_token_id=0,
        forced_eos_token_id=2,
        decoder_start_token_id=2,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
    )
    model.save_pretrained(str(out), safe_serialization=safe_serialization)
    return out
