"""The summarization pipeline on top of the engine: texts in, summaries and ROUGE out (`summarizer`,
`batching`, `tokens`, `results`), the records it reads (`data`, `readers`) and the scores it gives
(`rouge`, `rouge_text`, `baselines`). Importing this package loads nothing."""
