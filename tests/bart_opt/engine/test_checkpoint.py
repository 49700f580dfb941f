"""A checkpoint must be whole to serve: tokenizer files, a tokenizer that fits the embedding, agreeing special tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from bart_opt.demo.random_checkpoint import build_tokenizer
from bart_opt.errors import CheckpointError, InvalidRequest
from bart_opt.pipeline.summarizer import Summarizer


def copy_of(checkpoint: str, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(checkpoint, tmp_path / name))


@pytest.mark.parametrize("removed", [("tokenizer.json", "tokenizer_config.json"), ("tokenizer.json",)])
def test_a_folder_without_its_tokenizer_files_is_refused_naming_them(demo_checkpoint, tmp_path, removed):
    folder = copy_of(demo_checkpoint, tmp_path)
    for name in removed:
        (folder / name).unlink()
    with pytest.raises(CheckpointError) as caught:
        Summarizer.from_pretrained(str(folder), device="cpu")
    problem = caught.value.problem
    assert "tokenizer.json" in problem and "vocab.json" in problem and "merges.txt" in problem
    assert str(tmp_path) not in problem  # the words a service may show hold no server path
    assert str(folder) in str(caught.value)  # the command line's message says which folder


def test_vocab_and_merges_without_tokenizer_json_are_a_whole_tokenizer(demo_checkpoint, tmp_path):
    folder = copy_of(demo_checkpoint, tmp_path)
    bpe = json.loads((folder / "tokenizer.json").read_text())["model"]
    (folder / "vocab.json").write_text(json.dumps(bpe["vocab"]))
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in bpe["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (folder / "tokenizer.json").unlink()
    reference = Summarizer.from_pretrained(demo_checkpoint, device="cpu")
    slow = Summarizer.from_pretrained(str(folder), device="cpu")
    texts = ["The council voted on Monday.", "Police said the fire was out."]
    assert [e.ids for e in slow.encode(texts)] == [e.ids for e in reference.encode(texts)]
    (folder / "merges.txt").unlink()
    with pytest.raises(CheckpointError, match=r"no tokenizer.json, and no merges.txt"):
        Summarizer.from_pretrained(str(folder), device="cpu")


def test_a_tokenizer_that_maps_text_past_the_embedding_is_refused(make_checkpoint, tmp_path):
    folder = copy_of(make_checkpoint(vocab_size=300), tmp_path)
    rows = json.loads((folder / "config.json").read_text())["vocab_size"]
    bigger = build_tokenizer(folder, vocab_size=rows + 100)  # overwrites the checkpoint's tokenizer files
    assert len(bigger) > rows
    with pytest.raises(CheckpointError, match=rf"ids up to {len(bigger) - 1} .* {rows} embedding rows"):
        Summarizer.from_pretrained(str(folder), device="cpu")


def test_fewer_tokens_than_embedding_rows_is_fine(make_checkpoint, tmp_path):
    """Rows past the tokenizer (fairseq pads its embeddings) are never looked up for an input."""
    folder = copy_of(make_checkpoint(vocab_size=340, with_tokenizer=False), tmp_path, "padded")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(make_checkpoint(vocab_size=300), name), folder / name)
    summarizer = Summarizer.from_pretrained(str(folder), device="cpu")
    assert len(summarizer.tokenizer) == 300 and summarizer.model.config.vocab_size == 340
    result = summarizer.summarize(["The council met on Monday."], num_beams=1, max_length=12, min_length=2)
    assert result.items[0]["error"] is None


def with_extra_special_token(checkpoint: str, tmp_path: Path) -> Path:
    """facebook/bart-large-cnn's layout: one special token (there `<mask>`) one past the last embedding row."""
    folder = copy_of(checkpoint, tmp_path, "extra")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    tokenizer.save_pretrained(str(folder))
    return folder


def test_a_special_token_past_the_rows_loads_but_a_text_spelling_it_is_refused_by_name(make_checkpoint, tmp_path):
    folder = with_extra_special_token(make_checkpoint(vocab_size=300), tmp_path)
    summarizer = Summarizer.from_pretrained(str(folder), device="cpu")
    rows = summarizer.model.config.vocab_size
    assert len(summarizer.tokenizer) == rows + 1 and summarizer.tokenizer.convert_tokens_to_ids("<extra>") == rows
    fine = summarizer.summarize(["The council met on Monday."], num_beams=1, max_length=12, min_length=2)
    assert fine.items[0]["error"] is None
    with pytest.raises(InvalidRequest) as caught:
        summarizer.summarize(["The council met.", "A text with <extra> in it."], num_beams=1, max_length=12, min_length=2)
    assert caught.value.field == "texts[1]"
    assert "'<extra>'" in caught.value.message and f"id {rows}" in caught.value.message


def edited(checkpoint: str, tmp_path: Path, file: str, **changes) -> Path:
    folder = copy_of(checkpoint, tmp_path, "edited")
    data = json.loads((folder / file).read_text())
    data.update(changes)
    (folder / file).write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize(("file", "changes", "words"), [
    ("config.json", {"pad_token_id": 3}, "pad token '<pad>' is id 1, but config.json says pad_token_id 3"),
    ("config.json", {"bos_token_id": 2}, "bos token '<s>' is id 0, but config.json says bos_token_id 2"),
    ("generation_config.json", {"eos_token_id": 4}, "end token '</s>' (id 2) is not the generation config's eos_token_id 4"),
    ("generation_config.json", {"forced_bos_token_id": 40}, "forced_bos_token_id 40 is not a special token"),
    ("generation_config.json", {"decoder_start_token_id": 77}, "decoder_start_token_id 77 is not a special token"),
])  # fmt: skip
def test_special_tokens_that_disagree_with_the_config_are_refused(demo_checkpoint, tmp_path, file, changes, words):
    folder = edited(demo_checkpoint, tmp_path, file, **changes)
    with pytest.raises(CheckpointError) as caught:
        Summarizer.from_pretrained(str(folder), device="cpu")
    assert words in caught.value.problem


def test_a_tokenizer_of_special_tokens_only_is_refused(demo_checkpoint, tmp_path):
    """What AutoTokenizer builds from a folder without vocabulary: five special tokens, here at BART's ids."""
    folder = copy_of(demo_checkpoint, tmp_path)
    data = json.loads((folder / "tokenizer.json").read_text())
    specials = {token["content"]: token["id"] for token in data["added_tokens"]}
    data["model"]["vocab"] = specials
    data["model"]["merges"] = []
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="only its 5 special tokens and no vocabulary"):
        Summarizer.from_pretrained(str(folder), device="cpu")


def test_the_demo_model_and_random_checkpoints_pass(demo_checkpoint, make_checkpoint):
    from bart_opt.demo.trained import packaged_model_dir

    for folder in (demo_checkpoint, make_checkpoint(vocab_size=300), str(packaged_model_dir())):
        summarizer = Summarizer.from_pretrained(folder, device="cpu")
        assert summarizer.fingerprint is not None and str(summarizer.fingerprint).startswith("sha256:")
