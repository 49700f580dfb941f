"""Offline demo models and data.

* A trained demo checkpoint shipped with the package (`write_demo_model`): a tiny BART that
  really summarizes the generated news stories of `bart_opt.demo.corpus` (it was trained on
  them by ``python -m bart_opt.demo.train``). It knows nothing beyond that world of stories.
* Random checkpoints of any shape (`build_checkpoint`), with meaningless summaries, for tests
  of the engine, the pipeline and the service.
* CNN/DailyMail-like records (`write_sample_records`): held-out stories the demo model never saw.
"""

from bart_opt.demo.corpus import write_sample_records
from bart_opt.demo.random_checkpoint import build_checkpoint, build_tokenizer, random_article, random_sentence
from bart_opt.demo.trained import write_demo_model

__all__ = ["build_checkpoint", "build_tokenizer", "random_article", "random_sentence", "write_demo_model",
           "write_sample_records"]
