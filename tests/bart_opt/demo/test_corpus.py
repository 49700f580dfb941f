"""The generated news corpus: deterministic, held out by split, highlights compress the lead."""

from __future__ import annotations

import json
import re

import pytest

from bart_opt.demo.corpus import stories, write_sample_records
from bart_opt.pipeline.rouge import split_sentences


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def is_subsequence(part: list[str], whole: list[str]) -> bool:
    rest = iter(whole)
    return all(word in rest for word in part)


@pytest.fixture(scope="module")
def train_stories():
    return list(stories("train", 600))


def test_stories_are_deterministic_per_split_and_seed():
    first = list(stories("sample", 6))
    assert first == list(stories("sample", 6))
    assert [s.id for s in first] == [f"sample-0-{i:05d}" for i in range(6)]
    assert {s.article for s in first}.isdisjoint(s.article for s in stories("sample", 6, seed=1))
    assert len({s.article for s in first}) == 6


def test_sample_and_validation_stories_are_not_training_stories():
    seen = {s.article for s in stories("train", 2400)}
    assert seen.isdisjoint(s.article for s in stories("sample", 24))
    assert seen.isdisjoint(s.article for s in stories("validation", 48))


def test_highlights_are_the_three_lead_sentences_compressed(train_stories):
    for story in train_stories:
        highlights = story.highlights.splitlines()
        lead = split_sentences(story.article)[:3]
        assert len(highlights) == 3, story
        for highlight, sentence in zip(highlights, lead):
            # Same order, same words, details dropped: a compression of that very sentence.
            assert is_subsequence(words(highlight), words(sentence)), (highlight, sentence)
            assert highlight[0].isupper() and highlight.endswith("."), highlight


def test_articles_are_filled_fluent_text_of_varied_length(train_stories):
    lengths = [len(s.article.split()) for s in train_stories]
    assert min(lengths) < 80 and max(lengths) > 180
    assert len({s.topic for s in train_stories}) == 10
    for story in train_stories:
        assert not re.search(r"[{}\[\]]|  | ,|\.\.", story.article + story.highlights), story
        assert all(sentence[0].isupper() or sentence[0] in "\"0123456789" for sentence in split_sentences(story.article))


def test_write_sample_records_writes_cnn_shaped_jsonl(tmp_path):
    path = write_sample_records(tmp_path / "sub" / "sample.jsonl", n=5, seed=2)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows == [s.record() for s in stories("sample", 5, seed=2)]
    assert all(set(row) == {"id", "article", "highlights"} for row in rows)


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="unknown split 'test'"):
        next(stories("test", 1))
