"""Checkpoint loading: safetensors and .bin, key quirks, hub ids through the cache, clear errors."""

from __future__ import annotations

import json
import mmap
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from bart_opt import Bart
import bart_opt.engine.loading as loading
from bart_opt.engine.loading import CheckpointError, normalize_keys, release_pages, resolve_checkpoint
from bart_opt.engine.memory import rss_bytes
from tests.bart_opt.reference import batch


def test_bin_and_safetensors_give_the_same_model(make_checkpoint):
    st = make_checkpoint(init_std=0.2, seed=7)
    pt = make_checkpoint(init_std=0.2, seed=7, safe_serialization=False)
    ids, mask = batch(st, (2, 3))
    torch.testing.assert_close(Bart.from_pretrained(pt)(ids, mask), Bart.from_pretrained(st)(ids, mask))


def test_tied_and_prefixed_keys_are_normalized():
    t = torch.zeros(1)
    keys = normalize_keys({"model.shared.weight": t, "lm_head.weight": t, "model.encoder.embed_tokens.weight": t,
                           "model.decoder.embed_tokens.weight": t, "final_logits_bias": t})
    assert sorted(keys) == ["final_logits_bias", "shared.weight"]


def test_missing_final_logits_bias_means_zeros(demo_checkpoint, tmp_path):
    dst = tmp_path / "nobias"
    shutil.copytree(demo_checkpoint, dst)
    state = load_file(str(dst / "model.safetensors"))
    del state["final_logits_bias"]
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    assert Bart.from_pretrained(str(dst)).final_logits_bias.abs().sum() == 0


def test_weights_that_do_not_fit_the_config_are_refused(demo_checkpoint, tmp_path):
    dst = tmp_path / "deeper"
    shutil.copytree(demo_checkpoint, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["decoder_layers"] = 3
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="missing .*decoder.layers.2"):
        Bart.from_pretrained(str(dst))


def test_folder_without_weights_is_refused(demo_checkpoint, tmp_path):
    dst = tmp_path / "noweights"
    shutil.copytree(demo_checkpoint, dst)
    (dst / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights"):
        Bart.from_pretrained(str(dst))


def test_hub_id_resolves_through_the_hub_cache(demo_checkpoint, tmp_path, monkeypatch):
    """A hub id is looked up in huggingface_hub's cache; offline and uncached it is a clear error."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="^nobody/no-such-bart: no such checkpoint folder here, and no such model on the hub"):
        resolve_checkpoint("nobody/no-such-bart")
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, tuple(allow_patterns)))
        return demo_checkpoint

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    model = Bart.from_pretrained("facebook/bart-large-cnn")
    assert calls and calls[0][0] == "facebook/bart-large-cnn" and "*.safetensors" in calls[0][1]
    assert model.config.d_model == 32


def test_device_and_dtype_names(demo_checkpoint):
    model = Bart.from_pretrained(demo_checkpoint, device="cpu", dtype="bf16")
    assert model.dtype == torch.bfloat16 and model.device.type == "cpu"
    with pytest.raises(ValueError, match="dtype 'int8' is not supported"):
        Bart.from_pretrained(demo_checkpoint, dtype="int8")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_generate_matches_cpu(demo_checkpoint):
    ids, mask = batch(demo_checkpoint, (2, 4))
    cpu = Bart.from_pretrained(demo_checkpoint).generate(ids, mask)
    gpu = Bart.from_pretrained(demo_checkpoint, device="cuda").generate(ids.cuda(), mask.cuda())
    assert torch.equal(gpu.cpu(), cpu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("safe", [True, False])
def test_only_the_tensors_fusion_copied_are_released(make_checkpoint, monkeypatch, dtype, safe):
    released = []
    monkeypatch.setattr(loading, "release_pages", released.extend)
    model = Bart.from_pretrained(make_checkpoint(init_std=0.2, seed=7, safe_serialization=safe), dtype=dtype)
    cfg = model.config
    assert len(released) == 2 * (3 * cfg.encoder_layers + 3 * cfg.decoder_layers + 2 * cfg.decoder_layers)
    live = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    assert not {t.untyped_storage().data_ptr() for t in released} & live
    fused = [m.fused_weight for m in model.modules() if hasattr(m, "fused_weight")]
    for t in released:  # each one is a weight or bias that now lives on as a block of a fused tensor
        assert t.dtype == dtype
        if t.dim() == 2:
            assert any(torch.equal(t, f[i : i + t.shape[0]]) for f in fused for i in range(0, f.shape[0], t.shape[0]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the RSS from /proc")
def test_released_pages_of_a_mapped_checkpoint_leave_the_resident_set(tmp_path):
    path = tmp_path / "big.safetensors"
    save_file({"a": torch.ones(16 * 2**20), "b": torch.full((3,), 2.0)}, str(path))  # 64 MiB, then 12 bytes
    tensors = load_file(str(path))
    assert float(tensors["a"].sum()) == 16 * 2**20  # every page read: resident
    before = rss_bytes()
    release_pages([tensors["a"]])
    assert before - rss_bytes() > 60 * 2**20
    assert float(tensors["a"][:: mmap.PAGESIZE // 4].sum()) == 16 * 2**20 // (mmap.PAGESIZE // 4)  # a file page
    assert tensors["b"].tolist() == [2.0, 2.0, 2.0], "the neighbour's page is kept"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux semantics: a released anonymous page reads as zeros")
@pytest.mark.parametrize("view", ["whole", "expanded"])
def test_release_never_touches_memory_outside_the_storage(view):
    import numpy as np

    page_floats = mmap.PAGESIZE // 4
    arena = np.ones(64 * page_floats, dtype=np.float32)  # anonymous memory, neighbours on both sides
    inner = torch.from_numpy(arena[100 : 60 * page_floats + 7])  # a storage whose ends are not page-aligned
    tensor = inner if view == "whole" else inner[5:6].expand(10 * len(arena))  # spans far past its storage
    release_pages([tensor])
    start = inner.data_ptr() // 4 - arena.ctypes.data // 4  # == 100
    first = -(-inner.data_ptr() // mmap.PAGESIZE) * mmap.PAGESIZE // 4 - arena.ctypes.data // 4
    assert arena[:start].min() == 1 and arena[60 * page_floats + 7 :].min() == 1, "outside the storage: kept"
    assert arena[first : first + 50 * page_floats].max() == 0, "whole pages inside it: released"
