"""No hidden syncs in the static search's decoder step, shown on the `meta` device: tensors there have
shapes but no data, so every read of the device from the host raises (`x[mask]`, which needs a
`nonzero`; `.item()`, `bool()`, `.tolist()`), and the dispatch counter (`bart_opt.bench.dispatch`,
active during the step) sees what does not raise there (a Python list as an index, `torch.tensor` of
Python values, a CPU tensor in an op with device tensors). A mutant that adds any of them to the step
fails here."""

from __future__ import annotations

import pytest
import torch
from transformers import BartConfig

import bart_opt.engine.cache as cache_module
from bart_opt import Bart
from bart_opt.bench.dispatch import HIDDEN_SYNCS, DispatchCounter
from bart_opt.engine.buffers import FreshBuffers
from bart_opt.engine.static_generation import BeamSearch, GreedySearch

CONFIG = dict(vocab_size=300, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
              decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=160)


def meta_model(el_attention: bool = False, dtype=torch.float32) -> Bart:
    with torch.device("meta"):
        model = Bart(BartConfig(**CONFIG))
    model = model.to(dtype)
    model.static, model.el_attention = True, el_attention
    return model


def meta_step(model: Bart, beams: int, inputs: int = 3, source: int = 20, steps: int = 3) -> DispatchCounter:
    """`steps` static decoder steps on `meta` at the CNN settings' processors (n-gram ban, min length, forced
    tokens), under the dispatch counter; the counter."""
    spec = model.generation_spec({"num_beams": beams, "max_length": 40, "min_length": 10, "no_repeat_ngram_size": 3})
    memory = torch.empty(inputs, source, model.config.d_model, dtype=model.dtype, device="meta")
    mask = torch.ones(inputs, source, dtype=torch.long, device="meta")
    with torch.inference_mode():
        cross = model.cross_attention(memory, mask, beams=beams)
        search = (GreedySearch if beams == 1 else BeamSearch)(model, inputs, inputs, source, cross, spec, FreshBuffers())
        with DispatchCounter() as counter:
            for cur_len in range(1, steps + 1):
                search.at(cur_len)
                search.step()
    return counter


@pytest.mark.parametrize("el_attention", [False, True], ids=["standard", "el"])
@pytest.mark.parametrize("beams", [1, 4])
def test_the_static_step_runs_on_the_meta_device_with_no_sync(beams, el_attention):
    counter = meta_step(meta_model(el_attention), beams)
    assert counter.syncs == {}, counter.syncs
    assert counter.total("prepare") > 100, "the steps ran"


def test_the_static_step_runs_on_meta_in_half_precision():
    assert meta_step(meta_model(dtype=torch.float16), beams=4).syncs == {}


def _mutant(monkeypatch, edit) -> None:
    """`StaticKVCache.begin_step` (every static step runs it) followed by `edit(cache)`."""
    begin = cache_module.StaticKVCache.begin_step

    def mutated(self):
        begin(self)
        edit(self)

    monkeypatch.setattr(cache_module.StaticKVCache, "begin_step", mutated)


def test_a_mask_index_in_the_step_fails_on_meta(monkeypatch):
    _mutant(monkeypatch, lambda cache: cache._bias[cache._bias == 0])  # x[mask]: a nonzero
    with pytest.raises(NotImplementedError, match="nonzero"):
        meta_step(meta_model(), beams=4)


@pytest.mark.parametrize("edit, sync", [
    (lambda cache: cache.position[[0]], "list_index"),
    (lambda cache: cache.position + torch.tensor([1], device=cache.position.device), "python_values"),
    (lambda cache: cache.kv[0].index_select(0, torch.zeros(1, dtype=torch.long)), "host_tensor"),
])
def test_a_host_copy_in_the_step_is_counted_on_meta(monkeypatch, edit, sync):
    _mutant(monkeypatch, edit)
    counter = meta_step(meta_model(), beams=4, steps=2)
    assert counter.syncs == {f"prepare: {sync}": 2} and sync in HIDDEN_SYNCS


@pytest.mark.parametrize("edit", [lambda cache: int(cache.position), lambda cache: cache.position.tolist(),
                                  lambda cache: bool((cache.position > 0).any())])
def test_a_read_of_the_device_in_the_step_fails_on_meta(monkeypatch, edit):
    _mutant(monkeypatch, edit)
    with pytest.raises((RuntimeError, NotImplementedError)):
        meta_step(meta_model(), beams=1)
