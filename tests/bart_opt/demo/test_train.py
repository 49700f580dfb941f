"""The demo training recipe, run at a toy size: deterministic, and our engine loads what it writes."""

from __future__ import annotations

import json

import torch

from bart_opt import Bart
from bart_opt.demo.train import Recipe, learning_rate, train

TOY = Recipe(steps=3, batch_size=4, warmup_steps=1, vocab_size=400, tokenizer_stories=60, d_model=16, layers=1,
             heads=2, ffn_dim=32, max_positions=256, validation_stories=2)


def test_toy_training_is_deterministic_and_loads_in_our_engine(tmp_path):
    threads = torch.get_num_threads()
    first = train(TOY, tmp_path / "a")
    second = train(TOY, tmp_path / "b")
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert first["final_loss"] == second["final_loss"] and first["validation"] == second["validation"]
    assert json.loads((tmp_path / "a" / "training.json").read_text())["recipe"] == json.loads(
        json.dumps(first["recipe"]))
    model = Bart.from_pretrained(tmp_path / "a")
    assert model.config.d_model == 16 and model.config.max_position_embeddings == 256
    # The recipe's thread count and deterministic mode do not leak into the caller.
    assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    recipe = Recipe(steps=100, warmup_steps=10, learning_rate=1e-3)
    rates = [learning_rate(step, recipe) for step in range(100)]
    assert rates[0] == 1e-4 and rates[9] == 1e-3
    assert all(a >= b for a, b in zip(rates[9:], rates[10:]))
    assert abs(learning_rate(100, recipe) - 1e-4) < 1e-12
