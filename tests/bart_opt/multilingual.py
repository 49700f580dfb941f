"""A hand-made multilingual ROUGE corpus with hand-checked expected F-measures (0-100).

Each case names its language and the tokenizer it is meant for; ``expected`` was counted by hand
from the tokens written in ``why`` (unigram, bigram and LCS counts: F = 2 * overlap / (|pred| + |ref|)),
and ``default`` is what rouge-score's own tokenizer gives (0 wherever it keeps nothing). The table
in docs/evaluation.md#rouge-in-any-language is this corpus, measured by tests/bart_opt/pipeline/test_rouge_text.py.
"""

from __future__ import annotations

CORPUS = [
    {"id": "ru-verbatim", "lang": "ru", "tokenizer": "unicode",
     "prediction": "Кошка сидит на ковре.", "reference": "Кошка сидит на ковре.",
     "why": "4 of 4 tokens, 3 of 3 bigrams: identical",
     "expected": {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0, "rougeLsum": 100.0}},
    {"id": "ru-contains", "lang": "ru", "tokenizer": "unicode",
     "prediction": "Кошка сидит на ковре. Собака спит.", "reference": "Кошка сидит на ковре.",
     "why": "unigrams 4 common, 6 and 4: 8/10; bigrams 3 common, 5 and 3: 6/8; LCS 4",
     "expected": {"rouge1": 80.0, "rouge2": 75.0, "rougeL": 80.0, "rougeLsum": 80.0}},
    {"id": "ru-stemmed", "lang": "ru", "tokenizer": "unicode",
     "prediction": "Новостями дня", "reference": "Новости дня",
     "why": "Snowball: новостями and новости are both новост",
     "expected": {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0, "rougeLsum": 100.0}},
    {"id": "zh-characters", "lang": "zh", "tokenizer": "script",
     "prediction": "我爱上海", "reference": "我爱北京",
     "why": "characters 我 爱 common of 4 and 4: 4/8; bigram 我爱 of 3 and 3: 2/6; LCS 2",
     "expected": {"rouge1": 50.0, "rouge2": 100 / 3, "rougeL": 50.0, "rougeLsum": 50.0}},
    {"id": "zh-two-sentences", "lang": "zh", "tokenizer": "script",
     "prediction": "你爱上海。我爱北京。", "reference": "我爱北京。你爱上海。",
     "why": "8 characters each, all common; bigrams 6 of 7 and 7; LCS 4 of 8; split at 。 each sentence matches whole",
     "expected": {"rouge1": 100.0, "rouge2": 600 / 7, "rougeL": 50.0, "rougeLsum": 100.0}},
    {"id": "ja-characters", "lang": "ja", "tokenizer": "script",
     "prediction": "東京は雨です。", "reference": "東京は晴れです。",
     "why": "characters 東 京 は で す common, 6 and 7: 10/13; bigrams 東京 京は です, 5 and 6: 6/11; LCS 5",
     "expected": {"rouge1": 1000 / 13, "rouge2": 600 / 11, "rougeL": 1000 / 13, "rougeLsum": 1000 / 13}},
    {"id": "ar-words", "lang": "ar", "tokenizer": "unicode",
     "prediction": "ذهب الولد إلى السوق", "reference": "ذهب الولد إلى المدرسة",
     "why": "3 of 4 and 4 words: 6/8; bigrams 2 of 3 and 3: 4/6; LCS 3",
     "expected": {"rouge1": 75.0, "rouge2": 200 / 3, "rougeL": 75.0, "rougeLsum": 75.0}},
    {"id": "hi-words", "lang": "hi", "tokenizer": "unicode",
     "prediction": "राम बाजार गया", "reference": "राम घर गया",
     "why": "words with their vowel signs: राम गया common of 3 and 3: 4/6; no common bigram; LCS 2",
     "expected": {"rouge1": 200 / 3, "rouge2": 0.0, "rougeL": 200 / 3, "rougeLsum": 200 / 3}},
    {"id": "mixed-scripts", "lang": "mul", "tokenizer": "script",
     "prediction": "Apple发布了新的iPhone", "reference": "Apple发布了iPhone 15",
     "why": "apple 发 布 了 iphone common, 7 and 6: 10/13; bigrams apple发 发布 布了, 6 and 5: 6/11; LCS 5",
     "expected": {"rouge1": 1000 / 13, "rouge2": 600 / 11, "rougeL": 1000 / 13, "rougeLsum": 1000 / 13}},
]
