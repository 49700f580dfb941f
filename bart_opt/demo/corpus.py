"""Generated news stories with CNN/DailyMail-style highlights, for the demo model.

Every story is an article (a three-sentence lead from one of `bart_opt.demo.topics`' story
templates, then background and quotes) and its highlights: the three lead sentences without
their details, one per line as in CNN/DailyMail. Highlights are therefore made of the
article's own words, and a model that learns to compress the lead learns to summarize.

Stories are deterministic: story ``i`` of split ``s`` with seed ``k`` comes from its own
``random.Random(f"{s}/{k}/{i}")`` (string seeds are hashed with SHA-512, so the stream does
not depend on the process or the Python hash seed). Splits draw from disjoint streams: the
``sample`` split that ``bart-opt demo-model`` writes is never seen in training.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bart_opt.demo.topics import (
    CITIES, DAYS, DISTRICTS, FEMALE_NAMES, GENERIC_BODY, LAST_NAMES, MALE_NAMES, STREETS, TOPICS, Topic, thousands,
)  # fmt: skip

SPLITS = ("train", "validation", "sample")
DETAIL_PROBABILITY = 0.8  # how often a ``[detail]`` of a lead sentence appears in the article
MIN_BODY, MAX_BODY = 2, 12  # body sentences after the lead

_DETAIL = re.compile(r"\[([^\[\]]*)\]")
_SLOT = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Story:
    """One generated article and its highlights (one per line)."""

    id: str
    topic: str
    article: str
    highlights: str

    def record(self) -> dict[str, str]:
        """The CNN/DailyMail-shaped record: ``id``, ``article``, ``highlights``."""
        return {"id": self.id, "article": self.article, "highlights": self.highlights}


def _person(rng: random.Random, suffix: str = "") -> dict[str, str]:
    """Slots of one person: full name, surname and the pronouns that go with them."""
    male = rng.random() < 0.5
    first = rng.choice(MALE_NAMES if male else FEMALE_NAMES)
    last = rng.choice(LAST_NAMES)
    words = ("man", "he", "his", "him", "himself") if male else ("woman", "she", "her", "her", "herself")
    slots = dict(zip(("man", "he", "his", "him", "himself"), words))
    slots.update(Name=f"{first} {last}", Last=last)
    return {key + suffix: value for key, value in slots.items()}


def _cast(rng: random.Random, topic: Topic) -> dict[str, str]:
    """Every slot value of one article: people, place, days, numbers and the topic's own."""
    city, country, currency, paper = rng.choice(CITIES)
    day, day2 = rng.sample(DAYS, 2)
    slots = {
        "city": city, "country": country, "currency": currency, "paper": paper, "day": day, "day2": day2,
        "district": rng.choice(DISTRICTS), "street": rng.choice(STREETS), "Last3": rng.choice(LAST_NAMES),
        "age3": str(rng.randint(18, 70)), "population": thousands(rng, 90000, 2500000, 1000),
        **_person(rng), **_person(rng, "2"),
    }  # fmt: skip
    slots.update(topic.slots(rng))
    slots["role2"] = rng.choice(topic.roles)
    return slots


def _fill(text: str, slots: dict[str, str]) -> str:
    """Replace ``{slot}``s, also inside slot values (``"{city} United"``)."""
    for _ in range(3):
        text = _SLOT.sub(lambda m: slots[m.group(1)], text)
    return text


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


class _Writer:
    """Renders templates in article order, naming each person in full at first mention."""

    def __init__(self, slots: dict[str, str]):
        self.slots = slots
        self.named: set[str] = set()

    def introduce(self, template: str) -> str:
        """Turn the first ``{Last}`` of a person not yet named into ``{Name}``."""
        for suffix in ("", "2"):
            name, last = "{Name" + suffix + "}", "{Last" + suffix + "}"
            if name in template:
                self.named.add(suffix)
            elif last in template and suffix not in self.named:
                template = template.replace(last, name, 1)
                self.named.add(suffix)
        return template

    def sentence(self, template: str, rng: random.Random | None) -> str:
        """The template filled; each detail kept with `DETAIL_PROBABILITY` (never when `rng` is None)."""
        def keep(match: re.Match) -> str:
            return match.group(1) if rng is not None and rng.random() < DETAIL_PROBABILITY else ""

        return _capitalize(_fill(_DETAIL.sub(keep, template), self.slots))


def make_story(rng: random.Random, story_id: str) -> Story:
    """One story drawn from `rng`: a topic, a lead story, a cast and a shuffled body."""
    topic = rng.choice(TOPICS)
    lead = rng.choice(topic.leads)
    writer = _Writer(_cast(rng, topic))
    lead = [writer.introduce(template) for template in lead]
    pool = list(topic.body + GENERIC_BODY)
    body = [writer.introduce(template) for template in rng.sample(pool, rng.randint(MIN_BODY, MAX_BODY))]
    article = " ".join(writer.sentence(template, rng) for template in lead + body)
    highlights = "\n".join(writer.sentence(template, None) for template in lead)
    return Story(id=story_id, topic=topic.name, article=article, highlights=highlights)


def stories(split: str, n: int, seed: int = 0) -> Iterator[Story]:
    """Stories ``0..n-1`` of `split` (one of `SPLITS`) for `seed`, ids ``"{split}-{seed}-{i:05d}"``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    for i in range(n):
        yield make_story(random.Random(f"{split}/{seed}/{i}"), f"{split}-{seed}-{i:05d}")


def write_sample_records(path: str | Path, n: int = 24, seed: int = 0) -> Path:
    """Write `n` held-out stories of the ``sample`` split as CNN/DailyMail-like JSONL records.

    Each line is ``{"id", "article", "highlights"}`` with highlights one per line. The demo
    model never saw these stories in training.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for story in stories("sample", n, seed):
            f.write(json.dumps(story.record(), ensure_ascii=False) + "\n")
    return out
