"""The bench's peer engines: CTranslate2's length limits and id layout against transformers'."""

from __future__ import annotations

import pytest
import torch

from bart_opt.engine.spec import GenerationSpec
from bart_opt.bench.engines import (
    EngineSpec,
    TorchEngine,
    checkpoint_settings,
    ct2_ids,
    ct2_length_limits,
    ct2_options,
    load_engine,
    pad_batch,
    trim_row,
)

CNN = {"num_beams": 4, "length_penalty": 2.0, "min_length": 56, "max_length": 142, "no_repeat_ngram_size": 3,
       "early_stopping": True}


def settings(**overrides) -> GenerationSpec:
    values = dict(num_beams=4, max_length=142, min_length=56, length_penalty=2.0, no_repeat_ngram_size=3,
                  early_stopping=True, forced_bos_token_id=0, forced_eos_token_id=(2,), decoder_start_token_id=2,
                  eos_token_id=(2,), pad_token_id=1)
    return GenerationSpec(**{**values, **overrides})


def test_length_limits_map_transformers_counts_to_ctranslate2s():
    assert ct2_length_limits(56, 142, forced_eos=True) == {"min_decoding_length": 55, "max_decoding_length": 140}
    assert ct2_length_limits(56, 142, forced_eos=False) == {"min_decoding_length": 55, "max_decoding_length": 141}
    assert ct2_length_limits(0, 20, forced_eos=True)["min_decoding_length"] == 0


def test_options_carry_the_cnn_settings():
    options = ct2_options(settings())
    assert options == {"beam_size": 4, "length_penalty": 2.0, "no_repeat_ngram_size": 3, "return_end_token": True,
                       "max_input_length": 0, "min_decoding_length": 55, "max_decoding_length": 140,
                       "end_token": ["id2"]}


def test_ct2_hypotheses_are_laid_out_like_transformers_rows():
    s = settings()
    assert ct2_ids(["id0", "id7", "id2"], s) == [2, 0, 7, 2]  # ended by itself
    assert ct2_ids(["id0", "id7", "id9"], s) == [2, 0, 7, 9, 2]  # stopped at the limit: forced EOS appended
    assert ct2_ids(["id0", "id7", "id9"], settings(forced_eos_token_id=None)) == [2, 0, 7, 9]


def test_trim_row_keeps_the_first_end_token_and_drops_padding():
    s = settings()
    assert trim_row([2, 0, 5, 2, 1, 1], s) == [2, 0, 5, 2]
    assert trim_row([2, 0, 1, 5, 2, 1], s) == [2, 0, 1, 5, 2]  # a generated pad id inside stays
    assert trim_row([2, 0, 5, 6], s) == [2, 0, 5, 6]


def test_pad_batch_right_pads_to_the_longest():
    ids, mask = pad_batch([[0, 5, 2], [0, 2]], pad_id=1)
    assert ids.tolist() == [[0, 5, 2], [0, 2, 1]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def _docs(vocab: int, lengths=(40, 33, 25)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    docs = []
    for n in lengths:
        ids = torch.randint(4, vocab, (n,), generator=gen)
        ids[0], ids[-1] = 0, 2
        docs.append(ids.tolist())
    return docs


def _outputs(spec: EngineSpec, folder: str, kwargs: dict, ct2_folder: str | None = None) -> list[list[int]]:
    engine = load_engine(spec, folder, kwargs, threads=1, ct2_folder=ct2_folder)
    engine.prepare(_docs(64))
    return engine.generate()


@pytest.fixture(scope="module")
def converted(make_checkpoint, tmp_path_factory):
    """Tiny checkpoints whose outputs stop at min_length (EOS favoured) or run to max_length (EOS
    never chosen), each with its CTranslate2 conversion."""
    pytest.importorskip("ctranslate2", reason="CTranslate2 is the peers extra: pip install -e '.[peers]'")
    from bart_opt.bench.engines import convert_to_ct2

    out = {}
    for name, bias in (("stops_early", 50.0), ("runs_long", -50.0)):
        folder = make_checkpoint(vocab_size=64, d_model=16, ffn_dim=32, with_tokenizer=False, eos_bias=bias)
        out[name] = (folder, convert_to_ct2(folder, str(tmp_path_factory.mktemp("ct2") / name)))
    return out


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize(("model", "min_length", "max_length"),
                         [("stops_early", 10, 30), ("stops_early", 5, 30), ("runs_long", 0, 20), ("runs_long", 5, 33)])
def test_mapped_limits_give_transformers_output_lengths(converted, model, min_length, max_length, beams):
    folder, ct2_folder = converted[model]
    kwargs = {**CNN, "num_beams": beams, "min_length": min_length, "max_length": max_length}
    ref = _outputs(EngineSpec("transformers", "float32"), folder, kwargs)
    peer = _outputs(EngineSpec("ctranslate2", "float32"), folder, kwargs, ct2_folder)
    expected = min_length + 1 if model == "stops_early" else max_length
    assert [len(seq) for seq in ref] == [expected] * 3
    assert [len(seq) for seq in peer] == [len(seq) for seq in ref]
    assert all(seq[:2] == [2, 0] and seq[-1] == 2 for seq in peer)  # start, forced BOS ... EOS
    if beams == 1:  # greedy search leaves no room for bookkeeping differences: same tokens
        assert peer == ref


def test_unmapped_limits_would_overshoot(converted):
    # Why the mapping exists: transformers' limits passed as they are let CTranslate2 run longer.
    import ctranslate2

    folder, ct2_folder = converted["runs_long"]
    s = checkpoint_settings(folder, {**CNN, "num_beams": 1, "min_length": 0, "max_length": 20})
    translator = ctranslate2.Translator(ct2_folder, intra_threads=1)
    source = [[f"id{t}" for t in doc] for doc in _docs(64)]
    naive = translator.translate_batch(source, target_prefix=[["id0"]] * 3, beam_size=1, max_decoding_length=20,
                                       return_end_token=True)
    assert [len(ct2_ids(r.hypotheses[0], s)) for r in naive] == [22] * 3  # transformers: 20


def test_torch_engine_matches_transformers_generate(make_checkpoint):
    folder = make_checkpoint(vocab_size=64, d_model=16, ffn_dim=32, with_tokenizer=False)
    kwargs = {**CNN, "min_length": 5, "max_length": 20}
    engine = TorchEngine(EngineSpec("bart_opt", "float32"), folder, kwargs)
    engine.prepare(_docs(64))
    assert engine.generate() == _outputs(EngineSpec("transformers", "float32"), folder, kwargs)
    assert engine.settings.forced_bos_token_id == 0 and engine.settings.max_length == 20
