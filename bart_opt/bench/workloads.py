"""The shapes and generation settings the benchmarks share, and their random checkpoints."""

from __future__ import annotations

SIZES = {
    # Runs the whole benchmark in well under a minute on two CPU cores.
    "tiny": {"d_model": 128, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
             "decoder_attention_heads": 4, "ffn_dim": 512, "vocab_size": 1000, "max_position_embeddings": 256},
    # facebook/bart-base
    "base": {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 12,
             "decoder_attention_heads": 12, "ffn_dim": 3072, "vocab_size": 50265, "max_position_embeddings": 1024},
    # facebook/bart-large-cnn
    "large": {"d_model": 1024, "encoder_layers": 12, "decoder_layers": 12, "encoder_attention_heads": 16,
              "decoder_attention_heads": 16, "ffn_dim": 4096, "vocab_size": 50264, "max_position_embeddings": 1024},
}
DEFAULT_MAX_LEN = {"tiny": 128, "base": 1024, "large": 1024}
STEP_SETTINGS = {"num_beams": 4, "max_new_tokens": 9, "min_length": 0, "length_penalty": 1.0,
                 "no_repeat_ngram_size": 0, "early_stopping": True}
CNN_SETTINGS = {"num_beams": 4, "length_penalty": 2.0, "min_length": 56, "max_length": 142,
                "no_repeat_ngram_size": 3, "early_stopping": True}


def build_random_checkpoint(out_dir: str, size: str, seed: int, eos_bias: float) -> str:
    """Write random weights of the named shape with transformers' own BartConfig and save_pretrained."""
    from bart_opt.demo import build_checkpoint

    return str(build_checkpoint(out_dir, seed=seed, with_tokenizer=False, eos_bias=eos_bias, **SIZES[size]))
